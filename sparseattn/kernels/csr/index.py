"""The index tensors the csr kernels read, per layout, built from the graph's CSR and CSC.

Head-major (`HeadMajorIndex`): the graph's own CSR and CSC, shared by the heads: E-sized, built
from `Graph.csr()`/`Graph.csc()` by plain tensor ops (a gather, a scatter, a repeat_interleave of
known output size), so traced code builds it like eager code does.

Interleaved (`InterleavedIndex`): the CSR of the (N_dst * H, N_src * H) head-interleaved pattern,
whose head row t * H + h holds columns s * H + h for the edges s -> t, and its companions, each
H * E entries: built by the custom ops below, whose output shapes follow from their inputs'
((rows * H + 1,), (H * E,)), since filling them walks runs of rows of equal degree (windows and
batches of blocks have a few; a broadcast fills each) or chunks of slots, choices made from the
data inside the op. Eager code builds each part on first use (a clamp-mode forward never reads
`row`, inference never the transposed half) and caches it on the graph (`Graph.cached`). Index
tensors are int32 when the values fit (less traffic); traced code asks for int64, so that no
guard on the sizes enters the compiled graph.
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..._tracing import traceable_op, tracing
from ...graphs import Graph
from .primitives import take

_SLOTS_PER_PASS = 1 << 20  # index entries built per chunk: 4 MiB temporaries that the allocator reuses
_MAX_RUNS = 64  # above this many runs of equal degree, the chunked slot walk is faster
# Up to this many slots, one scatter maps every slot to its edge and head: a handful of ops, where the
# runs and the chunked walk cost a few ops per run or chunk and host syncs (batches of small graphs)
_SMALL_SLOTS = 1 << 16


def _itype(int32: bool) -> torch.dtype:
    return torch.int32 if int32 else torch.long


def fits_int32(graph: Graph, heads: int = 1) -> bool:
    """Whether every index value of this graph (slots, node and edge ids, times `heads`) fits int32;
    False inside a trace, whose sizes are symbolic."""
    return not tracing() and (max(graph.num_edges, graph.num_src, graph.num_dst) + 1) * heads < 2**31 - 1


# ---- edge orders both layouts share ----------------------------------------------------------------
def sorted_positions(graph: Graph) -> Optional[Tensor]:
    """(E,) int64 position of each caller edge in the destination-sorted order (`Graph.csr`), or
    None when the caller's edges are already sorted. Cached on the graph."""
    if graph.is_sorted_by_dst:
        return None

    def build() -> Tensor:
        perm = graph.csr().perm
        return torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))

    return graph.cached("csr_sorted_positions", build)


def transposed_sorted_positions(graph: Graph) -> Tensor:
    """(E,) int64 destination-sorted position of each edge of the transposed order (`Graph.csc`)."""
    pos, caller = sorted_positions(graph), graph.csc().perm
    return caller if pos is None else take(pos, caller)


# ---- head-major --------------------------------------------------------------------------------------
class HeadMajorIndex(NamedTuple):
    """crow, col: the destination-sorted CSR (int32 when it fits); offsets: crow as int64 (segment
    reductions); row: (E,) destination of each sorted edge; ccrow, ccol, to_csc: the transposed
    (source-sorted) CSR and the sorted position of each of its edges; from_caller: (E,) caller
    position of each sorted edge, and to_caller its inverse, both None when the caller's edges are
    sorted."""

    crow: Tensor
    col: Tensor
    offsets: Tensor
    row: Tensor
    ccrow: Tensor
    ccol: Tensor
    to_csc: Tensor
    from_caller: Optional[Tensor]
    to_caller: Optional[Tensor]


def head_major_index(graph: Graph) -> HeadMajorIndex:
    """The head-major index of `graph`, cached on it (built anew, uncached, inside a trace)."""

    def build() -> HeadMajorIndex:
        csr, csc = graph.csr(), graph.csc()
        it = _itype(fits_int32(graph))
        row = torch.repeat_interleave(
            torch.arange(graph.num_dst, dtype=it, device=graph.device), csr.ptr.diff(), output_size=graph.num_edges
        )
        return HeadMajorIndex(
            csr.ptr.to(it),
            csr.idx.to(it),
            csr.ptr,
            row,
            csc.ptr.to(it),
            csc.idx.to(it),
            transposed_sorted_positions(graph).to(it),
            None if graph.is_sorted_by_dst else csr.perm,
            sorted_positions(graph),
        )

    return graph.cached("csr_head_major", build)


