"""`BiLSTMTagger`: the baseline, a bidirectional LSTM over packed sentences (no padding compute)."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

from .token_features import Tagger, TaggingBatch, TokenFeatures


class BiLSTMTagger(Tagger):
    """Token features (as `TransformerTagger`) -> `layers`-layer BiLSTM over packed sentences ->
    dropout -> per-token classifier.

    Shapes: batch of L tokens -> logits (L, num_tags).
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
        features: Optional[Dict] = None,
    ) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.features = TokenFeatures(num_words, num_pos, num_chars, **(features or {}))
        self.lstm = nn.LSTM(
            self.features.out_dim, hidden, num_layers=layers, bidirectional=True, dropout=dropout if layers > 1 else 0.0
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * hidden, num_tags)

    def forward(self, batch: TaggingBatch) -> Tensor:
        """A batch of L tokens in B sentences -> per-token logits (L, num_tags)."""
        x = self.features(batch)  # (L, F)
        packed = pack_sequence(list(batch.split(x)), enforce_sorted=False)
        out, _ = self.lstm(packed)
        padded, lengths = pad_packed_sequence(out)  # (T, B, 2 * hidden); padding only to unpack
        keep = torch.arange(padded.shape[0])[None, :] < lengths[:, None]  # (B, T), lengths on CPU
        h = padded.transpose(0, 1)[keep.to(padded.device)]  # (L, 2 * hidden) in batch order
        return self.classifier(self.dropout(h))
