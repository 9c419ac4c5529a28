"""Sorting and compressing a graph's edges: the CSR structure every sparse kernel reads.

`compress` is the one implementation. Eager code (`Graph.csr`, `Graph.csc`) calls it directly and
caches the result; compiled and exported code calls it through the custom op
`sparseattn::compress`, whose output shapes follow from its inputs' ((num_rows + 1,), (E,), (E,))
and whose kernel also checks the ids, since a graph built inside a trace is not validated at
construction (that would read the tensor's values).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .._checks import check_node_ids

_CHUNK = 1 << 20  # edges per pass of the sortedness check: its temporaries stay small and reused


class CSR(NamedTuple):
    """Compressed rows of a graph. For the destination-major CSR (`Graph.csr`):
    ptr: (N_dst + 1,) row pointers; idx: (E,) source of each sorted edge;
    perm: (E,) position of each sorted edge in the caller's edge order.
    For the transposed CSR (`Graph.csc`) rows are sources and idx holds destinations."""

    ptr: Tensor
    idx: Tensor
    perm: Tensor


def destination_major(src: Tensor, dst: Tensor, num_src: int, num_dst: int) -> Tuple[bool, bool]:
    """(sorted, unique): whether the edges come ordered by (destination, source), and whether they
    are then also free of duplicates: from the least step of the key dst * N_src + src, or, where
    that key would overflow int64 (node counts whose product reaches 2**63), from the steps of each
    id. In chunks, so an 8M-edge index allocates no 64 MiB temporaries (each a page-faulting mmap
    on CPU)."""
    width, least, unique = max(num_src, 1), 1, True
    for start in range(0, src.numel() - 1, _CHUNK):
        end = min(start + _CHUNK + 1, src.numel())  # one edge of overlap with the next chunk
        if max(num_dst, 1) * width < 2**63:
            least = min(least, int((dst[start:end] * width + src[start:end]).diff().min()))
            continue
        d_step, s_step = dst[start:end].diff(), src[start:end].diff()
        same_dst = d_step == 0
        if bool((d_step < 0).any()) or bool((same_dst & (s_step < 0)).any()):
            return False, False
        unique = unique and not bool((same_dst & (s_step == 0)).any())
    return least >= 0, least > 0 and unique


def row_pointers(rows: Tensor, num_rows: int) -> Tensor:
    """(num_rows + 1,) int64 offsets of each row's edges once sorted by row."""
    ptr = torch.zeros(num_rows + 1, dtype=torch.long, device=rows.device)
    ptr[1:] = torch.cumsum(id_counts(rows, num_rows), 0)
    return ptr


def id_counts(ids: Tensor, num_ids: int) -> Tensor:
    """(num_ids,) int64 occurrences of each id in [0, num_ids) in ids (all in range): torch.bincount on
    the CPU (2.4x faster than a scatter-add at 2^24 ids), `counts_without_sync` elsewhere."""
    if reading_stalls(ids.device):
        return counts_without_sync(ids, num_ids)
    return torch.bincount(ids, minlength=num_ids) if ids.numel() else torch.zeros(num_ids, dtype=torch.long)


def sorted_id_counts(ids: Tensor, min_count: int = 0) -> Optional[Tensor]:
    """(B,) occurrences of each id 0 .. B - 1 in a non-empty 1-D integer `ids` held in non-decreasing
    order from an id >= 0 (a PyG batch vector), B = max(ids[-1] + 1, min_count); None if ids[0] < 0
    or they are not sorted. One host read for the checks and B (each read waits for a GPU's queued
    work), then `id_counts`."""
    first, unsorted, last = torch.stack([ids[0], (ids.diff() < 0).any().to(ids.dtype), ids[-1]]).tolist()
    if first < 0 or unsorted:
        return None
    return id_counts(ids, max(last + 1, min_count))


def reading_stalls(device: torch.device) -> bool:
    """Whether reading a tensor's value back to the host waits for the device's queued work (every
    device but the CPU): code that runs in a training step avoids such reads there."""
    return device.type != "cpu"


