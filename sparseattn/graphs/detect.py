"""Recognizing dense blocks in a raw edge index, so that a (2, E) tensor listing a Transformer
batch destination-major (as the builders do) can take the dense backend like a built `Graph`."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .block import Block

MIN_ROWS_PER_BLOCK = 4  # fewer destinations per block on average: not worth a dense batch (None)


def find_blocks(src: Tensor, ptr: Tensor) -> Optional[Tuple[Block, ...]]:
    """The "full" and "causal" blocks that the edges decompose into, or None.

    src: (E,) sources of edges sorted by (destination, source) with no duplicates; ptr:
    (N_dst + 1,) row pointers. Each destination with edges must see one contiguous source range
    [lo, hi]; runs of consecutive destinations with equal ranges are "full" blocks, runs starting
    at lo == hi whose hi grows by one per destination are "causal" blocks. O(E + N_dst) tensor work
    plus a Python loop over the blocks."""
    deg = ptr.diff()
    rows = torch.nonzero(deg).squeeze(1)  # (R,) destinations with edges
    if rows.numel() == 0:
        return None
    lo, hi = src[ptr[rows]], src[ptr[rows + 1] - 1]  # (R,)
    if not bool((hi - lo + 1 == deg[rows]).all()):
        return None
    same = (rows[1:] == rows[:-1] + 1) & (lo[1:] == lo[:-1])  # (R - 1,) next destination, same lo
    equal, step = same & (hi[1:] == hi[:-1]), same & (hi[1:] == hi[:-1] + 1)
    starts = torch.cat([rows.new_zeros(1), torch.nonzero(~(equal | step)).squeeze(1) + 1])  # (S,) first row of each run
    if starts.numel() * MIN_ROWS_PER_BLOCK > rows.numel():
        return None
    run = torch.zeros(rows.numel(), dtype=torch.long, device=rows.device)
    run[starts[1:]] = 1
    run = run.cumsum(0)[1:]  # (R - 1,) run of each transition's second row
    n_equal = torch.zeros(starts.numel(), dtype=torch.long, device=rows.device).index_add_(0, run, equal.long())
    n_step = torch.zeros_like(n_equal).index_add_(0, run, step.long())
    ends = torch.cat([starts[1:], starts.new_tensor([rows.numel()])])
    blocks = []
    for s, e, ne, ns, r0, l0, h0, p0 in zip(
        *(t.tolist() for t in (starts, ends, n_equal, n_step, rows[starts], lo[starts], hi[starts], ptr[rows[starts]]))
    ):
        if ns == 0:
            blocks.append(Block("full", l0, r0, h0 - l0 + 1, e - s, p0))
        elif ne == 0 and l0 == h0:
            blocks.append(Block("causal", l0, r0, e - s, e - s, p0))
        else:
            return None
    return tuple(blocks)


__all__ = ["find_blocks", "MIN_ROWS_PER_BLOCK"]
