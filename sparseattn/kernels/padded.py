"""Attention within each graph of a batch as one SDPA over rows of packed graphs: the plan of a batch
(each node's slot in a (rows, C) padding, the mask that keeps each graph to its own keys) and the
kernel. Graphs are packed several to a row (first-fit decreasing into rows of C slots), so a batch of
molecules of 3-22 atoms runs as 9 rows of 32 rather than 32 rows of 22: CPU SDPA pays per (row, head)
about as much as for 600 more scores, so fewer rows beat less padding. `kernels.auto.choose_padding`
decides when it runs (PADDED_MAX_WASTE) and `choose_packing` where rows hold several graphs (the CPU);
`kernels.within_graphs` runs it, checked where a row holds more than one graph (`kernels.guard`: a
NaN in one graph would otherwise reach the others of its row)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..graphs.structure import sorted_id_counts

# The padded form runs when its cost in scores, rows * (C^2 + PACK_ROW_SCORES), is at most this many
# times the graphs' sum_b n_b^2 edges (exact softmax, no bias, no weights asked for, backend "auto",
# eager). Measured (1 thread, CPU, GlobalAttention(64, 4 heads) fwd+bwd with a plan per batch, the
# block graph's time over the packed rows'): cost/edges 2.0 (one graph of 120 or 300 nodes and
# 40-100 of 1-4) 2.8-3.2x, 1.9-4.3 (32 graphs of 5-60, 5-25, 5-15 and one of 40, 3-15 and one of 60,
# 64 of 10-40 and one of 100) 1.6-2.3x, FreeSolv's batches of 32 molecules (4.7-6.1) 2.0x, 128 of 2-10
# (6.8-7.5) 1.4x, 11-34 (8 of 3-6, 32 of 2-4, 64 of 1-3) 1.3-1.4x, 51 (256 of 1 node) 1.09x.
PADDED_MAX_WASTE = 48.0
# What one row of a padded SDPA costs beyond its C^2 scores, in scores: CPU SDPA fwd+bwd (H=4, D=16,
# 1 thread) took about 7 + 0.012 C^2 us per (row, head) from C = 8 to 96 (rows of 8: 7.7 us, 22: 14,
# 32: 23, 64: 62, 96: 116).
PACK_ROW_SCORES = 600
# Row lengths tried beside the largest graph's (the cheapest by the cost above is taken): FreeSolv's
# batches of 32 molecules (largest 17-22 atoms) packed in rows of 32 ran fwd+bwd 1.8x faster than one
# molecule per row of 22 (48: 1.6x, 64: 1.5x); 32 graphs of 5-60 nodes in rows of the largest, 1.4x.
PACK_LENGTHS = (16, 32, 48, 64)
# Packing is taken only where it cuts that cost to at most this fraction of one graph per row's: a
# packed row costs a full (L, L) mask and the result check (kernels.guard; together ~0.5 ms a call
# fwd+bwd on FreeSolv's batches, 1 thread), which 128 graphs of 20-40 nodes (one pair packed: 127
# rows of 40 for 128) paid for nothing. Packing cut the cost to 0.42 on FreeSolv and 0.78 on 32
# graphs of 5-60 nodes, and ran their SDPA 1.8x and 1.4x faster.
PACK_MAX_COST_RATIO = 0.9


@dataclass(frozen=True)
class PaddedBatch:
    """A batch of graphs in `rows` rows of `length` slots: slot (N,) each node's slot in (rows * length),
    mask 0 where a slot's key is of the query's graph and -inf elsewhere, so that no row of the
    softmax is empty: (rows, 1, length, length) when packed (a padding slot sees itself only), else
    (rows, 1, 1, length), the row's graph's keys (an empty graph's row keeps its first slot); sizes
    the B graphs' node counts; packed: whether some row holds more than one graph."""

    rows: int
    length: int
    slot: Tensor
    mask: Tensor
    sizes: Tuple[int, ...]
    packed: bool
    _alone: List["PaddedBatch"] = field(default_factory=list, repr=False, compare=False)

    def alone(self) -> "PaddedBatch":
        """The plan with one graph per row (each graph apart: what a packed row computes, without a
        non-finite value of one graph reaching another), built on first use."""
        if not self.packed:
            return self
        if not self._alone:
            self._alone.append(plan_padding(self.sizes, self.mask.dtype, self.slot.device, packing=False))
        return self._alone[0]


def graph_sizes(batch: Optional[Tensor], ptr: Optional[Tensor], n: int) -> Optional[Tensor]:
    """(B,) node counts of the graphs of a batch of n nodes from ptr (B + 1,) offsets, else a sorted
    batch (n,) vector, with tensor ops only (no per-graph Python); None if neither is given or they are
    not a valid sorted batch (the graph path then names what is wrong)."""
    if ptr is not None:
        if ptr.dim() == 1 and ptr.numel() > 1 and ptr.dtype in (torch.int32, torch.int64) and int(ptr[0]) == 0:
            return ptr.diff()
        return None
    if (
        batch is not None
        and batch.dim() == 1
        and batch.numel() == n
        and batch.dtype in (torch.int32, torch.int64)
        and n > 0
    ):
        return sorted_id_counts(batch)
    return None


def pack(sizes: List[int], length: int) -> List[List[int]]:
    """Graph ids in rows of `length` slots, first-fit decreasing: largest graph first, each into the
    first row it fits (length >= max(sizes)); empty graphs take no row."""
    order = [i for i in sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True) if sizes[i] > 0]
    smallest = sizes[order[-1]] if order else 0
    rows: List[List[int]] = []
    open_rows: List[List[int]] = []  # [row, slots left] of the rows the smallest graph still fits, in row order
    for i in order:
        n = sizes[i]
        for at, (r, free) in enumerate(open_rows):
            if free >= n:
                rows[r].append(i)
                open_rows[at][1] = free - n
                if free - n < smallest:  # full for every graph: never scanned again
                    del open_rows[at]
                break
        else:
            rows.append([i])
            if length - n >= smallest:
                open_rows.append([len(rows) - 1, length - n])
    return rows or [[]]


