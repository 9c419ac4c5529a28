"""Building blocks of the graph Transformers: positions, embeddings, the feed-forward, the pre-norm
residual and the encoder and decoder layers, built only from `EdgeAttention`.

Everything works on node tensors, one row per token of a whole batch: (N, d_model). The layers
serve every use: training (all rows), incremental decoding (`cache=`: a `KVCache` of earlier
steps) and adaptive depth (`rows=`: only the still-active destinations, the others keep their
keys and values in a `NodeKV`).

Shapes: N tokens, d = d_model, H heads, D = d // H.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import EdgeAttention, Graph, KeyValue, KVStore
from .sentence_ops import SentenceConv


def sinusoid(positions: Tensor, dim: int) -> Tensor:
    """(L,) integer positions -> (L, dim) encodings of Vaswani et al.: sin on even, cos on odd features."""
    freqs = torch.exp(torch.arange(0, dim, 2, device=positions.device) * (-math.log(10000.0) / dim))
    angles = positions[:, None].float() * freqs[None]  # (L, ceil(dim / 2))
    out = angles.new_zeros(positions.shape[0], dim)
    out[:, 0::2] = angles.sin()
    out[:, 1::2] = angles.cos()[:, : dim // 2]
    return out


class PositionalEncoding(nn.Module):
    """Sinusoidal encoding looked up by integer position (or ACT step): (N,) -> (N, d). Positions
    past the table (max_len rows) are computed on the fly, so any length works."""

    def __init__(self, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        self.table: Tensor
        self.register_buffer("table", sinusoid(torch.arange(max_len), d_model), persistent=False)

    def forward(self, pos: Tensor, max_pos: Optional[int] = None) -> Tensor:
        """pos: (N,) -> (N, d). max_pos: the largest entry of pos, where the caller knows it on the
        host (a GraphBatch's lengths do); without it, pos.max() is read, which on a GPU waits for
        the device (a synchronization per call)."""
        if max_pos is None:
            max_pos = int(pos.max()) if pos.numel() else -1
        if max_pos >= self.table.shape[0]:
            return sinusoid(pos, self.table.shape[1]).to(self.table.dtype)
        return self.table[pos]


class Embeddings(nn.Module):
    """Token embedding scaled by sqrt(d_model): (N,) int64 -> (N, d)."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens: (N,) int64 -> (N, d_model) embeddings times sqrt(d_model)."""
        return self.lut(tokens) * self.scale


def source_target_embeddings(
    src_vocab_size: int, tgt_vocab_size: int, d_model: int, share: bool
) -> Tuple[Embeddings, Embeddings]:
    """(source, target) embeddings; one shared module when `share` (equal vocabularies required)."""
    src = Embeddings(src_vocab_size, d_model)
    if not share:
        return src, Embeddings(tgt_vocab_size, d_model)
    if src_vocab_size != tgt_vocab_size:
        raise ValueError(f"share_embeddings needs equal vocabularies, got {src_vocab_size} and {tgt_vocab_size}")
    return src, src


class FeedForward(nn.Module):
    """Position-wise feed-forward w2(dropout(relu(w1(x)))): (N, d) -> (N, d).

    kind="conv" replaces both linears by width-3 convolutions along each sentence
    (`SentenceConv`, never reading across a sentence boundary), so neighbours interact; its
    forward then needs the sentence lengths (B,)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, kind: str = "linear") -> None:
        super().__init__()
        if kind not in ("linear", "conv"):
            raise ValueError(f"kind must be 'linear' or 'conv', got {kind!r}")
        self.kind = kind
        self.w1 = nn.Linear(d_model, d_ff) if kind == "linear" else SentenceConv(d_model, d_ff, 3)
        self.w2 = nn.Linear(d_ff, d_model) if kind == "linear" else SentenceConv(d_ff, d_model, 3)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
        """x: (N, d_model) -> (N, d_model). lengths: (B,) sentence lengths, summing to N; needed
        (ValueError otherwise) and only read by kind="conv"."""
        if self.kind == "linear":
            return self.w2(self.dropout(F.relu(self.w1(x))))
        if lengths is None:
            raise ValueError("FeedForward(kind='conv') needs the sentence lengths")
        return self.w2(self.dropout(F.relu(self.w1(x, lengths))), lengths)


def residual(x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor], dropout: nn.Module) -> Tensor:
    """The pre-norm residual connection x + dropout(sublayer(norm(x)))."""
    return x + dropout(sublayer(norm(x)))


class EncoderLayer(nn.Module):
    """Pre-norm self-attention and feed-forward: x + dropout(f(LN(x))) twice.

    Args:
        d_model, num_heads, d_ff, dropout: sizes and the dropout of sublayers, attention and ffn.
        ffn: "linear" or "conv" (`FeedForward`).
        rel_pos: > 0 adds a learned per-head bias of the clipped relative position src - dst to
            every score (meaningful when both ends of an edge are in the same sentence).
        **attn_kw: EdgeAttention options (clamp, backend).

    forward(x (N, d), graph, lengths=None, cache=None, rows=None) -> (N, d); with rows (R,), x
    holds just those rows (R, d) and `cache` (a NodeKV) the keys and values of every node.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        *,
        ffn: str = "linear",
        rel_pos: int = 0,
        **attn_kw,
    ) -> None:
        super().__init__()
        self.self_attn = EdgeAttention(d_model, num_heads, dropout=dropout, **attn_kw)
        self.ff = FeedForward(d_model, d_ff, dropout, kind=ffn)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.rel_pos = rel_pos
        self.rel_bias = nn.Embedding(2 * rel_pos + 1, num_heads) if rel_pos > 0 else None
        if self.rel_bias is not None:
            nn.init.zeros_(self.rel_bias.weight)

    def edge_bias(self, graph: Graph) -> Optional[Tensor]:
        """(E, H) relative-position scores, or None without rel_pos."""
        if self.rel_bias is None:
            return None
        return self.rel_bias((graph.src - graph.dst).clamp(-self.rel_pos, self.rel_pos) + self.rel_pos)

    def forward(
        self,
        x: Tensor,
        graph: Graph,
        lengths: Optional[Tensor] = None,
        *,
        cache: Optional[KVStore] = None,
        rows: Optional[Tensor] = None,
    ) -> Tensor:
        """x: (N, d) -> (N, d), self-attention along `graph`. lengths: (B,) sentence lengths (for
        ffn="conv"). cache: a `KVStore` the attention writes this call's keys and values into. rows:
        (R,) int64 destinations to compute (x is then (R, d) and so is the output; with a `NodeKV`
        cache the other nodes' keys and values are read from it)."""
        bias = self.edge_bias(graph)
        x = residual(
            x, self.norm1, lambda h: self.self_attn(h, graph, edge_bias=bias, cache=cache, dst_rows=rows), self.dropout
        )
        return residual(x, self.norm2, lambda h: self.ff(h, lengths), self.dropout)


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention, cross attention into the encoder's output (its own
    projections) and feed-forward.

    forward(x (N_dec, d), self_graph, cross_graph, memory, cache=None, rows=None) -> (N_dec, d).
    memory: the encoder output (N_enc, d), or its keys and values projected once
    (`self.cross_attn.project_kv(memory)`), reused across decoding or ACT steps. cache: a
    `KVCache` (incremental decoding) or `NodeKV` (with rows: only those destinations, as in
    `EncoderLayer`).
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float, **attn_kw) -> None:
        super().__init__()
        self.self_attn = EdgeAttention(d_model, num_heads, dropout=dropout, **attn_kw)
        self.cross_attn = EdgeAttention(d_model, num_heads, dropout=dropout, **attn_kw)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        self_graph: Graph,
        cross_graph: Graph,
        memory: Union[Tensor, KeyValue],
        *,
        cache: Optional[KVStore] = None,
        rows: Optional[Tensor] = None,
    ) -> Tensor:
        """x: (N_dec, d) -> (N_dec, d) (with rows: (R, d) -> (R, d)); see the class docstring."""
        x = residual(x, self.norm1, lambda h: self.self_attn(h, self_graph, cache=cache, dst_rows=rows), self.dropout)
        if isinstance(memory, KeyValue):
            cross = lambda h: self.cross_attn(h, cross_graph, kv=memory, dst_rows=rows)  # noqa: E731
        else:
            cross = lambda h: self.cross_attn(h, cross_graph, memory, dst_rows=rows)  # noqa: E731
        x = residual(x, self.norm2, cross, self.dropout)
        return residual(x, self.norm3, self.ff, self.dropout)


def xavier_init_(module: nn.Module) -> None:
    """Xavier-uniform every parameter with more than one dimension."""
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
