"""CoNLL-2000 chunking: read `word POS chunk-tag` files, build vocabularies, batch without padding.

Token features (documented choices, no pretrained embeddings):
    word   lowercased, every digit mapped to "0"; words seen fewer than `min_freq` times in
           training map to <unk> (so the model learns an <unk> embedding)
    pos    the POS tag column as given
    caps   capitalization class of the original word (`CAPS_CLASSES`)
    chars  characters of the original word, for an optional character CNN

`encode` makes a `TaggingBatch` (sparseattn.models): it holds the tokens of several sentences
concatenated (L tokens in all) and the sentence lengths: no token padding. Only `chars` is
padded, along the character axis of a word.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import torch

from ...models import CAPS_CLASSES, IGNORE, TaggingBatch
from ..vocab import Vocab

PAD, UNK = "<pad>", "<unk>"
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
    sentences: List[Sentence] = []
    rows: List[List[str]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.object[e.start]:#x} at offset {e.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
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


def split_dev(
    sentences: Sequence[Sentence], fraction: float = 0.1, seed: int = 0
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


@dataclass
class TaggingVocab:
    """The vocabularies of all token fields, built from the training sentences only. Input fields
    map unknown symbols to <unk>; the tags have no specials (an unknown tag is a KeyError)."""

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
        return cls(_inputs(words), _inputs(pos), _inputs(chars), Vocab(tags))

    def state_dict(self) -> Dict[str, List[str]]:
        return {"words": self.words.itos, "pos": self.pos.itos, "chars": self.chars.itos, "tags": self.tags.itos}

    @classmethod
    def from_state_dict(cls, state: Dict[str, List[str]]) -> "TaggingVocab":
        return cls(_inputs(state["words"]), _inputs(state["pos"]), _inputs(state["chars"]), Vocab(state["tags"]))


def _inputs(symbols: Sequence[str]) -> Vocab:
    """An input field's vocabulary: <pad> (0), <unk> (1, what unknown symbols map to), symbols."""
    return Vocab(symbols, specials=(PAD, UNK), unk=UNK)


def encode(sentences: Sequence[Sentence], vocab: TaggingVocab, with_tags: bool = True) -> TaggingBatch:
    """One batch holding `sentences` in order."""
    if not sentences:
        raise ValueError("encode() needs at least one sentence")
    if any(len(s) == 0 for s in sentences):
        raise ValueError("sentences must be non-empty")
    tokens = [w for s in sentences for w in s.words]
    words = torch.tensor([vocab.words[normalize_word(w)] for w in tokens])
    pos = torch.tensor([vocab.pos[p] for s in sentences for p in s.pos])
    caps = torch.tensor([caps_class(w) for w in tokens])
    chars = torch.zeros(len(tokens), max(len(w) for w in tokens), dtype=torch.long)
    for i, w in enumerate(tokens):
        chars[i, : len(w)] = torch.tensor([vocab.chars[c] for c in w])
    tags = None
    if with_tags:  # a tag never seen in training gets IGNORE (cross_entropy's ignore_index)
        tags = torch.tensor([vocab.tags.stoi.get(t, IGNORE) for s in sentences for t in s.tags])
    lengths = torch.tensor([len(s) for s in sentences])
    return TaggingBatch(words, pos, caps, chars, tags, lengths)
