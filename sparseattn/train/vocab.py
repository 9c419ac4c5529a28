"""`Vocab`: symbol <-> id for word-level vocabularies (letters, CoNLL words, POS and chunk tags)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence


class Vocab:
    """Ids 0 .. len(specials) - 1 are the special symbols, in order, then `symbols` (duplicates of a
    special dropped). `unk` names the special that unknown symbols map to; with unk=None looking up
    an unknown symbol is a KeyError."""

    def __init__(self, symbols: Sequence[str], specials: Sequence[str] = (), unk: Optional[str] = None) -> None:
        if unk is not None and unk not in specials:
            raise ValueError(f"unk={unk!r} must be one of the specials {tuple(specials)}")
        self.itos: List[str] = list(specials) + [s for s in symbols if s not in specials]
        self.stoi: Dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.unk: Optional[int] = None if unk is None else self.stoi[unk]

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, symbol: str) -> int:
        if symbol in self.stoi:
            return self.stoi[symbol]
        if self.unk is None:
            raise KeyError(f"symbol {symbol!r} is not in the vocabulary (and it has no unknown-symbol id)")
        return self.unk

    def encode(self, symbols: Sequence[str]) -> List[int]:
        return [self[s] for s in symbols]

    def decode(self, ids: Sequence[int]) -> List[str]:
        return [self.itos[i] for i in ids]