def counts_without_sync(rows: Tensor, num_rows: int) -> Tensor:
    """(num_rows,) int64 number of times each id in [0, num_rows) occurs in rows, by a scatter-add: what
    `torch.bincount(rows, minlength=num_rows)` gives, without its host read (CUDA's bincount reads the
    ids' maximum back to size its output, a synchronisation that a step captured in a CUDA graph
    cannot make). Integer sums: the same counts in any order of the adds."""
    return torch.zeros(num_rows, dtype=torch.long, device=rows.device).index_add_(
        0, rows, torch.ones(rows.shape[0], dtype=torch.long, device=rows.device)
    )


def _sort_key(rows: Tensor, cols: Tensor, num_rows: int, num_cols: int, cols_sorted: bool) -> Optional[Tensor]:
    """A key whose stable sort orders edges by (row, col): the rows alone when the edges already
    come sorted by col, and int32 when it fits (torch sorts integers by radix: fewer bytes, fewer
    passes; ~3x faster than the int64 (row, col) key on a 140K-edge window graph). None when the
    combined key would overflow int64 (node counts whose product reaches 2**63)."""
    if cols_sorted:
        key, top = rows, num_rows
    elif num_rows * max(num_cols, 1) < 2**63:
        key, top = rows * max(num_cols, 1) + cols, num_rows * max(num_cols, 1)
    else:
        return None
    return key.int() if top < 2**31 else key


def compress(
    rows: Tensor,
    cols: Tensor,
    num_rows: int,
    num_cols: int,
    presorted: bool,
    ptr: Optional[Tensor] = None,
    cols_sorted: bool = False,
) -> CSR:
    """Sort edges by (row, col) and compress rows. Returns ptr (num_rows + 1,), idx, perm.
    presorted: the edges already come sorted by (row, col) (idx is then a copy of cols: a view into
    the graph's edge_index would reach compiled code as an aliased input, whose base size inductor
    fails to bind in a dynamic-shape backward: "expected [s18] to have been codegen-ed");
    cols_sorted: they come sorted by (col, row), so sorting by row alone suffices; ptr: the row
    pointers when already known."""
    if presorted:
        perm = torch.arange(rows.numel(), device=rows.device)
        idx = cols.clone()
    else:
        key = _sort_key(rows, cols, num_rows, num_cols, cols_sorted)
        if key is None:  # by col, then stably by row
            perm = torch.argsort(cols, stable=True)
            perm = perm.index_select(0, torch.argsort(rows.index_select(0, perm), stable=True))
        else:
            perm = torch.argsort(key, stable=True)
        idx = cols.index_select(0, perm)
    return CSR(row_pointers(rows, num_rows) if ptr is None else ptr, idx, perm)


@torch.library.custom_op("sparseattn::compress", mutates_args=())
def compress_op(
    rows: Tensor, cols: Tensor, num_rows: int, num_cols: int, transposed: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    """`compress` for traced code: checks the ids first (IndexError naming the edge_index row) and
    takes the no-sort path when the edges come sorted. rows, cols: (E,) int64. transposed: rows
    are the sources (the CSC), else the destinations. Returns ptr (num_rows + 1,), idx, perm (E,)."""
    row_name, col_name = ("edge_index[0] (sources)", "edge_index[1] (destinations)")[:: 1 if transposed else -1]
    check_node_ids(rows, num_rows, row_name)
    check_node_ids(cols, num_cols, col_name)
    sorted_by_rows = destination_major(cols, rows, num_cols, num_rows)[0]
    csr = compress(rows, cols, num_rows, num_cols, sorted_by_rows)
    return csr.ptr, csr.idx, csr.perm


@compress_op.register_fake
def _(rows, cols, num_rows, num_cols, transposed):
    return rows.new_empty(num_rows + 1), rows.new_empty(rows.shape[0]), rows.new_empty(rows.shape[0])


__all__ = [
    "CSR",
    "compress",
    "compress_op",
    "counts_without_sync",
    "destination_major",
    "reading_stalls",
    "id_counts",
    "row_pointers",
    "sorted_id_counts",
]
