"""The "csr" backend: SDDMM scores and CSR SpMM aggregation over the destination-sorted pattern.

All heads run in one sparse call: the H per-head (N_dst, N_src) patterns are stacked into one
block-diagonal (H * N_dst, H * N_src) CSR matrix, and edge values live head-major as (H, E) in
destination-sorted order. Forward:
    score = scale * SDDMM(q, k) (+ bias)        (H, E)   torch.sparse.sampled_addmm
    w     = exp(clamp(score)) or exp(score - segment max)
    z     = segment sum of w                      (H, N_dst)
    out   = SpMM(w * dropout_mask, v) / z         (H, N_dst, Dv)
The backward is written by hand from the same primitives (sampled_addmm's own backward builds a
dense N x N gradient): with g = grad_out / z and r[t] = <g[t], out[t]>,
    dw_e = mask_e <g[t], v[s]> - r[t]  (+ the weights' own gradient, if they were returned)
    ds_e = dw_e * w_e (* [lo <= score_e <= hi] in clamp mode);  dbias = ds
    dq = scale * SpMM(ds, k),  dk = scale * SpMM(ds^T, q),  dv = SpMM((w * mask)^T, g)
where ^T uses the transposed (source-sorted) pattern. Nothing of shape (E, H, D) is allocated:
extra memory is O(E * H + N * H * D). torch's CPU sparse kernels lack half types, so float16 and
bfloat16 inputs run in float32 (as the reference accumulates) and are cast back.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..graphs import Graph
from .reference import accumulation_dtype


class _Pattern(NamedTuple):
    """Index tensors for one graph and head count (cached on the graph).

    crow, col: block-diagonal CSR of the H stacked (N_dst, N_src) patterns, dst-sorted edges.
    ccrow, ccol: the same for the transposed (N_src, N_dst) patterns, src-sorted edges.
    to_csc: (E,) dst-sorted position of each src-sorted edge.
    ptr: (N_dst + 1,) int64 row pointers of one head.
    row: (E,) destination of each dst-sorted edge.
    perm: (E,) caller position of each dst-sorted edge, or None when that is the identity.
    """

    crow: Tensor
    col: Tensor
    ccrow: Tensor
    ccol: Tensor
    to_csc: Tensor
    ptr: Tensor
    row: Tensor
    perm: Optional[Tensor]
    heads: int
    num_src: int
    num_dst: int


def _stack_heads(ptr: Tensor, idx: Tensor, heads: int, num_cols: int) -> Tuple[Tensor, Tensor]:
    """Block-diagonal CSR of `heads` copies of one pattern: crow (heads * rows + 1,), col (heads * E,)."""
    nnz = idx.numel()
    offsets = torch.arange(heads, device=ptr.device)
    crow = (ptr[None, :-1] + nnz * offsets[:, None]).reshape(-1)  # (H * rows,)
    crow = torch.cat([crow, crow.new_full((1,), heads * nnz)])
    col = (idx[None] + num_cols * offsets[:, None]).reshape(-1)  # (H * E,)
    small = max(heads * max(nnz, 1), heads * max(num_cols, 1)) < 2**31 - 1
    return (crow.int(), col.int()) if small else (crow, col)


def _pattern(graph: Graph, heads: int) -> _Pattern:
    def build() -> _Pattern:
        csr, csc = graph.csr(), graph.csc()
        crow, col = _stack_heads(csr.ptr, csr.idx, heads, graph.num_src)
        ccrow, ccol = _stack_heads(csc.ptr, csc.idx, heads, graph.num_dst)
        caller_to_csr = torch.empty_like(csr.perm)
        caller_to_csr[csr.perm] = torch.arange(csr.perm.numel(), device=csr.perm.device)
        row = torch.repeat_interleave(torch.arange(graph.num_dst, device=csr.ptr.device), csr.ptr.diff())
        perm = None if graph.is_sorted_by_dst else csr.perm
        return _Pattern(crow, col, ccrow, ccol, caller_to_csr[csc.perm], csr.ptr, row, perm, heads,
                        graph.num_src, graph.num_dst)

    return graph.cached(f"csr_pattern_h{heads}", build)


def _sparse(crow: Tensor, col: Tensor, values: Tensor, shape: Tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _sddmm(crow: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """values[h, e] = <a[h, row_e], b[h, col_e]> for a: (H, R, D), b: (H, C, D). Returns (H, E)."""
    heads, rows, d = a.shape
    cols = b.shape[1]
    nnz = col.numel()
    b = b.reshape(heads * cols, d)
    if nnz > heads * rows * b.shape[0]:  # sampled_addmm fails when nnz > numel (many duplicates): pad columns
        b = torch.cat([b, b.new_zeros(-(-nnz // (heads * rows)) - b.shape[0], d)])
    pattern = _sparse(crow, col, a.new_zeros(nnz), (heads * rows, b.shape[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = torch.sparse.sampled_addmm(pattern, a.reshape(heads * rows, d), b.t(), beta=0.0)
    return res.values().view(heads, nnz // heads)


def _spmm(crow: Tensor, col: Tensor, values: Tensor, x: Tensor, rows: int) -> Tensor:
    """out[h, r] = sum_{e in row r} values[h, e] x[h, col_e] for values (H, E), x (H, C, D) -> (H, R, D)."""
    heads, cols, d = x.shape
    mat = _sparse(crow, col, values.reshape(-1), (heads * rows, heads * cols))
    return (mat @ x.reshape(heads * cols, d)).view(heads, rows, d)


def _segment(values: Tensor, pat: _Pattern, reduce: str) -> Tensor:
    """Per-destination sum or max of dst-sorted (H, E) values -> (H, N_dst); empty segments give 0 / -inf."""
    return torch.segment_reduce(values, reduce, offsets=pat.ptr.expand(values.shape[0], -1), axis=1)


def _to_sorted(x: Optional[Tensor], pat: _Pattern) -> Optional[Tensor]:
    """(E, H) in caller order -> (H, E) dst-sorted, contiguous."""
    if x is None:
        return None
    x = x if pat.perm is None else x[pat.perm]
    return x.t().contiguous()


def _to_caller(x: Tensor, pat: _Pattern) -> Tensor:
    """(H, E) dst-sorted -> (E, H) in caller order."""
    x = x.t()
    if pat.perm is None:
        return x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out[pat.perm] = x
    return out


def _csr_forward(qh: Tensor, kh: Tensor, vh: Tensor, pat: _Pattern, scale: float,
                 clamp: Optional[Tuple[float, float]], bias: Optional[Tensor], mask: Optional[Tensor]):
    """qh: (H, N_dst, D), kh: (H, N_src, D), vh: (H, N_src, Dv); bias, mask: (H, E) sorted.
    Returns out (H, N_dst, Dv), w (H, E), z_safe (H, N_dst), in_range (H, E) bool or None."""
    score = _sddmm(pat.crow, pat.col, qh, kh).mul_(scale)  # (H, E)
    if bias is not None:
        score += bias
    in_range = None
    if clamp is not None:
        in_range = (score >= clamp[0]) & (score <= clamp[1])
        w = score.clamp_(clamp[0], clamp[1]).exp_()
    else:
        m = _segment(score, pat, "max")  # (H, N_dst)
        m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
        w = score.sub_(m[:, pat.row]).exp_()
    z = _segment(w, pat, "sum")
    z_safe = torch.where(z > 0, z, torch.ones_like(z))  # no in-edges: wv = 0, so out = 0
    wv = _spmm(pat.crow, pat.col, w if mask is None else w * mask, vh, pat.num_dst)  # (H, N_dst, Dv)
    return wv.div_(z_safe[..., None]), w, z_safe, in_range


def _csr_backward(grad_out: Tensor, grad_weights: Optional[Tensor], qh: Tensor, kh: Tensor, vh: Tensor,
                  out: Tensor, w: Tensor, z_safe: Tensor, in_range: Optional[Tensor], mask: Optional[Tensor],
                  pat: _Pattern, scale: float, need: Tuple[bool, bool, bool, bool]):
    """grad_out: (H, N_dst, Dv); grad_weights: (H, E) sorted or None. Returns dq, dk, dv, dbias
    as (H, N, .) / (H, E) tensors, None where not needed."""
    g = grad_out / z_safe[..., None]  # (H, N_dst, Dv)
    dq = dk = dv = ds = None
    if need[2]:
        wm = w if mask is None else w * mask
        dv = _spmm(pat.ccrow, pat.ccol, wm[:, pat.to_csc], g, pat.num_src)
    if need[0] or need[1] or need[3]:
        dw = _sddmm(pat.crow, pat.col, g, vh)  # (H, E): <g[t], v[s]>
        if mask is not None:
            dw *= mask
        dw -= (g * out).sum(-1)[:, pat.row]
        if grad_weights is not None:  # weights p = w / z: dw += (gp - sum_t gp * p) / z
            p = w / z_safe[:, pat.row]
            corr = _segment(grad_weights * p, pat, "sum")
            dw += (grad_weights - corr[:, pat.row]) / z_safe[:, pat.row]
        ds = dw.mul_(w)
        if in_range is not None:
            ds.masked_fill_(~in_range, 0.0)
        if need[0]:
            dq = _spmm(pat.crow, pat.col, ds, kh, pat.num_dst).mul_(scale)
        if need[1]:
            dk = _spmm(pat.ccrow, pat.ccol, ds[:, pat.to_csc], qh, pat.num_src).mul_(scale)
    return dq, dk, dv, ds


class CSRAttention(torch.autograd.Function):
    """Edge attention on the CSR pattern with a hand-written backward.

    forward(q, k, v, bias, dropout_mask, pattern, scale, clamp) with q: (N_dst, H, D),
    k: (N_src, H, D), v: (N_src, H, Dv) in float32/float64 and bias, dropout_mask (E, H) in
    caller order (or None). Returns out (N_dst, H, Dv) and the normalized weights (E, H).
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_mask, pat: _Pattern, scale: float, clamp):
        qh, kh, vh = (t.transpose(0, 1).contiguous() for t in (q, k, v))  # (H, N, D)
        mask = _to_sorted(dropout_mask, pat)
        out, w, z_safe, in_range = _csr_forward(qh, kh, vh, pat, scale, clamp, _to_sorted(bias, pat), mask)
        weights = _to_caller(w / z_safe[:, pat.row], pat)  # (E, H)
        ctx.save_for_backward(qh, kh, vh, out, w, z_safe, in_range, mask)
        ctx.pat, ctx.scale = pat, scale
        ctx.set_materialize_grads(False)
        return out.transpose(0, 1), weights

    @staticmethod
    def backward(ctx, grad_out, grad_weights):
        qh, kh, vh, out, w, z_safe, in_range, mask = ctx.saved_tensors
        if grad_out is None:  # only the weights were used
            grad_out = out.new_zeros(out.shape[1], *out.shape[::2])
        need = tuple(ctx.needs_input_grad[:4])
        gw = _to_sorted(grad_weights, ctx.pat) if grad_weights is not None else None
        dq, dk, dv, ds = _csr_backward(grad_out.transpose(0, 1).contiguous(), gw, qh, kh, vh, out, w, z_safe,
                                       in_range, mask, ctx.pat, ctx.scale, need)
        dq, dk, dv = (None if t is None else t.transpose(0, 1) for t in (dq, dk, dv))
        dbias = _to_caller(ds, ctx.pat) if need[3] else None
        return dq, dk, dv, dbias, None, None, None, None


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
    heads, acc = q.shape[1], accumulation_dtype(q.dtype)
    if graph.num_edges == 0:  # torch sparse ops reject some empty shapes; the answer is all zeros
        linked = q[:0].sum() + k[:0].sum() + v[:0].sum()  # exactly 0, but gives q, k, v (zero) gradients
        out = q.new_zeros(graph.num_dst, heads, v.shape[2]) + linked
        return out, (q.new_zeros(0, heads) if return_weights else None)
    pat = _pattern(graph, heads)
    args = [t.to(acc) for t in (q, k, v)]
    out, weights = CSRAttention.apply(*args, None if bias is None else bias.to(acc),
                                      None if dropout_mask is None else dropout_mask.to(acc), pat, scale, clamp)
    return out.to(q.dtype), (weights.to(q.dtype) if return_weights else None)


__all__ = ["csr_attention", "CSRAttention"]
