"""The "csr" backend: SDDMM scores and CSR SpMM aggregation over the destination-sorted pattern.

All heads run in one sparse call. Rows of q (N_dst, H, D) viewed as (N_dst * H, D) are
"head rows" t * H + h, so the H per-head patterns interleave into one (N_dst * H, N_src * H)
CSR matrix whose head row t * H + h holds columns s * H + h for the edges s -> t; q, k, v and
every output are then plain views, with no transposes. Edge values live in that matrix's
"slot" order (H * E,): destination, then head, then source. Forward:
    score = scale * SDDMM(q, k) (+ bias)        torch.sparse.sampled_addmm
    w     = exp(clamp(score)) or exp(score - per-head-row max)
    z     = segment sum of w                      (N_dst * H,)
    out   = SpMM(w * dropout_mask, v) / z         (N_dst, H, Dv)
The backward is written by hand from the same primitives (sampled_addmm's own backward builds a
dense N x N gradient): with g = grad_out / z and r[t] = <g[t], out[t]> per head,
    dw_e = mask_e <g[t], v[s]> - r[t]  (+ the returned weights' own gradient, if any)
    ds_e = dw_e * w_e (* [lo <= score_e <= hi] in clamp mode);  dbias = ds
    dq = scale * SpMM(ds, k),  dk = scale * SpMM(ds^T, q),  dv = SpMM((w * mask)^T, g)
where ^T is the cached transposed (source-sorted) pattern. Nothing of shape (E, H, D) is
allocated: extra memory is O(E * H + N * H * D). Under create_graph=True (double backward, e.g. a
gradient penalty) backward instead recomputes through the reference (`reference_backward`), whose
gradients torch can differentiate again. torch's CPU sparse kernels have no half types, so
float16/bfloat16 inputs run in float32 (as the reference accumulates) and are cast back.
Degenerate inputs (E = 0, or H, D, Dv = 0) go to the reference backend.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..graphs import Graph
from .reference import accumulation_dtype, reference_attention, reference_backward


class _Pattern(NamedTuple):
    """Index tensors for one graph and head count H, cached on the graph.

    crow, col: CSR of the (N_dst * H, N_src * H) head-interleaved pattern (int32 when it fits).
    ccrow, ccol: the same for the transposed (N_src * H, N_dst * H) pattern.
    offsets: crow as int64 (segment reductions). row: (H * E,) head row of each slot.
    to_csc: (H * E,) slot in the CSR order of each transposed slot.
    from_caller: (H * E,) position in a flattened caller-order (E, H) tensor of each slot.
    to_caller: (E, H) slot of each caller edge and head. Both None when slots are the caller order.
    """

    crow: Tensor
    col: Tensor
    ccrow: Tensor
    ccol: Tensor
    offsets: Tensor
    row: Tensor
    to_csc: Tensor
    from_caller: Optional[Tensor]
    to_caller: Optional[Tensor]
    shape: Tuple[int, int]


def _interleave(ptr: Tensor, idx: Tensor, heads: int, num_cols: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Head-interleaved CSR of one (rows, num_cols) pattern. Returns crow (rows * H + 1,),
    col (H * E,) and slot (E, H): where sorted edge e of head h lives."""
    device, num_edges = ptr.device, idx.numel()
    deg = ptr.diff()  # (rows,)
    crow = torch.zeros(deg.numel() * heads + 1, dtype=torch.long, device=device)
    crow[1:] = torch.cumsum(deg.repeat_interleave(heads), 0)
    t = torch.repeat_interleave(torch.arange(deg.numel(), device=device), deg)  # (E,) row of each edge
    j = torch.arange(num_edges, device=device) - ptr[t]  # (E,) position inside its row
    h = torch.arange(heads, device=device)
    slot = ptr[t, None] * heads + h[None] * deg[t, None] + j[:, None]  # (E, H)
    col = torch.empty(num_edges * heads, dtype=torch.long, device=device)
    col[slot] = idx[:, None] * heads + h[None]
    return crow, col, slot


def _pattern(graph: Graph, heads: int) -> _Pattern:
    def build() -> _Pattern:
        csr, csc = graph.csr(), graph.csc()
        crow, col, slot = _interleave(csr.ptr, csr.idx, heads, graph.num_src)
        ccrow, ccol, cslot = _interleave(csc.ptr, csc.idx, heads, graph.num_dst)
        num_edges, device = csr.idx.numel(), csr.idx.device
        h = torch.arange(heads, device=device)
        dst_sorted = graph.dst[csr.perm]
        row = torch.empty(num_edges * heads, dtype=torch.long, device=device)
        row[slot] = dst_sorted[:, None] * heads + h[None]
        caller_to_csr = torch.empty_like(csr.perm)
        caller_to_csr[csr.perm] = torch.arange(num_edges, device=device)
        to_csc = torch.empty(num_edges * heads, dtype=torch.long, device=device)
        to_csc[cslot] = slot[caller_to_csr[csc.perm]]
        from_caller = to_caller = None
        if not (graph.is_sorted_by_dst and heads == 1):
            to_caller = slot[caller_to_csr]  # (E, H)
            from_caller = torch.empty(num_edges * heads, dtype=torch.long, device=device)
            from_caller[to_caller.reshape(-1)] = torch.arange(num_edges * heads, device=device)
        offsets = crow
        if max(num_edges, graph.num_src, graph.num_dst) * heads < 2**31 - 1:  # int32 indices: less traffic
            crow, col, ccrow, ccol, row, to_csc = (t.int() for t in (crow, col, ccrow, ccol, row, to_csc))
            if to_caller is not None:
                from_caller, to_caller = from_caller.int(), to_caller.int()
        return _Pattern(crow, col, ccrow, ccol, offsets, row, to_csc, from_caller, to_caller,
                        (graph.num_dst * heads, graph.num_src * heads))

    return graph.cached(f"csr_pattern_h{heads}", build)


