"""The torch sparse calls the csr kernels are made of, with their CPU quirks handled.

crow, col: a CSR pattern (int32 or int64); values: (nnz,) in the pattern's slot order.
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import memory

# Rows of one `_bag_in_chunks` call, in bytes of result. A 50K-node random graph's 102 MB result
# (1 / 2 threads) took 131 / 79 ms in 1 MiB chunks, 127 / 73 in 4 MiB, 128 / 80 in 8 MiB, 179 / 102
# in one call; a 65K-token window's 134 MB result 59 ms in 1 MiB chunks, 66 in 8 MiB, 135 in one
BAG_CHUNK_BYTES = 4 << 20


def sparse_csr(crow: Tensor, col: Tensor, values: Tensor, shape: Tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def sddmm(crow: Tensor, col: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0, out: Optional[Tensor] = None) -> Tensor:
    """values[slot] = alpha * <a[row], b[col]> for a: (R, D), b: (C, D). Returns (nnz,), written into
    out when given, which must hold zeros: sampled_addmm reads it even at beta=0 (NaN * 0 = NaN)."""
    nnz, d = col.numel(), a.shape[1]
    if nnz > a.shape[0] * b.shape[0]:  # sampled_addmm fails when nnz > numel (many duplicates): pad columns
        b = torch.cat([b, b.new_zeros(-(-nnz // a.shape[0]) - b.shape[0], d)])
    pattern = sparse_csr(crow, col, memory.zeros(nnz, a) if out is None else out, (a.shape[0], b.shape[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # in place (out=pattern): no copy of the pattern's indices; beta=0 still reads the zeros
        return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0, alpha=alpha, out=pattern).values()


def spmm(
    crow: Tensor,
    col: Tensor,
    values: Tensor,
    x: Tensor,
    shape: Tuple[int, int],
    alpha: float = 1.0,
    out: Optional[Tensor] = None,
) -> Tensor:
    """out[r] = alpha * sum_{slots of row r} values[slot] x[col] for x: (C, D) contiguous. Returns
    (R, D), written into out when given (it may be strided: a view of one head's rows).

    float32 on the CPU runs as a weighted-sum embedding_bag (bags = rows, per-sample weights =
    values), which takes FBGEMM's prefetching gather kernel: measured 2-4x faster than the CSR
    addmm (MKL) on a 50K-node random graph, 1.3x on a window graph. float64 stays on addmm (the
    bag is slower there), as do other devices."""
    if _bag_serves(x, values, crow, col):
        weights = values if alpha == 1.0 else torch.mul(values, alpha, out=memory.empty(values.shape, values))
        if memory.on_huge_pages(shape[0] * x.shape[1] * x.element_size(), x):
            return _bag_in_chunks(
                crow, col, weights, x, memory.empty((shape[0], x.shape[1]), x) if out is None else out
            )
        r = _bag(crow, col, weights, x)
        return r if out is None else out.copy_(r)
    mat = sparse_csr(crow, col, values, shape)
    out = memory.empty((shape[0], x.shape[1]), x) if out is None else out
    return torch.addmm(out, mat, x, beta=0.0, alpha=alpha, out=out)  # beta=0: out is never read


def _bag(crow: Tensor, col: Tensor, weights: Tensor, x: Tensor) -> Tensor:
    """embedding_bag's weighted sum, bags = rows of the pattern."""
    # detached: saved inputs still require grad, which would send the bag to its autograd variant
    return F.embedding_bag(
        col, x.detach(), crow, mode="sum", per_sample_weights=weights.detach(), include_last_offset=True
    )


def _bag_in_chunks(crow: Tensor, col: Tensor, weights: Tensor, x: Tensor, out: Tensor) -> Tensor:
    """`_bag` into out (R, D), BAG_CHUNK_BYTES of rows at a time: each chunk's result comes from
    the heap glibc reuses and is copied from cache into out, a huge-page buffer (`memory`), where one
    call's fresh (R, D) result would fault in 4 KiB at a time (a 134 MB result: 135 -> 59 ms)."""
    rows = max(1, BAG_CHUNK_BYTES // (x.shape[1] * x.element_size()))
    bounds = [*range(0, out.shape[0], rows), out.shape[0]]
    slots = crow[bounds].tolist()  # each chunk's first and last slot
    for a, b, lo, hi in zip(bounds, bounds[1:], slots, slots[1:]):
        out[a:b] = _bag(crow[a : b + 1] - lo, col[lo:hi], weights[lo:hi], x)
    return out


def _bag_serves(x: Tensor, values: Tensor, crow: Tensor, col: Tensor) -> bool:
    """Whether `spmm` takes the embedding_bag path (where it was measured faster)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and values.dtype == x.dtype
        and x.is_contiguous()
        and x.shape[0] > 0
        and crow.dtype == col.dtype  # the bag takes offsets of its indices' type
    )


def take(x: Tensor, index: Tensor) -> Tensor:
    """x[index] for 1-D x: index_select is several times faster than advanced indexing on CPU."""
    return torch.index_select(x, 0, index)


def exp_shifted_(scores: Tensor, offsets: Tensor, row: Tensor) -> Tensor:
    """The numerators of an exact softmax per row, in place: scores (nnz,) -> exp(scores - m[row])
    with m (rows,) each row's max (0 for a row whose scores are all -inf, so its weights are 0);
    offsets (rows + 1,) int64 row pointers, row (nnz,) the row of each slot. (Skipping the shift
    when no exp can overflow was measured ~5% faster on a random graph's forward, but made float32
    gradients up to 10x less accurate on rows of many duplicate edges: the shift stays.)"""
    m = torch.segment_reduce(scores, "max", offsets=offsets)
    m.masked_fill_(torch.isneginf(m), 0.0)
    return scores.sub_(take(m, row)).exp_()
