"""`BiLSTMTagger`: the baseline, a bidirectional LSTM over packed sentences (no padding compute)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

from .token_features import Tagger, TaggingBatch


class BiLSTMTagger(Tagger):
    """Token features (`Tagger`) -> `layers`-layer BiLSTM over packed sentences -> dropout ->
    per-token classifier.

    Args:
        num_words, num_pos, num_chars, num_tags, features: as `Tagger`.
        hidden: LSTM units per direction. layers: stacked LSTM layers.
        dropout: between LSTM layers and before the classifier.

    Shapes: batch of L tokens -> features (L, F) -> LSTM states (L, 2 * hidden) -> logits (L, num_tags).
    """

    def __init__(
        self,
        num_words: int,
        num_pos: int,
        num_chars: int,
        num_tags: int,
        *,
        hidden: int = 200,
        layers: int = 1,
        dropout: float = 0.3,
        features: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(num_words, num_pos, num_chars, num_tags, features)
        self.lstm = nn.LSTM(
            self.features.out_dim, hidden, num_layers=layers, bidirectional=True, dropout=dropout if layers > 1 else 0.0
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * hidden, num_tags)

    def encode(self, features: Tensor, batch: TaggingBatch) -> Tensor:
        """Token features (L, F) -> BiLSTM states (L, 2 * hidden), each sentence on its own, after dropout."""
        packed = pack_sequence(list(batch.split(features)), enforce_sorted=False)
        out, _ = self.lstm(packed)
        padded, lengths = pad_packed_sequence(out)  # (T, B, 2 * hidden); padding only to unpack
        keep = torch.arange(padded.shape[0])[None, :] < lengths[:, None]  # (B, T), lengths on CPU
        h = padded.transpose(0, 1)[keep.to(padded.device)]  # (L, 2 * hidden) in batch order
        return self.dropout(h)