def _sparse(crow: Tensor, col: Tensor, values: Tensor, shape: Tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _sddmm(crow: Tensor, col: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """values[slot] = alpha * <a[row], b[col]> for a: (R, D), b: (C, D). Returns (nnz,)."""
    nnz, d = col.numel(), a.shape[1]
    if nnz > a.shape[0] * b.shape[0]:  # sampled_addmm fails when nnz > numel (many duplicates): pad columns
        b = torch.cat([b, b.new_zeros(-(-nnz // a.shape[0]) - b.shape[0], d)])
    pattern = _sparse(crow, col, a.new_zeros(nnz), (a.shape[0], b.shape[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # in place (out=pattern): no copy of the pattern's indices; beta=0 still reads the zeros
        return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0, alpha=alpha, out=pattern).values()


def _spmm(crow: Tensor, col: Tensor, values: Tensor, x: Tensor, shape: Tuple[int, int],
          alpha: float = 1.0) -> Tensor:
    """out[r] = alpha * sum_{slots of row r} values[slot] x[col] for x: (C, D). Returns (R, D)."""
    mat = _sparse(crow, col, values, shape)
    out = x.new_empty(shape[0], x.shape[1])
    return torch.addmm(out, mat, x, beta=0.0, alpha=alpha, out=out)  # beta=0: out is never read


def _take(x: Tensor, index: Tensor) -> Tensor:
    """x[index] for 1-D x: index_select is several times faster than advanced indexing on CPU."""
    return torch.index_select(x, 0, index)


def _segment(values: Tensor, pat: _Pattern, reduce: str) -> Tensor:
    """Per-head-row sum or max of slot values (H * E,) -> (N_dst * H,); empty rows give 0 / -inf."""
    return torch.segment_reduce(values, reduce, offsets=pat.offsets)


def _to_slots(x: Optional[Tensor], pat: _Pattern) -> Optional[Tensor]:
    """(E, H) in caller order -> (H * E,) in slot order."""
    if x is None:
        return None
    x = x.reshape(-1)
    return x.contiguous() if pat.from_caller is None else _take(x, pat.from_caller)


def _to_caller(x: Tensor, pat: _Pattern, heads: int) -> Tensor:
    """(H * E,) in slot order -> (E, H) in caller order."""
    return x.view(-1, heads) if pat.to_caller is None else _take(x, pat.to_caller.view(-1)).view(-1, heads)


def _csr_forward(q2: Tensor, k2: Tensor, v2: Tensor, pat: _Pattern, scale: float,
                 clamp: Optional[Tuple[float, float]], bias: Optional[Tensor], mask: Optional[Tensor]):
    """q2: (N_dst * H, D), k2: (N_src * H, D), v2: (N_src * H, Dv); bias, mask: slot order or None.
    Returns out (N_dst * H, Dv), w and score (slot order; score None in exact mode), z_safe (N_dst * H,)."""
    score = _sddmm(pat.crow, pat.col, q2, k2, alpha=scale)  # (H * E,)
    if bias is not None:
        score += bias
    if clamp is not None:
        w = score.clamp(clamp[0], clamp[1]).exp_()
    else:
        m = _segment(score, pat, "max")  # (N_dst * H,)
        m.masked_fill_(torch.isneginf(m), 0.0)  # a head row whose scores are all -inf gets w = 0
        w, score = score.sub_(_take(m, pat.row)).exp_(), None
    z = _segment(w, pat, "sum")
    z_safe = z.masked_fill_(z == 0, 1.0)  # no in-edges: wv = 0, so out = 0
    out = _spmm(pat.crow, pat.col, w if mask is None else w * mask, v2, pat.shape)
    return out.div_(z_safe[:, None]), w, score, z_safe


def _csr_backward(grad_out: Tensor, grad_weights: Optional[Tensor], q2: Tensor, k2: Tensor, v2: Tensor,
                  out: Tensor, w: Tensor, score: Optional[Tensor], z_safe: Tensor, mask: Optional[Tensor],
                  pat: _Pattern, scale: float, clamp, need: Tuple[bool, bool, bool, bool]):
    """grad_out: (N_dst * H, Dv); grad_weights: slot order or None. Returns dq (N_dst * H, D),
    dk (N_src * H, D), dv (N_src * H, Dv) and ds (slot order), None where not needed."""
    g = grad_out / z_safe[:, None]  # (N_dst * H, Dv)
    transposed = (pat.shape[1], pat.shape[0])
    dq = dk = dv = ds = None
    if need[2]:
        wm = w if mask is None else w * mask
        dv = _spmm(pat.ccrow, pat.ccol, _take(wm, pat.to_csc), g, transposed)
    if need[0] or need[1] or need[3]:
        dw = _sddmm(pat.crow, pat.col, g, v2)  # <g[t], v[s]>
        if mask is not None:
            dw *= mask
        dw -= _take(torch.linalg.vecdot(g, out), pat.row)
        if grad_weights is not None:  # returned weights p = w / z: dw += (gp - sum_t gp * p) / z
            zr = _take(z_safe, pat.row)
            corr = _segment(grad_weights * w / zr, pat, "sum")
            dw += (grad_weights - _take(corr, pat.row)) / zr
        ds = dw.mul_(w)
        if score is not None:  # clamp mode: no gradient where the clamp is active
            ds.masked_fill_((score < clamp[0]) | (score > clamp[1]), 0.0)
        if need[0]:
            dq = _spmm(pat.crow, pat.col, ds, k2, pat.shape, alpha=scale)
        if need[1]:
            dk = _spmm(pat.ccrow, pat.ccol, _take(ds, pat.to_csc), q2, transposed, alpha=scale)
    return dq, dk, dv, ds


class CSRAttention(torch.autograd.Function):
    """Edge attention on the CSR pattern with a hand-written backward.

    forward(q, k, v, bias, dropout_mask, graph, scale, clamp, return_weights) with contiguous
    q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv) in float32/float64 and bias,
    dropout_mask (E, H) in caller order or None. Returns out (N_dst, H, Dv) and the normalized
    weights (E, H) in caller order (None unless return_weights). Twice differentiable: under
    create_graph=True the backward runs through `reference_backward`.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_mask, graph: Graph, scale: float, clamp, return_weights: bool):
        heads = q.shape[1]
        pat = _pattern(graph, heads)
        q2, k2, v2 = (t.view(-1, t.shape[2]) for t in (q, k, v))  # (N * H, D): views
        mask = _to_slots(dropout_mask, pat)
        out, w, score, z_safe = _csr_forward(q2, k2, v2, pat, scale, clamp, _to_slots(bias, pat), mask)
        weights = _to_caller(w / _take(z_safe, pat.row), pat, heads) if return_weights else None
        ctx.save_for_backward(q, k, v, bias, dropout_mask, out, w, score, z_safe, mask)
        ctx.graph, ctx.pat, ctx.scale, ctx.clamp = graph, pat, scale, clamp
        ctx.set_materialize_grads(False)
        return out.view(q.shape[0], heads, -1), weights

    @staticmethod
    def backward(ctx, grad_out, grad_weights):
        q, k, v, bias, dropout_mask, out, w, score, z_safe, mask = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            grads = reference_backward((q, k, v, bias), ctx.needs_input_grad[:4], ctx.graph, scale=ctx.scale,
                                       clamp=ctx.clamp, dropout_mask=dropout_mask, grad_out=grad_out,
                                       grad_weights=grad_weights)
            return (*grads, None, None, None, None, None)
        heads = q.shape[1]
        q2, k2, v2 = (t.view(-1, t.shape[2]) for t in (q, k, v))
        grad_out = out.new_zeros(out.shape) if grad_out is None else grad_out.reshape(out.shape)
        gw = _to_slots(grad_weights, ctx.pat)
        dq, dk, dv, ds = _csr_backward(grad_out, gw, q2, k2, v2, out, w, score, z_safe, mask, ctx.pat, ctx.scale,
                                       ctx.clamp, tuple(ctx.needs_input_grad[:4]))
        dq, dk, dv = (None if t is None else t.view(-1, heads, t.shape[1]) for t in (dq, dk, dv))
        dbias = _to_caller(ds, ctx.pat, heads) if ctx.needs_input_grad[3] else None
        return dq, dk, dv, dbias, None, None, None, None, None


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
) -> Tuple[Tensor, Optional[Tensor]]:
    """The "csr" backend. q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv), bias and
    dropout_mask: (E, H) in the graph's edge order or None. Returns out (N_dst, H, Dv) in q's
    dtype and, if asked, the normalized weights (E, H) in the graph's edge order."""
    if graph.num_edges == 0 or 0 in (q.shape[1], q.shape[2], v.shape[2]):  # torch sparse ops reject empty shapes
        return reference_attention(q, k, v, graph, scale=scale, clamp=clamp, bias=bias, dropout_mask=dropout_mask,
                                   return_weights=return_weights)
    dtype, acc = q.dtype, accumulation_dtype(q.dtype)
    q, k, v = (t.to(acc).contiguous() for t in (q, k, v))
    bias = None if bias is None else bias.to(acc)
    mask = None if dropout_mask is None else dropout_mask.to(acc)
    out, weights = CSRAttention.apply(q, k, v, bias, mask, graph, scale, clamp, return_weights)
    return out.to(dtype), (weights.to(dtype) if return_weights else None)


__all__ = ["csr_attention", "CSRAttention"]
