"""Dense masked multi-head attention: an independent reference that shares no code with sparseattn.

The graph becomes a (N_dst, N_src) multiplicity matrix (how many edges run s -> t); the mask is
where it is positive. Scores are computed densely for all pairs and masked afterwards.
"""

from __future__ import annotations

import torch


def dense_attention(q, k, v, edge_index, *, scale=None, clamp=(-5.0, 5.0), bias_table=None, message_table=None):
    """q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv), edge_index: (2, E).
    bias_table: optional (N_dst, N_src, H) additive score per (destination, source) pair.
    message_table: optional (N_dst, N_src, H) multiplier of each pair's normalized weight in the
    output (the sum over the pair's edges of their multipliers; default: the pair's edge count).
    Returns (N_dst, H, Dv); destinations without in-edges get 0 (not NaN)."""
    n_dst, n_src, h = q.shape[0], k.shape[0], q.shape[1]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    count = torch.zeros(n_dst, n_src, dtype=torch.float64, device=q.device)
    count.index_put_(
        (edge_index[1], edge_index[0]),
        torch.ones(edge_index.shape[1], dtype=torch.float64, device=q.device),
        accumulate=True,
    )
    mask = count > 0  # (N_dst, N_src)
    scores = torch.einsum("thd,shd->hts", q.double(), k.double()) * scale  # (H, N_dst, N_src)
    if bias_table is not None:
        scores = scores + bias_table.double().permute(2, 0, 1)
    if clamp is not None:
        weights = torch.exp(scores.clamp(clamp[0], clamp[1]))
    else:
        masked = scores.masked_fill(~mask, float("-inf"))
        row_max = masked.amax(-1, keepdim=True).detach() if n_src else masked.new_zeros(h, n_dst, 1)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        weights = torch.exp(masked - row_max)
    z = (weights * count).sum(-1, keepdim=True)  # (H, N_dst, 1): duplicates count once each; non-edges 0
    messages = weights * (count if message_table is None else message_table.double().permute(2, 0, 1))
    out = messages @ v.double().permute(1, 0, 2)  # (H, N_dst, Dv)
    out = out / torch.where(z == 0, torch.ones_like(z), z)
    return out.permute(1, 0, 2)  # (N_dst, H, Dv)