# ---- interleaved: how the slots are filled -----------------------------------------------------------
def _head_crow(ptr: Tensor, heads: int) -> Tensor:
    """Row pointers (rows * H + 1,) int64 of the head-interleaved CSR of one pattern with row
    pointers ptr (rows + 1,): head row t * H + h holds the sorted edges ptr[t] .. ptr[t + 1] of row t."""
    deg = ptr.diff().repeat_interleave(heads)  # (rows * H,) head-row lengths
    crow = torch.zeros(deg.numel() + 1, dtype=torch.long, device=ptr.device)
    torch.cumsum(deg, 0, out=crow[1:])
    return crow


def _head_slots(
    ptr: Tensor, crow: Tensor, heads: int, itype: torch.dtype, row_out: Optional[Tensor] = None
) -> Iterator[Tuple[int, int, Tensor, Tensor]]:
    """The slots of the head-interleaved CSR (ptr, crow as `_head_crow` made them) in chunks of whole
    head rows, about _SLOTS_PER_PASS each: yields (s0, s1, e, head) with e (s1 - s0,) the sorted edge
    of each slot and head its head, in `itype`. The head row of each slot is written into row_out
    (H * E,) when given. Chunks keep an index of H * E entries at a cumsum and three gathers, with
    no temporary of that size (above 32 MiB each would page-fault)."""
    device, nnz, num_head_rows = ptr.device, int(crow[-1]), crow.numel() - 1
    shift = (ptr[:-1].repeat_interleave(heads) - crow[:-1]).to(itype)  # (rows * H,) sorted edge = slot + shift[row]
    head_of = torch.arange(heads, dtype=itype, device=device).repeat(num_head_rows // max(heads, 1))
    targets = torch.arange(0, nnz, _SLOTS_PER_PASS, device=device)
    cuts = sorted(set(torch.searchsorted(crow, targets).tolist()) | {num_head_rows})
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        s0, s1 = int(crow[r0]), int(crow[r1])
        if s0 == s1:
            continue
        # head row of each slot = repeat_interleave(arange, deg), ~3x faster: +1 at each later head row's start
        starts = torch.zeros(s1 - s0 + 1, dtype=itype, device=device)
        starts.index_add_(0, crow[r0 + 1 : r1] - s0, torch.ones(1, dtype=itype, device=device).expand(r1 - r0 - 1))
        row = torch.cumsum(starts[:-1], 0, dtype=itype, out=None if row_out is None else row_out[s0:s1]).add_(r0)
        e = take(shift, row).add_(torch.arange(s0, s1, dtype=itype, device=device))
        yield s0, s1, e, take(head_of, row)  # a gather beats row % H


def _all_slots(ptr: Tensor, heads: int, itype: torch.dtype, nnz: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Every slot of the head-interleaved CSR of row pointers ptr at once: (e, head, row), each
    (H * E,) in itype, the sorted edge, head and head row of each slot. Sorted edge e into row t,
    head h, has slot H * ptr[t] + h * deg[t] + e - ptr[t] (`_head_slots_of`); one scatter inverts it.
    nnz: E (= ptr[-1], passed from a shape so that nothing is read back from the device)."""
    device = ptr.device
    deg = ptr.diff()
    row = torch.repeat_interleave(torch.arange(deg.numel(), device=device), deg, output_size=nnz)  # (E,)
    heads_ = torch.arange(heads, device=device)
    slot = (
        take(ptr, row).mul_(heads - 1).add_(torch.arange(nnz, device=device))[:, None]
        + take(deg, row)[:, None] * heads_
    )
    pair = torch.empty(nnz * heads, dtype=itype, device=device)  # (H * E,) e * H + h of each slot
    pair.scatter_(0, slot.view(-1), torch.arange(nnz * heads, dtype=itype, device=device))
    e = torch.div(pair, heads, rounding_mode="floor")
    head = pair.sub_(e * heads)
    return e, head, take(row.to(itype), e).mul_(heads).add_(head)


def _degree_runs(ptr: Tensor) -> Optional[List[Tuple[int, int, int]]]:
    """Maximal runs (r0, r1, degree) of consecutive rows with equal, nonzero degree, or None when
    there are more than _MAX_RUNS (random graphs). Window graphs have a few, batches of blocks one
    per block size."""
    deg = ptr.diff()
    if deg.numel() == 0:
        return []
    cuts = torch.nonzero(deg[1:] != deg[:-1]).view(-1) + 1
    if cuts.numel() >= _MAX_RUNS:
        return None
    bounds = [0, *cuts.tolist(), deg.numel()]
    degrees = deg[bounds[:-1]].tolist()
    return [(r0, r1, c) for r0, r1, c in zip(bounds[:-1], bounds[1:], degrees) if c > 0]


def _run_slots(x: Tensor, heads: int, e0: int, rows: int, degree: int) -> Tensor:
    """The slots of a run of `rows` rows of equal degree starting at sorted edge e0, as a
    (rows, H, degree) view of x (H * E,): head row r * H + h holds the row's edges in order."""
    return x[heads * e0 : heads * (e0 + rows * degree)].view(rows, heads, degree)


def _fill_slots(
    ptr: Tensor,
    crow: Tensor,
    heads: int,
    itype: torch.dtype,
    fills: List[Tuple[Tensor, Tensor, Optional[Tensor]]],
    num_edges: int,
    row_out: Optional[Tensor] = None,
) -> None:
    """For each (out, value, step) in fills, write out[slot] = value[e] + head * step[e] (step None:
    1) over the slots of the head-interleaved CSR of row pointers ptr (crow as `_head_crow` made
    it), e the sorted edge of each slot and head its head; out (H * E,), value and step (E,) in
    itype. row_out (H * E,), when given, gets the head row of each slot. Runs of rows of equal
    degree are filled by one broadcast each; otherwise by the chunked walk of `_head_slots`."""
    if num_edges * heads <= _SMALL_SLOTS:  # E from a shape: no read of crow[-1]
        e, head, row = _all_slots(ptr, heads, itype, num_edges)
        for out, value, step in fills:
            if step is None:
                torch.index_select(value, 0, e, out=out).add_(head)
            else:
                torch.index_select(step, 0, e, out=out).mul_(head).add_(take(value, e))
        if row_out is not None:
            row_out.copy_(row)
        return
    runs = _degree_runs(ptr)
    if runs is None:
        for s0, s1, e, head in _head_slots(ptr, crow, heads, itype, row_out=row_out):
            for out, value, step in fills:
                if step is None:
                    torch.index_select(value, 0, e, out=out[s0:s1]).add_(head)
                else:
                    torch.index_select(step, 0, e, out=out[s0:s1]).mul_(head).add_(take(value, e))
        return
    head_of = torch.arange(heads, dtype=itype, device=ptr.device).view(1, heads, 1)
    for r0, r1, c in runs:
        e0, n = int(ptr[r0]), r1 - r0
        edges = slice(e0, e0 + n * c)
        for out, value, step in fills:
            target = _run_slots(out, heads, e0, n, c)
            if step is None:
                torch.add(value[edges].view(n, 1, c), head_of, out=target)
            else:
                torch.mul(step[edges].view(n, 1, c), head_of, out=target).add_(value[edges].view(n, 1, c))
        if row_out is not None:
            head_rows = torch.arange(r0 * heads, r1 * heads, heads, dtype=itype, device=ptr.device).view(n, 1, 1)
            _run_slots(row_out, heads, e0, n, c).copy_((head_rows + head_of).expand(n, heads, c))


# ---- interleaved: the ops ------------------------------------------------------------------------------
@traceable_op("sparseattn::csr_interleaved_slots")
def interleaved_slots(ptr: Tensor, idx: Tensor, heads: int, int32: bool) -> Tuple[Tensor, Tensor]:
    """crow (N_dst * H + 1,) int64 and col (H * E,) (slot s of head row t * H + h: source * H + h)
    of the destination-sorted CSR ptr (N_dst + 1,), idx (E,)."""
    it = _itype(int32)
    crow = _head_crow(ptr, heads)
    col = torch.empty(idx.numel() * heads, dtype=it, device=idx.device)
    _fill_slots(ptr, crow, heads, it, [(col, idx.to(it) * heads, None)], idx.numel())  # idx.to: idx may be int64
    return crow, col


@interleaved_slots.register_fake
def _(ptr, idx, heads, int32):
    return ptr.new_empty((ptr.shape[0] - 1) * heads + 1), idx.new_empty(idx.shape[0] * heads, dtype=_itype(int32))


@traceable_op("sparseattn::csr_interleaved_rows")
def interleaved_rows(ptr: Tensor, idx: Tensor, heads: int, int32: bool) -> Tensor:
    """(H * E,) head row of each slot (idx only gives E)."""
    row = torch.empty(idx.numel() * heads, dtype=_itype(int32), device=idx.device)
    _fill_slots(ptr, _head_crow(ptr, heads), heads, _itype(int32), [], idx.numel(), row_out=row)
    return row


@interleaved_rows.register_fake
def _(ptr, idx, heads, int32):
    return idx.new_empty(idx.shape[0] * heads, dtype=_itype(int32))


@traceable_op("sparseattn::csr_interleaved_from_caller")
def interleaved_from_caller(ptr: Tensor, perm: Tensor, heads: int, int32: bool) -> Tensor:
    """(H * E,) position in a flattened caller-order (E, H) tensor of each slot; perm (E,) the caller
    position of each sorted edge."""
    it = _itype(int32)
    out = torch.empty(perm.numel() * heads, dtype=it, device=perm.device)
    _fill_slots(ptr, _head_crow(ptr, heads), heads, it, [(out, perm.to(it) * heads, None)], perm.numel())
    return out


@interleaved_from_caller.register_fake
def _(ptr, perm, heads, int32):
    return perm.new_empty(perm.shape[0] * heads, dtype=_itype(int32))


def _head_slots_of(ptr: Tensor, dst: Tensor, sorted_pos: Tensor, heads: int) -> Tuple[Tensor, Tensor]:
    """Where edges land in the head-interleaved pattern: for edges into destinations dst (E,) at
    destination-sorted positions sorted_pos (E,), the slot of head 0 and the step to the next head
    (the destination's degree): sorted edge e into t, head h, has slot H * ptr[t] + h * deg[t] + e - ptr[t]."""
    return take(ptr, dst).mul_(heads - 1).add_(sorted_pos), take(ptr.diff(), dst)


@traceable_op("sparseattn::csr_interleaved_to_caller")
def interleaved_to_caller(ptr: Tensor, dst: Tensor, sorted_pos: Tensor, heads: int, int32: bool) -> Tensor:
    """(E, H) slot of each caller edge and head; dst (E,) and sorted_pos (E,) per caller edge."""
    base, step = _head_slots_of(ptr, dst, sorted_pos, heads)
    return (base[:, None] + step[:, None] * torch.arange(heads, device=dst.device)).to(_itype(int32))


@interleaved_to_caller.register_fake
def _(ptr, dst, sorted_pos, heads, int32):
    return dst.new_empty(dst.shape[0], heads, dtype=_itype(int32))


@traceable_op("sparseattn::csr_interleaved_transposed")
def interleaved_transposed(
    ptr: Tensor, cptr: Tensor, cidx: Tensor, to_sorted: Tensor, heads: int, int32: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    """The transposed (N_src * H, N_dst * H) pattern: ccrow (N_src * H + 1,), ccol (H * E,) and
    to_csc (H * E,), the interleaved slot of each transposed slot. cptr, cidx: the source-sorted
    CSR; to_sorted (E,): destination-sorted position of each of its edges."""
    it = _itype(int32)
    ccrow = _head_crow(cptr, heads)  # transposed slots: head row s * H + hh
    base, step = (t.to(it) for t in _head_slots_of(ptr, cidx, to_sorted, heads))
    ccol, to_csc = (torch.empty(cidx.numel() * heads, dtype=it, device=cidx.device) for _ in range(2))
    _fill_slots(cptr, ccrow, heads, it, [(ccol, cidx.to(it) * heads, None), (to_csc, base, step)], cidx.numel())
    return ccrow.to(it), ccol, to_csc


@interleaved_transposed.register_fake
def _(ptr, cptr, cidx, to_sorted, heads, int32):
    it, nnz = _itype(int32), cidx.shape[0] * heads
    return (
        cptr.new_empty((cptr.shape[0] - 1) * heads + 1, dtype=it),
        cidx.new_empty(nnz, dtype=it),
        cidx.new_empty(nnz, dtype=it),
    )


class InterleavedIndex:
    """The interleaved index of one graph and head count H, each part built on first use through its
    op and cached on the graph: crow, col (the pattern) and offsets (crow as int64) at once; row
    (exact mode, returned weights, backward), from_caller (bias, dropout), to_caller (returned
    weights, the bias gradient), ccrow, ccol, to_csc (the backward of k and v)."""

    def __init__(self, graph: Graph, heads: int) -> None:
        self._graph, self.heads, self.int32 = graph, heads, fits_int32(graph, heads)
        # eager code on a small pattern maps every slot once (`_all_slots`): col, row and from_caller
        # are then a gather each, not a slot walk each (batches of small graphs: ~90 fewer ops)
        self._small = not tracing() and graph.num_edges * heads <= _SMALL_SLOTS
        csr = graph.csr()
        if self._small:
            e, head, _ = self._slot_map()
            self.offsets = _head_crow(csr.ptr, heads)
            col = take(csr.idx.to(_itype(self.int32)), e).mul_(heads).add_(head)
        else:
            self.offsets, col = interleaved_slots(csr.ptr, csr.idx, heads, self.int32)
        self.crow, self.col = self.offsets.to(_itype(self.int32)), col
        self.shape = (graph.num_dst * heads, graph.num_src * heads)

    def _lazy(self, name: str, build):
        return self._graph.cached(f"csr_pattern_h{self.heads}_{name}", build)

    def _slot_map(self) -> Tuple[Tensor, Tensor, Tensor]:
        """(sorted edge, head, head row) of every slot, (H * E,) each (`_all_slots`); small patterns only."""
        g, it = self._graph, _itype(self.int32)
        return self._lazy("slot_map", lambda: _all_slots(g.csr().ptr, self.heads, it, g.num_edges))

    @property
    def row(self) -> Tensor:
        if self._small:
            return self._slot_map()[2]
        csr = self._graph.csr()
        return self._lazy("row", lambda: interleaved_rows(csr.ptr, csr.idx, self.heads, self.int32))

    @property
    def from_caller(self) -> Tensor:
        g = self._graph

        def build() -> Tensor:
            if not self._small:
                return interleaved_from_caller(g.csr().ptr, g.csr().perm, self.heads, self.int32)
            e, head, _ = self._slot_map()
            return take(g.csr().perm.to(_itype(self.int32)), e).mul_(self.heads).add_(head)

        return self._lazy("from_caller", build)

    @property
    def to_caller(self) -> Tensor:
        def build() -> Tensor:
            g = self._graph
            pos = sorted_positions(g)
            pos = torch.arange(g.num_edges, device=g.device) if pos is None else pos
            return interleaved_to_caller(g.csr().ptr, g.dst, pos, self.heads, self.int32)

        return self._lazy("to_caller", build)

    def kv_col(self, kv_heads: int) -> Tensor:
        """`col` for keys and values of kv_heads = H / G heads (grouped-query attention): slot
        (t * H + h, s * H + h) reads kv row s * H_kv + h // G, so each row of the pattern keeps its
        slots and only the columns change (H * E entries, cached per kv_heads)."""
        heads, groups = self.heads, self.heads // kv_heads

        def build() -> Tensor:
            src, head = torch.div(self.col, heads, rounding_mode="floor"), torch.remainder(self.col, heads)
            return src.mul_(kv_heads).add_(torch.div(head, groups, rounding_mode="floor"))

        return self._lazy(f"col_kv{kv_heads}", build)

    def transposed(self) -> Tuple[Tensor, Tensor, Tensor]:
        def build() -> Tuple[Tensor, Tensor, Tensor]:
            g = self._graph
            csc = g.csc()
            return interleaved_transposed(
                g.csr().ptr, csc.ptr, csc.idx, transposed_sorted_positions(g), self.heads, self.int32
            )

        return self._lazy("transposed", build)


def interleaved_index(graph: Graph, heads: int) -> InterleavedIndex:
    return graph.cached(f"csr_pattern_h{heads}", lambda: InterleavedIndex(graph, heads))


__all__ = ["HeadMajorIndex", "InterleavedIndex", "head_major_index", "interleaved_index", "fits_int32"]