def rows_cost(rows: int, length: int) -> int:
    """A padded SDPA's cost in scores (PACK_ROW_SCORES): what `plan_padding` minimizes and
    `auto.choose_padding` weighs against the graphs' edges."""
    return rows * (length * length + PACK_ROW_SCORES)


def plan_padding(sizes: Sequence[int], dtype: torch.dtype, device: torch.device, packing: bool = True) -> PaddedBatch:
    """The plan, on `device`, of B graphs of `sizes` nodes (read from the host once by the caller):
    packed in rows of the largest graph's length or of PACK_LENGTHS, whichever `rows_cost` finds
    cheapest, where that is at most PACK_MAX_COST_RATIO of one graph per row's cost; else, and without
    packing, one graph per row of the largest graph's length."""
    counts = list(sizes)
    longest, total = max(max(counts, default=1), 1), sum(counts)
    alone = [[i] for i in range(len(counts))]
    if not packing:
        return _plan(alone, counts, longest, dtype, device)

    def bound(length: int) -> int:  # the cost with every row full: no packing does better
        return rows_cost(-(-total // length), length)

    best: Optional[Tuple[int, int, List[List[int]]]] = None  # (cost, length, rows)
    for length in sorted({longest, *(c for c in PACK_LENGTHS if c > longest)}, key=bound):
        if best is not None and bound(length) >= best[0]:
            break
        rows = pack(counts, length)
        if best is None or rows_cost(len(rows), length) < best[0]:
            best = (rows_cost(len(rows), length), length, rows)
    assert best is not None
    if best[0] > PACK_MAX_COST_RATIO * rows_cost(len(alone), longest):
        return _plan(alone, counts, longest, dtype, device)
    return _plan(best[2], counts, best[1], dtype, device)


def _plan(
    rows: List[List[int]], sizes: List[int], length: int, dtype: torch.dtype, device: torch.device
) -> PaddedBatch:
    """The PaddedBatch of graphs placed in rows (graph ids per row, in slot order), sizes per graph."""
    n = sum(sizes)
    starts = [0] * len(sizes)
    for i in range(1, len(sizes)):
        starts[i] = starts[i - 1] + sizes[i - 1]
    first_slot = [0] * len(sizes)  # each graph's first slot in (rows * length)
    for r, graphs in enumerate(rows):
        at = r * length
        for i in graphs:
            first_slot[i], at = at, at + sizes[i]
    counts = torch.tensor(sizes, dtype=torch.long, device=device)
    graph_id = torch.repeat_interleave(torch.arange(len(sizes), device=device), counts, output_size=n)
    offset = torch.tensor([f - s for f, s in zip(first_slot, starts)], dtype=torch.long, device=device)
    slot = torch.arange(n, device=device) + offset[graph_id]  # (N,)
    packed = any(len(g) > 1 for g in rows)
    if packed:  # (rows, 1, length, length): the keys of the query's own graph; padding: its own slot only
        owner = -1 - torch.arange(len(rows) * length, device=device)
        owner = owner.index_copy_(0, slot, graph_id).view(len(rows), length)
        apart = (owner.unsqueeze(2) != owner.unsqueeze(1)).unsqueeze(1)
    else:  # (rows, 1, 1, length): the row's own graph's keys (an empty graph keeps its first slot)
        filled = torch.tensor([sum(sizes[i] for i in g) for g in rows], dtype=torch.long, device=device)
        apart = (torch.arange(length, device=device) >= filled.clamp(min=1).unsqueeze(1))[:, None, None]
    mask = torch.zeros(apart.shape, dtype=dtype, device=device).masked_fill_(apart, float("-inf"))
    return PaddedBatch(len(rows), length, slot, mask, tuple(sizes), packed)


def padded_attention(q: Tensor, k: Tensor, v: Tensor, slot: Tensor, mask: Tensor, dropout_p: float) -> Tensor:
    """q, k, v (N, H, D) -> (N, H, D): one SDPA over a plan's (rows, H, length, D) padding, given its
    slot (N,) and mask (rows, 1, length or 1, length) (`PaddedBatch`; the sizes are read from the mask's
    shape)."""
    rows, length = mask.shape[0], mask.shape[-1]
    h = q.shape[1]

    def dense(t: Tensor) -> Tensor:  # (N, H, D) -> (rows, H, length, D), padding slots 0
        padded = t.new_zeros(rows * length, h, t.shape[2]).index_copy_(0, slot, t)
        return padded.view(rows, length, h, t.shape[2]).transpose(1, 2)

    out = F.scaled_dot_product_attention(dense(q), dense(k), dense(v), attn_mask=mask, dropout_p=dropout_p)
    return out.transpose(1, 2).reshape(rows * length, h, v.shape[2]).index_select(0, slot)  # (N, H, Dv)


__all__ = [
    "PACK_LENGTHS",
    "PACK_MAX_COST_RATIO",
    "PACK_ROW_SCORES",
    "PADDED_MAX_WASTE",
    "PaddedBatch",
    "graph_sizes",
    "pack",
    "padded_attention",
    "plan_padding",
    "rows_cost",
]
