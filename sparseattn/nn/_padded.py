"""Padding for `GlobalAttention`: its nn.MultiheadAttention-style call (padded (B, L, E)
self-attention with a key padding mask, computed without attending to padding, returning MHA's
(out, weights)), and its padded path for batches of many small graphs (`padded_batch_attention`)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import graphs
from ..functional import edge_attention


def is_mha_call(x: Tensor, key: object) -> bool:
    """Whether layer(x, key, ...) is nn.MultiheadAttention's call (query, key, value): the second
    argument is a floating tensor of x's rank rather than a batch vector of graph ids."""
    return isinstance(key, Tensor) and key.is_floating_point() and key.dim() == x.dim() and x.dim() in (2, 3)


def padded_attention(
    layer,
    query: Tensor,
    key: object,
    value: object,
    key_padding_mask: Optional[Tensor],
    need_weights: bool,
    attn_mask: Optional[Tensor],
    average_attn_weights: bool,
    is_causal: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """nn.MultiheadAttention(query, query, query, key_padding_mask=...) for `layer` (a GlobalAttention):
    query (B, L, E) with layer.batch_first, else (L, B, E), or unbatched (L, E); key_padding_mask
    (B, L) bool, True at padding. Returns (out, weights) as MHA: out in query's layout, weights
    (B, L, L) averaged over heads (or (B, H, L, L)) or None. Each of the B sequences is one graph:
    every row, padded ones included, attends to that sequence's real rows only."""
    if key is not query or value is not query:
        raise ValueError(
            "GlobalAttention is self-attention: an nn.MultiheadAttention-style call must pass one tensor as query, "
            "key and value (GraphGPS's self_attn(x, x, x, key_padding_mask=...)), got different tensors"
        )
    if attn_mask is not None or is_causal:
        raise ValueError(
            "GlobalAttention takes no attn_mask or is_causal: it attends within each graph; mark padding with "
            "key_padding_mask (B, L), True at padding"
        )
    e, h, d = layer.embed_dim, layer.num_heads, layer.head_dim
    if query.shape[-1] != e:
        raise ValueError(f"query must have embed_dim={e} channels last, got shape {tuple(query.shape)}")
    unbatched = query.dim() == 2
    x = query.unsqueeze(0) if unbatched else (query if layer.batch_first else query.transpose(0, 1))  # (B, L, E)
    b, length = x.shape[0], x.shape[1]
    real = torch.ones(b, length, dtype=torch.bool, device=x.device)
    if key_padding_mask is not None:
        expected = (length,) if unbatched else (b, length)
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != expected:
            raise ValueError(
                f"key_padding_mask must be a bool tensor {expected} (batch, source length), True at padding, "
                f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        real = ~key_padding_mask.view(b, length)
    sizes = real.sum(dim=1).tolist()  # real rows (keys) per sequence
    # sequence i: its L rows (queries) attend to its sizes[i] real rows (keys)
    graph = graphs.from_blocks([("full", n, length) for n in sizes], device=x.device).for_one_call()
    keep = real.reshape(-1)
    q, k, v = F.linear(x.reshape(b * length, e), layer.in_proj_weight, layer.in_proj_bias).chunk(3, dim=-1)
    result = edge_attention(
        q.reshape(-1, h, d),  # (B * L, H, D)
        k[keep].reshape(-1, h, d),  # (real rows, H, D)
        v[keep].reshape(-1, h, d),
        graph,
        clamp=layer.clamp,
        dropout_p=layer.dropout if layer.training else 0.0,
        backend=layer.backend,
        return_weights=need_weights,
    )
    out, alpha = result if isinstance(result, tuple) else (result, None)
    out = layer.out_proj(out.reshape(b, length, e))  # (B, L, E)
    out = out.squeeze(0) if unbatched else (out if layer.batch_first else out.transpose(0, 1))
    if alpha is None:
        return out, None
    dst, src = graph.edge_index[1], torch.nonzero(keep).squeeze(1)[graph.edge_index[0]]  # flat rows b * L + i
    weights = alpha.new_zeros(b, length, length, h)  # (B, L_query, L_key, H)
    weights[dst // length, dst % length, src % length] = alpha
    weights = weights.permute(0, 3, 1, 2)  # (B, H, L, L)
    if average_attn_weights:
        weights = weights.mean(dim=1)
    return out, weights.squeeze(0) if unbatched else weights


# `GlobalAttention(x, batch)` with backend "auto" pads the batch to (B, L_max) and runs one SDPA with a
# key mask when its padded score matrix B * L_max^2 is at most this many times the graph's sum_b n_b^2
# edges: no per-call graph to build, one batched kernel. Measured (1 thread, CPU, dim 64, 4 heads): 128
# graphs of 20-40 nodes (ratio ~1.7) padded beat the block graph (built per call or prebuilt) forward
# and fwd+bwd; see docs/guide/nn.md.
PADDED_MAX_WASTE = 4.0


def graph_sizes(batch: Optional[Tensor], ptr: Optional[Tensor], n: int) -> Optional[Tensor]:
    """(B,) node counts of the graphs of a batch of n nodes from ptr (B + 1,) offsets, else a sorted
    batch (n,) vector, with tensor ops only (no per-graph Python); None if neither is given. Only
    shapes and dtypes are checked here: the graph path checks the values."""
    if ptr is not None:
        if ptr.dim() == 1 and ptr.numel() > 1 and ptr.dtype in (torch.int32, torch.int64) and int(ptr[0]) == 0:
            return ptr.diff()
        return None
    if batch is not None and batch.dim() == 1 and batch.numel() == n and batch.dtype in (torch.int32, torch.int64):
        if n > 0 and int(batch[0]) >= 0 and not bool((batch.diff() < 0).any()):
            return torch.bincount(batch)
    return None


def padded_batch_attention(layer, x: Tensor, batch: Optional[Tensor], ptr: Optional[Tensor]) -> Optional[Tensor]:
    """`layer(x, batch)` (a GlobalAttention) as one SDPA over the batch padded to (B, H, L_max, D),
    keys masked past each graph's size: x (N, E) -> (N, E). None when the batch does not qualify
    (invalid or unsorted ids, ptr not spanning x, or padding costlier than PADDED_MAX_WASTE times the
    edges): the caller then takes the graph path, which also names what is wrong."""
    n, e, h, d = x.shape[0], layer.embed_dim, layer.num_heads, layer.head_dim
    sizes = graph_sizes(batch, ptr, n)
    if sizes is None:
        return None
    stats = torch.stack([sizes.min(), sizes.max(), sizes.sum(), (sizes * sizes).sum()]).tolist()
    smallest, length, total, edges = stats
    if smallest < 0 or total != n or length == 0 or sizes.numel() * length * length > PADDED_MAX_WASTE * edges:
        return None
    b = sizes.numel()
    starts = sizes.cumsum(0) - sizes  # (B,) first node of each graph
    graph_id = batch if ptr is None else torch.repeat_interleave(torch.arange(b, device=x.device), sizes, output_size=n)
    slot = graph_id * length + torch.arange(n, device=x.device) - starts[graph_id]  # (N,) row in (B * L)
    qkv = F.linear(x, layer.in_proj_weight, layer.in_proj_bias)  # (N, 3E)
    dense = qkv.new_zeros(b * length, 3 * e).index_copy_(0, slot, qkv)  # (B * L, 3E), padding rows 0
    q, k, v = dense.view(b, length, 3, h, d).permute(2, 0, 3, 1, 4)  # (B, H, L, D) each
    # keys past a graph's size are masked; an empty graph's rows are all padding, so keep its first key
    pad = torch.arange(length, device=x.device) >= sizes.clamp(min=1).unsqueeze(1)  # (B, L)
    # an additive float mask: measured faster in CPU SDPA than a bool one
    mask = torch.zeros(b, 1, 1, length, dtype=q.dtype, device=x.device).masked_fill_(pad[:, None, None], float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=layer.dropout if layer.training else 0.0
    )  # (B, H, L, D)
    out = out.transpose(1, 2).reshape(b * length, e).index_select(0, slot)  # (N, E)
    return layer.out_proj(out)
