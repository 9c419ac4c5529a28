"""Attention within each graph of a batch as one SDPA over the batch padded to its largest graph: the
plan of a batch (each node's row in the (B, L) padding, the key mask past each graph) and the kernel.
`kernels.auto.choose_padding` decides when it runs (PADDED_MAX_WASTE); `kernels.within_graphs` runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# The padded form runs when its score matrix B * L_max^2 is at most this many times the graph's
# sum_b n_b^2 edges (exact softmax, no bias, no weights asked for, backend "auto", eager). Measured
# (1 thread, CPU, GlobalAttention(64, 4 heads) fwd+bwd, padded over the block graph's time): waste
# 2.4 (32 graphs of 5-25 nodes) 1.87x, 8.6 (5-15 and one of 40) 1.28x, 9.5 (16 of 20-60, one of 200)
# 1.07x, 11.7 (64 of 10-40, one of 100) 0.85x, 16-22 (32 of 3-15, one of 60) 0.81-0.91x; FreeSolv's
# batches of 32 molecules (waste 3.2-5.4) padded 1.0-2.1x, 62 against 87 ms an epoch with the
# earlier bound of 4.
PADDED_MAX_WASTE = 8.0


@dataclass(frozen=True)
class PaddedBatch:
    """A batch of B graphs padded to L rows each: slot (N,) each node's row in (B * L), key_mask
    (B, 1, 1, L) 0 for a graph's keys and -inf past them (an empty graph keeps its first key)."""

    graphs: int
    length: int
    slot: Tensor
    key_mask: Tensor


def graph_sizes(batch: Optional[Tensor], ptr: Optional[Tensor], n: int) -> Optional[Tensor]:
    """(B,) node counts of the graphs of a batch of n nodes from ptr (B + 1,) offsets, else a sorted
    batch (n,) vector, with tensor ops only (no per-graph Python); None if neither is given or they are
    not a valid sorted batch (the graph path then names what is wrong)."""
    if ptr is not None:
        if ptr.dim() == 1 and ptr.numel() > 1 and ptr.dtype in (torch.int32, torch.int64) and int(ptr[0]) == 0:
            return ptr.diff()
        return None
    if batch is not None and batch.dim() == 1 and batch.numel() == n and batch.dtype in (torch.int32, torch.int64):
        if n > 0 and int(batch[0]) >= 0 and not bool((batch.diff() < 0).any()):
            return torch.bincount(batch)
    return None


def plan_padding(sizes: Tensor, n: int, length: int, dtype: torch.dtype) -> PaddedBatch:
    """The padded plan of B graphs of `sizes` (B,) nodes, n in all, padded to `length` rows each."""
    b, device = sizes.numel(), sizes.device
    starts = sizes.cumsum(0) - sizes  # (B,) first node of each graph
    graph_id = torch.repeat_interleave(torch.arange(b, device=device), sizes, output_size=n)
    slot = graph_id * length + torch.arange(n, device=device) - starts[graph_id]  # (N,) row in (B * L)
    past = torch.arange(length, device=device) >= sizes.clamp(min=1).unsqueeze(1)  # (B, L)
    # an additive float mask: measured faster in CPU SDPA than a bool one
    key_mask = torch.zeros(b, 1, 1, length, dtype=dtype, device=device).masked_fill_(past[:, None, None], float("-inf"))
    return PaddedBatch(b, length, slot, key_mask)


def padded_attention(q: Tensor, k: Tensor, v: Tensor, plan: PaddedBatch, dropout_p: float) -> Tensor:
    """q, k, v (N, H, D) -> (N, H, D): one SDPA over the plan's (B, H, L, D) padding."""
    b, length, slot = plan.graphs, plan.length, plan.slot
    n, h, d = q.shape

    def dense(t: Tensor) -> Tensor:  # (N, H, D) -> (B, H, L, D), padding rows 0
        rows = t.new_zeros(b * length, h, t.shape[2]).index_copy_(0, slot, t)
        return rows.view(b, length, h, t.shape[2]).transpose(1, 2)

    out = F.scaled_dot_product_attention(dense(q), dense(k), dense(v), attn_mask=plan.key_mask, dropout_p=dropout_p)
    return out.transpose(1, 2).reshape(b * length, h, v.shape[2]).index_select(0, slot)  # (N, H, Dv)


__all__ = ["PADDED_MAX_WASTE", "PaddedBatch", "graph_sizes", "padded_attention", "plan_padding"]
