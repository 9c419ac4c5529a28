"""The "csr" backend: SDDMM scores and CSR SpMM aggregation over the destination-sorted pattern.

All heads run in one sparse call. Rows of q (N_dst, H, D) viewed as (N_dst * H, D) are
"head rows" t * H + h, so the H per-head patterns interleave into one (N_dst * H, N_src * H)
CSR matrix whose head row t * H + h holds columns s * H + h for the edges s -> t; q, k, v and
every output are then plain views, with no transposes. Edge values live in that matrix's
"slot" order (H * E,): destination, then head, then source. Forward:
    score = scale * SDDMM(q, k) (+ bias)        torch.sparse.sampled_addmm
    w     = exp(clamp(score)) or exp(score - per-head-row max)
    z     = segment sum of w                      (N_dst * H,)
    out   = SpMM(w * dropout_mask, v) / z         (N_dst, H, Dv)   addmm, or embedding_bag (CPU float32)
The backward is written by hand from the same primitives (sampled_addmm's own backward builds a
dense N x N gradient): with p_e = w_e / z[t] the normalized weight of edge e = (s, t),
    a_e  = mask_e <grad_out[t], v[s]>  (+ the returned weights' own gradient, if any)
    ds_e = p_e (a_e - sum_{e' -> t} p_e' a_e') (* [lo <= score_e <= hi] in clamp mode);  dbias = ds
    dq = scale * SpMM(ds, k),  dk = scale * SpMM(ds^T, q),  dv = SpMM((p * mask)^T, grad_out)
(the segment sum equals <grad_out[t], out[t]>, at (E * H) rather than (N * H * Dv) cost), where
^T is the cached transposed (source-sorted) pattern. Nothing of shape (E, H, D) is
allocated: extra memory is O(E * H + N * H * D). Under create_graph=True (double backward, e.g. a
gradient penalty) backward instead recomputes through the reference (`reference_backward`), whose
gradients torch can differentiate again. torch's CPU sparse kernels have no half types, so
float16/bfloat16 inputs run in float32 (as the reference accumulates) and are cast back.
Degenerate inputs (E = 0, or H, D, Dv = 0) go to the reference backend.

On graphs whose edges read sources from far apart (random graphs), the interleaved reads miss the
cache and the heads run one after another instead, with the same formulas (csr_head_major.py);
`CSRAttention` picks the layout per graph.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from ..graphs import Graph
from .csr_head_major import (
    HeadMajorPattern,
    head_major_backward,
    head_major_forward,
    head_major_pattern,
    prefers_head_major,
)
from .reference import accumulation_dtype, reference_on_empty, twice_differentiable_backward
from .sparse_calls import exp_shifted_, sddmm, sorted_positions, spmm, take, transposed_sorted_positions

LAYOUTS = (None, "interleaved", "head-major")
_SLOTS_PER_PASS = 1 << 20  # index entries built per chunk: 4 MiB temporaries that the allocator reuses


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


_MAX_RUNS = 64  # above this many runs of equal degree, the chunked slot walk is faster


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
    row_out: Optional[Tensor] = None,
) -> None:
    """For each (out, value, step) in fills, write out[slot] = value[e] + head * step[e] (step None:
    1) over the slots of the head-interleaved CSR of row pointers ptr (crow as `_head_crow` made
    it), e the sorted edge of each slot and head its head; out (H * E,), value and step (E,) in
    itype. row_out (H * E,), when given, gets the head row of each slot. Runs of rows of equal
    degree are filled by one broadcast each; otherwise by the chunked walk of `_head_slots`."""
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


class _Pattern:
    """Index tensors for one graph and head count H, cached on the graph.

    Built at once (forward): crow, col: CSR of the (N_dst * H, N_src * H) head-interleaved pattern;
    offsets: crow as int64 (segment reductions). Built on first use: row: (H * E,) head row of each
    slot (exact mode, returned weights, the backward: a clamp-mode forward never reads it, so
    inference keeps two H * E arrays instead of three); from_caller (bias, dropout): (H * E,)
    position in a flattened caller-order (E, H) tensor of each slot; ccrow, ccol, to_csc (backward):
    the transposed (N_src * H, N_dst * H) pattern and the CSR slot of each transposed slot;
    to_caller (returned weights, the bias gradient): (E, H) slot of each caller edge and head. Index
    tensors are int32 when they fit (less traffic). Where rows come in a few runs of equal degree
    (windows, batches of blocks), each run's slots are a (rows, H, degree) view filled by one
    broadcast; otherwise a chunked walk over the slots takes a few passes over H * E entries (on a
    window graph the forward half would cost about a third of a forward, the transposed half as much
    again).
    """

    def __init__(self, graph: Graph, heads: int) -> None:
        csr, h = graph.csr(), heads
        fits = (max(graph.num_edges, graph.num_src, graph.num_dst) + 1) * h < 2**31 - 1
        it = self.itype = torch.int32 if fits else torch.long
        crow = _head_crow(csr.ptr, h)
        nnz = int(crow[-1])
        self.col = torch.empty(nnz, dtype=it, device=csr.ptr.device)
        src_h = csr.idx.to(it).mul_(h)
        _fill_slots(csr.ptr, crow, h, it, [(self.col, src_h, None)])
        self.offsets, self.crow, self.heads, self._graph = crow, crow.to(it), h, graph
        self.shape = (graph.num_dst * h, graph.num_src * h)

    @property
    def row(self) -> Tensor:
        def build() -> Tensor:
            row = torch.empty_like(self.col)
            _fill_slots(self._graph.csr().ptr, self.offsets, self.heads, self.itype, [], row_out=row)
            return row

        return self._lazy("row", build)

    def _lazy(self, name: str, build):
        """build() once, cached on the graph beside this pattern (`Graph.cached`)."""
        return self._graph.cached(f"csr_pattern_h{self.heads}_{name}", build)

    @property
    def from_caller(self) -> Tensor:
        def build() -> Tensor:
            g, h, it = self._graph, self.heads, self.itype
            caller_h = (g.csr().perm if not g.is_sorted_by_dst else torch.arange(g.num_edges, device=g.device)).to(it)
            caller_h.mul_(h)
            out = torch.empty_like(self.col)
            _fill_slots(g.csr().ptr, self.offsets, h, it, [(out, caller_h, None)])
            return out

        return self._lazy("from_caller", build)

    def _transposed(self) -> Tuple[Tensor, Tensor, Tensor]:
        def build() -> Tuple[Tensor, Tensor, Tensor]:
            g, h, it = self._graph, self.heads, self.itype
            csr, csc = g.csr(), g.csc()
            ccrow = _head_crow(csc.ptr, h)  # transposed slots: head row s * H + hh
            # sorted edge es into destination t, head hh has slot H * ptr[t] + hh * deg[t] + es - ptr[t];
            # per transposed edge (E,): its destination is csc.idx, its sorted position csc.perm mapped
            base = take(csr.ptr, csc.idx).mul_(h - 1).add_(transposed_sorted_positions(g)).to(it)  # head-0 slot
            step = take(csr.ptr.diff(), csc.idx).to(it)  # deg[t]
            dst_h = csc.idx.to(it).mul_(h)
            ccol, to_csc = torch.empty_like(self.col), torch.empty_like(self.col)
            _fill_slots(csc.ptr, ccrow, h, it, [(ccol, dst_h, None), (to_csc, base, step)])
            return ccrow.to(it), ccol, to_csc

        return self._lazy("transposed", build)

    @property
    def to_caller(self) -> Tensor:
        def build() -> Tensor:
            g, h = self._graph, self.heads
            pos = sorted_positions(g)
            sorted_pos = torch.arange(g.num_edges, device=g.device) if pos is None else pos
            dst = g.dst
            base = take(g.csr().ptr, dst).mul_(h - 1).add_(sorted_pos)  # (E,) head-0 slot of each caller edge
            step = take(g.csr().ptr.diff(), dst)
            return (base[:, None] + step[:, None] * torch.arange(h, device=g.device)).to(self.itype)  # (E, H)

        return self._lazy("to_caller", build)

    ccrow = property(lambda self: self._transposed()[0])
    ccol = property(lambda self: self._transposed()[1])
    to_csc = property(lambda self: self._transposed()[2])


def _pattern(graph: Graph, heads: int) -> _Pattern:
    return graph.cached(f"csr_pattern_h{heads}", lambda: _Pattern(graph, heads))


def _segment(values: Tensor, pat: _Pattern, reduce: str) -> Tensor:
    """Per-head-row sum or max of slot values (H * E,) -> (N_dst * H,); empty rows give 0 / -inf."""
    return torch.segment_reduce(values, reduce, offsets=pat.offsets)


def _to_slots(x: Optional[Tensor], pat: _Pattern) -> Optional[Tensor]:
    """(E, H) in caller order -> (H * E,) in slot order."""
    if x is None:
        return None
    x = x.reshape(-1)
    return x.contiguous() if pat.from_caller is None else take(x, pat.from_caller)


def _to_caller(x: Tensor, pat: _Pattern, heads: int) -> Tensor:
    """(H * E,) in slot order -> (E, H) in caller order."""
    return x.view(-1, heads) if pat.to_caller is None else take(x, pat.to_caller.view(-1)).view(-1, heads)


# what the kernels read of a pattern: a _Pattern, or csr_ops' _Index rebuilt from custom-op arguments
PatternLike = Any


def _csr_forward(
    q2: Tensor,
    k2: Tensor,
    v2: Tensor,
    pat: PatternLike,
    scale: float,
    clamp: Optional[Tuple[float, float]],
    bias: Optional[Tensor],
    mask: Optional[Tensor],
):
    """q2: (N_dst * H, D), k2: (N_src * H, D), v2: (N_src * H, Dv); bias, mask: slot order or None.
    Returns out (N_dst * H, Dv), w and score (slot order; score None in exact mode), z_safe (N_dst * H,)."""
    scores = sddmm(pat.crow, pat.col, q2, k2, alpha=scale)  # (H * E,)
    if bias is not None:
        scores += bias
    score: Optional[Tensor] = scores  # kept for the clamp's gradient mask
    if clamp is not None:
        w = scores.clamp(clamp[0], clamp[1]).exp_()
    else:
        w, score = exp_shifted_(scores, pat.offsets, pat.row), None
    z = _segment(w, pat, "sum")
    z_safe = z.masked_fill_(z == 0, 1.0)  # no in-edges: wv = 0, so out = 0
    out = spmm(pat.crow, pat.col, w if mask is None else w * mask, v2, pat.shape)
    return out.div_(z_safe[:, None]), w, score, z_safe


def _csr_backward(
    grad_out: Tensor,
    grad_weights: Optional[Tensor],
    q2: Tensor,
    k2: Tensor,
    v2: Tensor,
    w: Tensor,
    score: Optional[Tensor],
    z_safe: Tensor,
    mask: Optional[Tensor],
    pat: PatternLike,
    scale: float,
    clamp,
    need: Tuple[bool, bool, bool, bool],
):
    """grad_out: (N_dst * H, Dv); grad_weights: slot order or None. Returns dq (N_dst * H, D),
    dk (N_src * H, D), dv (N_src * H, Dv) and ds (slot order), None where not needed."""
    transposed = (pat.shape[1], pat.shape[0])
    # buffers of H * E values are reused where they can be: above 32 MiB each fresh one page-faults
    p = torch.index_select(z_safe, 0, pat.row, out=w.new_empty(w.shape))
    p = torch.div(w, p, out=p)  # (H * E,) normalized weights
    dq = dk = dv = ds = None
    t_values = None  # values in the transposed order, for dv and then dk
    if need[2]:
        t_values = take(p if mask is None else p * mask, pat.to_csc)
        dv = spmm(pat.ccrow, pat.ccol, t_values, grad_out, transposed)
    if need[0] or need[1] or need[3]:
        a = sddmm(pat.crow, pat.col, grad_out, v2)  # <grad_out[t], v[s]>
        if mask is not None:
            a *= mask
        if grad_weights is not None:
            a += grad_weights
        ap = torch.mul(a, p, out=torch.empty_like(a) if t_values is None else t_values)  # dv is done with it
        delta = _segment(ap, pat, "sum")  # (N_dst * H,)
        ds = a.sub_(torch.index_select(delta, 0, pat.row, out=ap)).mul_(p)
        if score is not None:  # clamp mode: no gradient where the clamp is active
            ds.masked_fill_((score < clamp[0]) | (score > clamp[1]), 0.0)
        if need[0]:
            dq = spmm(pat.crow, pat.col, ds, k2, pat.shape, alpha=scale)
        if need[1]:
            t_ds = take(ds, pat.to_csc) if t_values is None else torch.index_select(ds, 0, pat.to_csc, out=t_values)
            dk = spmm(pat.ccrow, pat.ccol, t_ds, q2, transposed, alpha=scale)
    return dq, dk, dv, ds


class CSRAttention(torch.autograd.Function):
    """Edge attention on the CSR pattern with a hand-written backward.

    forward(q, k, v, bias, dropout_mask, graph, scale, clamp, return_weights, layout=None) with
    q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv) in float32/float64 and bias,
    dropout_mask (E, H) in caller order or None. Returns out (N_dst, H, Dv) and the normalized
    weights (E, H) in caller order (None unless return_weights). Twice differentiable: under
    create_graph=True the backward runs through `reference_backward`.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_mask, graph: Graph, scale: float, clamp, return_weights: bool, layout=None):
        heads = q.shape[1]
        ctx.graph, ctx.scale, ctx.clamp = graph, scale, clamp
        ctx.set_materialize_grads(False)
        training = any(ctx.needs_input_grad[:4])
        if layout == "head-major" or (layout is None and prefers_head_major(graph, k, training)):
            hm = ctx.pat = head_major_pattern(graph)
            mask = hm.to_sorted(dropout_mask)
            out, w, score, z_safe = head_major_forward(q, k, v, hm, scale, clamp, hm.to_sorted(bias), mask)
            weights = hm.to_caller(w / z_safe.index_select(1, hm.row)) if return_weights else None
        else:
            pat = ctx.pat = _pattern(graph, heads)
            q, k, v = (t.contiguous() for t in (q, k, v))
            q2, k2, v2 = (t.view(-1, t.shape[2]) for t in (q, k, v))  # (N * H, D): views
            mask = _to_slots(dropout_mask, pat)
            out, w, score, z_safe = _csr_forward(q2, k2, v2, pat, scale, clamp, _to_slots(bias, pat), mask)
            out = out.view(q.shape[0], heads, -1)
            weights = _to_caller(w / take(z_safe, pat.row), pat, heads) if return_weights else None
        ctx.save_for_backward(q, k, v, bias, dropout_mask, w, score, z_safe, mask)
        return out, weights

    @staticmethod
    def backward(ctx, grad_out, grad_weights):
        q, k, v, bias, dropout_mask, w, score, z_safe, mask = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            return twice_differentiable_backward(ctx, q, k, v, bias, dropout_mask, grad_out, grad_weights)
        need = tuple(ctx.needs_input_grad[:4])
        grad_out = v.new_zeros(q.shape[0], *v.shape[1:]) if grad_out is None else grad_out
        if isinstance(ctx.pat, HeadMajorPattern):
            hm = ctx.pat
            gw = hm.to_sorted(grad_weights)
            dq, dk, dv, ds = head_major_backward(
                grad_out, gw, q, k, v, w, score, z_safe, mask, hm, ctx.scale, ctx.clamp, need
            )
            dbias = hm.to_caller(ds) if ctx.needs_input_grad[3] else None
            return dq, dk, dv, dbias, None, None, None, None, None, None
        heads = q.shape[1]
        q2, k2, v2 = (t.view(-1, t.shape[2]) for t in (q, k, v))
        grad_out = grad_out.reshape(q2.shape[0], v2.shape[1])  # (N_dst * H, Dv)
        gw = _to_slots(grad_weights, ctx.pat)
        dq, dk, dv, ds = _csr_backward(
            grad_out, gw, q2, k2, v2, w, score, z_safe, mask, ctx.pat, ctx.scale, ctx.clamp, need
        )
        dq, dk, dv = (None if t is None else t.view(-1, heads, t.shape[1]) for t in (dq, dk, dv))
        dbias = _to_caller(ds, ctx.pat, heads) if ctx.needs_input_grad[3] else None
        return dq, dk, dv, dbias, None, None, None, None, None, None


