"""What both sequence taggers share: their input (`TaggingBatch`), token-feature embeddings, and
the `Tagger` base: its constructor arguments, the classifier head and the loss/predict interface.

A tagger is an `nn.Module` whose `forward(batch)` maps a `TaggingBatch` (L tokens of B
sentences, concatenated, no padding) to per-token logits (L, num_tags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

CAPS_CLASSES = ("lower", "title", "upper", "mixed", "nocase")  # nocase: no letters (punctuation, digits)
IGNORE = -100  # target id of a gold tag the model does not know (cross_entropy's ignore_index)


@dataclass
class TaggingBatch:
    """Several sentences' tokens concatenated, L tokens in all, B sentences; no token padding.

    words, pos, caps: (L,) int64 ids (caps: an index into CAPS_CLASSES).
    chars: (L, C) int64, 0-padded along each word's characters.
    tags: (L,) int64 gold tag ids (IGNORE where unknown), or None.
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
        """L: the number of tokens in the batch."""
        return int(self.words.shape[0])

    def to(self, device: Union[str, torch.device]) -> "TaggingBatch":
        """A copy with every tensor on `device`."""

        def move(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t.to(device)

        return TaggingBatch(
            self.words.to(device),
            self.pos.to(device),
            self.caps.to(device),
            self.chars.to(device),
            move(self.tags),
            self.lengths.to(device),
        )

    def split(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Split a (L, ...) per-token tensor into per-sentence pieces."""
        return torch.split(x, self.lengths.tolist())


class CharCNN(nn.Module):
    """Character embeddings -> conv of width 3 -> max over the word's characters.

    Shapes: chars (L, C) int64 with 0 = padding -> (L, out_dim).
    """

    def __init__(self, num_chars: int, char_dim: int = 30, out_dim: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_chars, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, out_dim, kernel_size=3, padding=1)
        self.out_dim = out_dim

    def forward(self, chars: Tensor) -> Tensor:
        """chars: (L, C) int64, 0-padded -> (L, out_dim), max over each word's characters."""
        h = self.conv(self.embed(chars).transpose(1, 2))  # (L, C, char_dim) -> (L, out_dim, C)
        h = h.masked_fill((chars == 0)[:, None, :], float("-inf"))
        return h.max(dim=2).values  # (L, out_dim); every word has >= 1 character


class TokenFeatures(nn.Module):
    """Concatenated embeddings of the word (lowercased), POS tag, capitalization class and,
    optionally, a character CNN. No pretrained vectors.

    Shapes: batch with L tokens -> (L, out_dim).
    """

    def __init__(
        self,
        num_words: int,
        num_pos: int,
        num_chars: int,
        *,
        word_dim: int = 100,
        pos_dim: int = 25,
        caps_dim: int = 5,
        char_dim: int = 30,
        char_out: int = 50,
        use_chars: bool = True,
        dropout: float = 0.3,
        word_dropout: float = 0.05,
    ) -> None:
        super().__init__()
        self.words = nn.Embedding(num_words, word_dim, padding_idx=0)
        self.pos = nn.Embedding(num_pos, pos_dim, padding_idx=0) if pos_dim else None
        self.caps = nn.Embedding(len(CAPS_CLASSES), caps_dim) if caps_dim else None
        self.chars = CharCNN(num_chars, char_dim, char_out) if use_chars else None
        self.out_dim = word_dim + pos_dim + caps_dim + (char_out if use_chars else 0)
        self.dropout = nn.Dropout(dropout)
        self.word_dropout = word_dropout  # training: replace a word by <unk> (id 1) with this probability

    def forward(self, batch: TaggingBatch) -> Tensor:
        """A batch of L tokens -> (L, out_dim) features (word dropout and dropout in training mode)."""
        words = batch.words
        if self.training and self.word_dropout > 0:
            words = words.masked_fill(torch.rand(words.shape, device=words.device) < self.word_dropout, 1)
        parts = [self.words(words)]
        if self.pos is not None:
            parts.append(self.pos(batch.pos))
        if self.caps is not None:
            parts.append(self.caps(batch.caps))
        if self.chars is not None:
            parts.append(self.chars(batch.chars))
        return self.dropout(torch.cat(parts, dim=-1))  # (L, out_dim)


class Tagger(nn.Module):
    """Base of the sequence taggers: `TokenFeatures` of each token -> the subclass's encoder
    (`encode`) -> a linear `classifier` per token.

    A subclass calls `Tagger.__init__` first, which makes the token features, then makes its
    encoder and last the classifier: parameters are created in that order, so that seeded
    initialisation is the same for every subclass and checkpoint.

    Args:
        num_words, num_pos, num_chars, num_tags: vocabulary sizes (`TaggingVocab`).
        features: keyword arguments of `TokenFeatures`.

    Shapes: batch of L tokens -> features (L, features.out_dim) -> encoded (L, H) -> logits (L, num_tags).
    """

    num_tags: int
    features: TokenFeatures
    classifier: nn.Linear

    def __init__(
        self, num_words: int, num_pos: int, num_chars: int, num_tags: int, features: Optional[Dict[str, Any]] = None
    ) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.features = TokenFeatures(num_words, num_pos, num_chars, **(features or {}))

    def encode(self, features: Tensor, batch: TaggingBatch) -> Tensor:
        """Token features (L, features.out_dim) of `batch` -> the classifier's input (L, H)."""
        raise NotImplementedError

    def forward(self, batch: TaggingBatch) -> Tensor:
        """A batch of L tokens in B sentences -> per-token logits (L, num_tags)."""
        return self.classifier(self.encode(self.features(batch), batch))

    def loss(self, batch: TaggingBatch) -> Tensor:
        """Mean token-level cross entropy against `batch.tags`."""
        if batch.tags is None:
            raise ValueError("batch.tags is None: loss() needs gold tags")
        return F.cross_entropy(self(batch), batch.tags, ignore_index=IGNORE)

    @torch.no_grad()
    def predict(self, batch: TaggingBatch) -> List[List[int]]:
        """Argmax tag ids, one list per sentence (eval mode is the caller's choice)."""
        ids = self(batch).argmax(dim=-1)
        return [t.tolist() for t in batch.split(ids)]
