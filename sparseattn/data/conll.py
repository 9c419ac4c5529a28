"""CoNLL-2000 chunking: read `word POS chunk-tag` files, build vocabularies, batch without padding.

Token features (documented choices, no pretrained embeddings):
    word   lowercased, every digit mapped to "0"; words seen fewer than `min_freq` times in
           training map to <unk> (so the model learns an <unk> embedding)
    pos    the POS tag column as given
    caps   capitalization class of the original word (`CAPS_CLASSES`)
    chars  characters of the original word, for an optional character CNN

A `TaggingBatch` holds the tokens of several sentences concatenated (L tokens in all) and the
sentence lengths: no token padding. Only `chars` is padded, along the character axis of a word.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

PAD, UNK = "<pad>", "<unk>"
IGNORE = -100  # target id of a gold tag absent from the training vocabulary
CAPS_CLASSES = ("lower", "title", "upper", "mixed", "nocase")  # nocase: no letters (punctuation, digits)
_DIGITS = re.compile(r"\d")


@dataclass(frozen=True)
class Sentence:
    words: Tuple[str, ...]
    pos: Tuple[str, ...]
    tags: Tuple[str, ...]

    def __len__(self) -> int:
        return len(self.words)


def read_conll(path: Union[str, Path]) -> List[Sentence]:
    """Sentences of a CoNLL-2000 file: one `word POS tag` line per token, blank line between sentences."""
    sentences, rows = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                if rows:
                    sentences.append(Sentence(*map(tuple, zip(*rows))))
                    rows = []
                continue
            cols = line.split()
            if len(cols) != 3:
                raise ValueError(f"{path}:{lineno}: expected 3 columns 'word POS tag', got {len(cols)}: {line!r}")
            rows.append(cols)
    if rows:
        sentences.append(Sentence(*map(tuple, zip(*rows))))
    return sentences


def split_dev(sentences: Sequence[Sentence], fraction: float = 0.1, seed: int = 0
              ) -> Tuple[List[Sentence], List[Sentence]]:
    """(train, dev): a seeded random `fraction` of the sentences becomes dev; order is kept in both."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n_dev = int(round(len(sentences) * fraction))
    dev_ids = set(random.Random(seed).sample(range(len(sentences)), n_dev))
    train = [s for i, s in enumerate(sentences) if i not in dev_ids]
    dev = [s for i, s in enumerate(sentences) if i in dev_ids]
    return train, dev


def normalize_word(word: str) -> str:
    return _DIGITS.sub("0", word.lower())


def caps_class(word: str) -> int:
    letters = [c for c in word if c.isalpha()]
    if not letters:
        return CAPS_CLASSES.index("nocase")
    if all(c.islower() for c in letters):
        return CAPS_CLASSES.index("lower")
    if all(c.isupper() for c in letters):
        return CAPS_CLASSES.index("upper")
    if letters[0].isupper() and all(c.islower() for c in letters[1:]):
        return CAPS_CLASSES.index("title")
    return CAPS_CLASSES.index("mixed")


class Vocab:
    """Symbol <-> id for one field. Input fields (`unk=True`): id 0 is <pad>, id 1 <unk>, and
    unknown symbols map to 1. Output fields (`unk=False`, the tags): no specials, unknown is an error."""

    def __init__(self, symbols: Sequence[str], unk: bool = True) -> None:
        specials = [PAD, UNK] if unk else []
        self.itos: List[str] = specials + [s for s in symbols if s not in specials]
        self.stoi: Dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.unk = unk

    def __len__(self) -> int:
        return len(self.itos)

    def __call__(self, symbol: str) -> int:
        if self.unk:
            return self.stoi.get(symbol, 1)
        if symbol not in self.stoi:
            raise KeyError(f"symbol {symbol!r} is not in the vocabulary (and it has no <unk>)")
        return self.stoi[symbol]


@dataclass
class TaggingVocab:
    """The vocabularies of all token fields, built from the training sentences only."""

    words: Vocab
    pos: Vocab
    chars: Vocab
    tags: Vocab

    @classmethod
    def build(cls, sentences: Sequence[Sentence], min_freq: int = 2) -> "TaggingVocab":
        counts = Counter(normalize_word(w) for s in sentences for w in s.words)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        pos = sorted({p for s in sentences for p in s.pos})
        chars = sorted({c for s in sentences for w in s.words for c in w})
        tags = sorted({t for s in sentences for t in s.tags}, key=lambda t: (t != "O", t[2:], t))
        return cls(Vocab(words), Vocab(pos), Vocab(chars), Vocab(tags, unk=False))

    def state_dict(self) -> Dict[str, List[str]]:
        return {"words": self.words.itos, "pos": self.pos.itos, "chars": self.chars.itos, "tags": self.tags.itos}

    @classmethod
    def from_state_dict(cls, state: Dict[str, List[str]]) -> "TaggingVocab":
        return cls(Vocab(state["words"]), Vocab(state["pos"]), Vocab(state["chars"]), Vocab(state["tags"], unk=False))


@dataclass
class TaggingBatch:
    """Several sentences' tokens concatenated, L tokens in all, B sentences; no token padding.

    words, pos, caps: (L,) int64.  chars: (L, C) int64, 0-padded along each word's characters.
    tags: (L,) int64 gold tag ids (IGNORE for tags unseen in training), or None.
    lengths: (B,) int64 sentence lengths (sum = L).
    """

    words: Tensor
    pos: Tensor
    caps: Tensor
    chars: Tensor
    tags: Optional[Tensor]
    lengths: Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.words.shape[0])

    def to(self, device: Union[str, torch.device]) -> "TaggingBatch":
        move = (lambda t: None if t is None else t.to(device))
        return TaggingBatch(move(self.words), move(self.pos), move(self.caps), move(self.chars),
                            move(self.tags), move(self.lengths))

    def split(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Split a (L, ...) per-token tensor into per-sentence pieces."""
        return torch.split(x, self.lengths.tolist())


def encode(sentences: Sequence[Sentence], vocab: TaggingVocab, with_tags: bool = True) -> TaggingBatch:
    """One batch holding `sentences` in order."""
    if not sentences:
        raise ValueError("encode() needs at least one sentence")
    if any(len(s) == 0 for s in sentences):
        raise ValueError("sentences must be non-empty")
    tokens = [w for s in sentences for w in s.words]
    words = torch.tensor([vocab.words(normalize_word(w)) for w in tokens])
    pos = torch.tensor([vocab.pos(p) for s in sentences for p in s.pos])
    caps = torch.tensor([caps_class(w) for w in tokens])
    chars = torch.zeros(len(tokens), max(len(w) for w in tokens), dtype=torch.long)
    for i, w in enumerate(tokens):
        chars[i, :len(w)] = torch.tensor([vocab.chars(c) for c in w])
    tags = None
    if with_tags:  # a tag never seen in training gets IGNORE (cross_entropy's ignore_index)
        tags = torch.tensor([vocab.tags.stoi.get(t, IGNORE) for s in sentences for t in s.tags])
    lengths = torch.tensor([len(s) for s in sentences])
    return TaggingBatch(words, pos, caps, chars, tags, lengths)
