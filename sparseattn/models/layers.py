"""Building blocks shared by the graph Transformer and the Universal Transformer.

Everything works on node tensors, one row per token of a whole batch: (N, d_model). The
attention modules are `sparseattn.EdgeAttention`; `project_q` / `project_kv` / `attend` split
one module's computation into its parts (same parameters, nn.MultiheadAttention layout) so
decoding can project keys and values once and reuse them (a cache), and the Universal
Transformer can project only the still-active nodes.

Shapes: N tokens, d = d_model, H heads, D = d // H.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import EdgeAttention, Graph, edge_attention


def _in_proj(attn: EdgeAttention, which: int) -> Tuple[Tensor, Optional[Tensor]]:
    """Weight and bias of projection `which` (0 = q, 1 = k, 2 = v) of an EdgeAttention."""
    e = attn.embed_dim
    if attn.in_proj_weight is not None:
        w = attn.in_proj_weight[which * e:(which + 1) * e]
    else:
        w = (attn.q_proj_weight, attn.k_proj_weight, attn.v_proj_weight)[which]
    b = None if attn.in_proj_bias is None else attn.in_proj_bias[which * e:(which + 1) * e]
    return w, b


def project_q(attn: EdgeAttention, x: Tensor) -> Tensor:
    """Queries (N, d) -> (N, H, D) with `attn`'s query projection."""
    return F.linear(x, *_in_proj(attn, 0)).reshape(-1, attn.num_heads, attn.head_dim)


def project_kv(attn: EdgeAttention, x: Tensor) -> Tuple[Tensor, Tensor]:
    """Keys and values (N, d) -> two (N, H, D) with `attn`'s key and value projections."""
    h, d = attn.num_heads, attn.head_dim
    return F.linear(x, *_in_proj(attn, 1)).reshape(-1, h, d), F.linear(x, *_in_proj(attn, 2)).reshape(-1, h, d)


def attend(attn: EdgeAttention, q: Tensor, k: Tensor, v: Tensor, graph: Graph, return_weights: bool = False,
           rows: Optional[Tensor] = None):
    """`edge_attention` with `attn`'s clamp, dropout and backend, then its output projection.
    q: (N_dst, H, D), k/v: (N_src, H, D) -> (N_dst, d), or (len(rows), d) for just those
    destinations when `rows` is given; with return_weights also the (E, H) weights."""
    res = edge_attention(q, k, v, graph, clamp=attn.clamp, dropout_p=attn.dropout if attn.training else 0.0,
                         backend=attn.backend, return_weights=return_weights)
    out, w = res if return_weights else (res, None)
    if rows is not None:
        out = out[rows]
    out = attn.out_proj(out.reshape(out.shape[0], -1))  # (N_dst, H, D) -> (N_dst, d)
    return (out, w) if return_weights else out


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model) sinusoidal encodings: sin on even, cos on odd features."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div)[:, : d_model // 2]
    return table


class PositionalEncoding(nn.Module):
    """Sinusoidal encoding looked up by integer position (or ACT step): (N,) -> (N, d)."""

    def __init__(self, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, pos: Tensor) -> Tensor:
        if pos.numel() and int(pos.max()) >= self.table.shape[0]:
            raise ValueError(f"position {int(pos.max())} exceeds the encoding table ({self.table.shape[0]} rows)")
        return self.table[pos]


class Embeddings(nn.Module):
    """Token embedding scaled by sqrt(d_model): (N,) int64 -> (N, d)."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.lut(tokens) * self.scale


def source_target_embeddings(src_vocab_size: int, tgt_vocab_size: int, d_model: int,
                             share: bool) -> "tuple[Embeddings, Embeddings]":
    """(source, target) embeddings; one shared module when `share` (equal vocabularies required)."""
    src = Embeddings(src_vocab_size, d_model)
    if not share:
        return src, Embeddings(tgt_vocab_size, d_model)
    if src_vocab_size != tgt_vocab_size:
        raise ValueError(f"share_embeddings needs equal vocabularies, got {src_vocab_size} and {tgt_vocab_size}")
    return src, src


class FeedForward(nn.Module):
    """Linear -> ReLU -> dropout -> Linear: (N, d) -> (N, d)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.w1, self.w2, self.dropout = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(F.relu(self.w1(x))))


class EncoderLayer(nn.Module):
    """Pre-norm self-attention and feed-forward: x + dropout(f(LN(x))) twice."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float, **attn_kw) -> None:
        super().__init__()
        self.self_attn = EdgeAttention(d_model, num_heads, dropout=dropout, **attn_kw)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, graph: Graph, record: Optional["AttentionRecorder"] = None, layer: int = 0) -> Tensor:
        x = x + self.dropout(attention_with_record(self.self_attn, self.norm1(x), graph, None, record, "encoder", layer))
        return x + self.dropout(self.ff(self.norm2(x)))


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention, cross attention (its own projections) and feed-forward."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float, **attn_kw) -> None:
        super().__init__()
        self.self_attn = EdgeAttention(d_model, num_heads, dropout=dropout, **attn_kw)
        self.cross_attn = EdgeAttention(d_model, num_heads, dropout=dropout, **attn_kw)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, self_graph: Graph, cross_graph: Graph,
                record: Optional["AttentionRecorder"] = None, layer: int = 0) -> Tensor:
        x = x + self.dropout(attention_with_record(self.self_attn, self.norm1(x), self_graph, None, record,
                                                   "decoder", layer))
        x = x + self.dropout(attention_with_record(self.cross_attn, self.norm2(x), cross_graph, memory, record,
                                                   "cross", layer))
        return x + self.dropout(self.ff(self.norm3(x)))


class AttentionRecorder:
    """Collects (kind, layer, graph, weights) for plots: kind in {"encoder", "decoder", "cross"},
    weights (E, H) in the graph's edge order. Pass one to a model's forward(record=...)."""

    def __init__(self) -> None:
        self.records: list = []

    def add(self, kind: str, layer: int, graph: Graph, weights: Tensor) -> None:
        self.records.append((kind, layer, graph, weights.detach()))


def attention_with_record(attn: EdgeAttention, x_dst: Tensor, graph: Graph, x_src: Optional[Tensor],
                          record: Optional[AttentionRecorder], kind: str, layer: int) -> Tensor:
    """attn(x_dst, graph, x_src), also storing its weights in `record` when given."""
    if record is None:
        return attn(x_dst, graph, x_src)
    out, w = attn(x_dst, graph, x_src, return_weights=True)
    record.add(kind, layer, graph, w)
    return out


def xavier_init_(module: nn.Module) -> None:
    """Xavier-uniform every parameter with more than one dimension (the seed's init)."""
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