@reference_on_empty  # torch's sparse ops reject empty shapes
def csr_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: Graph,
    *,
    scale: float,
    clamp: Optional[Tuple[float, float]],
    bias: Optional[Tensor],
    dropout_mask: Optional[Tensor],
    return_weights: bool,
    layout: Optional[str] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """The "csr" backend. q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv), bias and
    dropout_mask: (E, H) in the graph's edge order or None. Returns out (N_dst, H, Dv) in q's
    dtype and, if asked, the normalized weights (E, H) in the graph's edge order. Degenerate inputs
    (E = 0, or H, D, Dv = 0) go to the reference backend.

    layout: "interleaved" (all heads in one sparse call), "head-major" (one head at a time, for
    graphs without locality; see csr_head_major.py) or None to let `prefers_head_major` choose."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    dtype, acc = q.dtype, accumulation_dtype(q.dtype)
    q, k, v = (t.to(acc) for t in (q, k, v))
    bias = None if bias is None else bias.to(acc)
    mask = None if dropout_mask is None else dropout_mask.to(acc)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():  # dynamo cannot trace sparse tensors
        from .csr_ops import csr_op_attention, csr_op_head_major_attention

        if layout == "head-major" or (layout is None and prefers_head_major(graph, k)):
            out, weights = csr_op_head_major_attention(q, k, v, graph, scale, clamp, bias, mask, return_weights)
        else:
            q, k, v = (t.contiguous() for t in (q, k, v))
            out, weights = csr_op_attention(q, k, v, graph, scale, clamp, bias, mask, return_weights)
    else:
        out, weights = CSRAttention.apply(q, k, v, bias, mask, graph, scale, clamp, return_weights, layout)
    return out.to(dtype), (weights.to(dtype) if weights is not None and return_weights else None)


__all__ = ["csr_attention", "CSRAttention"]
