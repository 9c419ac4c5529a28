"""`TransformerTagger`: an encoder-only Transformer on `EdgeAttention` for sequence tagging.

Each batch is one block-diagonal graph (`graphs.batch`) of every sentence's complete graph, or of
its `graphs.window(n, r)` for local attention: no padding, no masks. Positions are sinusoidal and
restart at 0 in every sentence; an optional learned relative-position bias per head (clipped
distance src - dst) goes in through `EdgeAttention`'s `edge_bias`. Its layers are the
`EncoderLayer` of the seq2seq models, with a width-3 convolution feed-forward as an option.

Checkpoints written before the layers were shared name a layer's attention `attn` and its
feed-forward `ffn`; `load_state_dict` renames them to `self_attn` and `ff`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .. import Graph, graphs
from .blocks import EncoderLayer, sinusoid
from .sentence_ops import positions_in_sentence
from .token_features import Tagger, TaggingBatch


class TransformerTagger(Tagger):
    """Token features -> linear to `dim` + sinusoidal positions -> `layers` encoder layers of
    EdgeAttention over each sentence (complete graph, or window `window`) -> per-token classifier.

    Args:
        num_words, num_pos, num_chars, num_tags, features: as `Tagger`.
        dim, heads, layers, ffn_dim: encoder width, heads, depth, feed-forward hidden size.
        ffn: "linear" or "conv" (width-3 convolutions along each sentence, see `FeedForward`).
        window: None for complete graphs, else attend only to |i - j| <= window.
        rel_pos: clip distance of a learned per-head relative-position bias (0: none).
        clamp: score clamp passed to EdgeAttention (None: exact softmax).  backend: its kernel backend.

    Shapes: batch of L tokens -> features (L, F) -> encoder states (L, dim) -> logits (L, num_tags).
    """

    def __init__(
        self,
        num_words: int,
        num_pos: int,
        num_chars: int,
        num_tags: int,
        *,
        dim: int = 128,
        heads: int = 4,
        layers: int = 2,
        ffn_dim: int = 256,
        ffn: str = "conv",
        window: Optional[int] = None,
        rel_pos: int = 0,
        dropout: float = 0.1,
        clamp: Optional[Tuple[float, float]] = None,
        backend: str = "auto",
        features: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(num_words, num_pos, num_chars, num_tags, features)
        self.window = window
        self.input = nn.Linear(self.features.out_dim, dim)
        self.layers = nn.ModuleList(
            EncoderLayer(dim, heads, ffn_dim, dropout, ffn=ffn, rel_pos=rel_pos, clamp=clamp, backend=backend)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, num_tags)
        self.dim = dim
        self._graphs: Dict[Tuple[int, str], Graph] = {}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for key in [k for k in state_dict if k.startswith(prefix + "layers.")]:
            renamed = current_key(key)
            if renamed != key:
                state_dict[renamed] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _sentence_graph(self, n: int, device: torch.device) -> Graph:
        key = (n, str(device))
        if key not in self._graphs:
            self._graphs[key] = (
                graphs.complete(n, device=device)
                if self.window is None
                else graphs.window(n, self.window, device=device)
            )
        return self._graphs[key]

    def graph(self, lengths: List[int], device: torch.device) -> Graph:
        """The batch's block-diagonal graph: one complete (or window) graph per sentence."""
        return graphs.batch([self._sentence_graph(n, device) for n in lengths])

    def encode(self, features: Tensor, batch: TaggingBatch) -> Tensor:
        """Token features (L, F) -> encoder states (L, dim), attention within each sentence's graph."""
        g = self.graph(batch.lengths.tolist(), batch.words.device)
        x = self.input(features)  # (L, dim)
        x = x + sinusoid(positions_in_sentence(batch.lengths), self.dim)
        for layer in self.layers:
            x = layer(x, g, batch.lengths)
        return self.norm(x)


def current_key(key: str) -> str:
    """A state-dict key of a tagger checkpoint written before the layers were shared, renamed."""
    return key.replace(".attn.", ".self_attn.").replace(".ffn.", ".ff.")
