"""`GlobalAttention`'s nn.MultiheadAttention-style call: padded (B, L, E) self-attention with a key
padding mask, computed without attending to padding, returning MHA's (out, weights)."""

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
