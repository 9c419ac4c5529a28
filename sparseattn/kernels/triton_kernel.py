"""The triton backend: edge attention fused into one forward and two backward Triton kernels.

Forward (`_fwd_kernel`): one program per (destination t, head h) walks t's in-edges in the
destination-sorted CSR in tiles of BLOCK_E, gathers k[s, h] and v[s, h], and accumulates
z = sum w_e and wv = sum w_e m_e v[s] in registers in float32 (float64 for float64 inputs), with
w_e = exp(clamp(score_e)) or, for clamp=None, an online max as in FlashAttention. It writes
out[t, h] = wv / z once (0 without in-edges) and one statistic per destination and head,
lse = log z (clamp) or max + log z (exact), so that p_e = w_e / z = exp(logit_e - lse[t]).
Bias, dropout mask and returned weights stay in the caller's edge order, indexed through perm.

Backward recomputes the weights; nothing of shape (E, H, D) is ever stored. With
dp_e = m_e <do[t], v[s]> + dweights_e and g_e clamp's gradient indicator (1 in exact mode):
    dscore_e = g_e p_e (dp_e - delta[t]),   delta[t] = sum_{e -> t} p_e dp_e  (= <do[t], out[t]> + ...).
`_bwd_dq_kernel` walks the CSR once: delta in float32 (not from the rounded output, which costs
half-precision gradients accuracy), dq[t] = scale (sum g p dp k[s] - delta sum g p k[s]), and p dp
per edge into an (E, H) buffer in caller order. `_bwd_dkdv_kernel` walks the transposed CSR (per
source): dscore, which it leaves in that buffer as dbias, dk[s] = scale sum_e dscore_e q[t] and
dv[s] = sum_e p_e m_e do[t]. No atomics, so every run gives bit-identical gradients. Under
create_graph=True (double backward) backward recomputes through the reference instead
(`reference_backward`), whose gradients torch can differentiate again.

Runs on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before this module was
imported (tests do that). Degenerate inputs (E = 0, or H, D, Dv = 0) go to the reference backend.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..graphs import Graph
from .reference import accumulation_dtype, reference_attention, reference_backward

MAX_HEAD_DIM = 256
_TL_DTYPE = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def _logit(s, lo, hi, CLAMP: tl.constexpr):
    """clamp(s, lo, hi) with NaN kept NaN (like torch.clamp); s itself in exact mode."""
    if CLAMP:
        s = tl.where(s < lo, lo, tl.where(s > hi, hi, s))
    return s


@triton.jit
def _fwd_kernel(Q, K, V, BIAS, MASK, OUT, LSE, W, PTR, IDX, PERM,
                sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, so_n, so_h, sb_e, sb_h, sm_e, sm_h,
                H, D, DV, scale: "fp64", lo: "fp64", hi: "fp64",
                BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CLAMP: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, RETURN_WEIGHTS: tl.constexpr, ACC: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    sc, lo, hi = tl.full([], scale, ACC), tl.full([], lo, ACC), tl.full([], hi, ACC)
    offs_e, offs_d, offs_dv = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    start, end = tl.load(PTR + t), tl.load(PTR + t + 1)
    q = tl.load(Q + t * sq_n + h * sq_h + offs_d, mask=offs_d < D, other=0.0).to(ACC)  # (BLOCK_D,)
    m_i = tl.full([], float("-inf"), ACC)  # running max of the scores (exact mode)
    z_i = tl.zeros([], ACC)
    acc = tl.zeros([BLOCK_DV], ACC)
    for e0 in range(start, end, BLOCK_E):
        e = e0 + offs_e
        live = e < end
        src = tl.load(IDX + e, mask=live, other=0)
        kt = tl.load(K + src[:, None] * sk_n + h * sk_h + offs_d[None, :],
                     mask=live[:, None] & (offs_d[None, :] < D), other=0.0).to(ACC)  # (BLOCK_E, BLOCK_D)
        s = tl.sum(kt * q[None, :], 1) * sc
        if HAS_BIAS or HAS_MASK:
            pos = tl.load(PERM + e, mask=live, other=0)  # caller-order position of each edge
        if HAS_BIAS:
            s += tl.load(BIAS + pos * sb_e + h * sb_h, mask=live, other=0.0).to(ACC)
        if CLAMP:
            w = tl.where(live, tl.exp(_logit(s, lo, hi, CLAMP)), 0.0)
        else:
            s = tl.where(live, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: w = 0, no NaN
            alpha = tl.exp(m_i - m_use)
            w = tl.exp(s - m_use)
            z_i, acc, m_i = z_i * alpha, acc * alpha, m_new
        z_i += tl.sum(w, 0)
        if HAS_MASK:
            w = w * tl.load(MASK + pos * sm_e + h * sm_h, mask=live, other=0.0).to(ACC)
        vt = tl.load(V + src[:, None] * sv_n + h * sv_h + offs_dv[None, :],
                     mask=live[:, None] & (offs_dv[None, :] < DV), other=0.0).to(ACC)  # (BLOCK_E, BLOCK_DV)
        acc += tl.sum(w[:, None] * vt, 0)
    z_safe = tl.where(z_i > 0, z_i, 1.0)  # no in-edges: acc = 0, so out = 0
    tl.store(OUT + t * so_n + h * so_h + offs_dv, (acc / z_safe).to(OUT.dtype.element_ty), mask=offs_dv < DV)
    lse = tl.log(z_safe)
    if not CLAMP:
        lse += tl.where(m_i == float("-inf"), 0.0, m_i)
    tl.store(LSE + t * H + h, lse)
    if RETURN_WEIGHTS:  # second pass over the scores, now that lse is known
        for e0 in range(start, end, BLOCK_E):
            e = e0 + offs_e
            live = e < end
            src = tl.load(IDX + e, mask=live, other=0)
            pos = tl.load(PERM + e, mask=live, other=0)
            kt = tl.load(K + src[:, None] * sk_n + h * sk_h + offs_d[None, :],
                         mask=live[:, None] & (offs_d[None, :] < D), other=0.0).to(ACC)
            s = tl.sum(kt * q[None, :], 1) * sc
            if HAS_BIAS:
                s += tl.load(BIAS + pos * sb_e + h * sb_h, mask=live, other=0.0).to(ACC)
            p = tl.exp(_logit(s, lo, hi, CLAMP) - lse)
            tl.store(W + pos * H + h, p.to(W.dtype.element_ty), mask=live)


@triton.jit
def _bwd_dq_kernel(Q, K, V, BIAS, MASK, DO, LSE, DW, DQ, DELTA, PDP, PTR, IDX, PERM,
                   sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sdo_n, sdo_h, sb_e, sb_h, sm_e, sm_h, sw_e, sw_h,
                   H, D, DV, scale: "fp64", lo: "fp64", hi: "fp64",
                   BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CLAMP: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_DW: tl.constexpr, ACC: tl.constexpr):
    """One pass: with g = clamp indicator, dq = scale (sum g p dp k - delta sum g p k), delta = sum p dp."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    sc, lo, hi = tl.full([], scale, ACC), tl.full([], lo, ACC), tl.full([], hi, ACC)
    offs_e, offs_d, offs_dv = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    start, end = tl.load(PTR + t), tl.load(PTR + t + 1)
    q = tl.load(Q + t * sq_n + h * sq_h + offs_d, mask=offs_d < D, other=0.0).to(ACC)
    do = tl.load(DO + t * sdo_n + h * sdo_h + offs_dv, mask=offs_dv < DV, other=0.0).to(ACC)
    lse = tl.load(LSE + t * H + h)
    delta = tl.zeros([], ACC)
    gpdp_k = tl.zeros([BLOCK_D], ACC)
    gp_k = tl.zeros([BLOCK_D], ACC)
    for e0 in range(start, end, BLOCK_E):
        e = e0 + offs_e
        live = e < end
        src = tl.load(IDX + e, mask=live, other=0)
        pos = tl.load(PERM + e, mask=live, other=0)
        kt = tl.load(K + src[:, None] * sk_n + h * sk_h + offs_d[None, :],
                     mask=live[:, None] & (offs_d[None, :] < D), other=0.0).to(ACC)
        s = tl.sum(kt * q[None, :], 1) * sc
        if HAS_BIAS:
            s += tl.load(BIAS + pos * sb_e + h * sb_h, mask=live, other=0.0).to(ACC)
        p = tl.where(live, tl.exp(_logit(s, lo, hi, CLAMP) - lse), 0.0)
        vt = tl.load(V + src[:, None] * sv_n + h * sv_h + offs_dv[None, :],
                     mask=live[:, None] & (offs_dv[None, :] < DV), other=0.0).to(ACC)
        dp = tl.sum(vt * do[None, :], 1)  # <do[t], v[s]>
        if HAS_MASK:
            dp *= tl.load(MASK + pos * sm_e + h * sm_h, mask=live, other=0.0).to(ACC)
        if HAS_DW:
            dp += tl.load(DW + pos * sw_e + h * sw_h, mask=live, other=0.0).to(ACC)
        pdp = p * dp
        delta += tl.sum(pdp, 0)
        if CLAMP:  # torch.clamp's gradient passes where lo <= s <= hi
            inside = (s >= lo) & (s <= hi)
            gp_k += tl.sum(tl.where(inside, p, 0.0)[:, None] * kt, 0)
            gpdp_k += tl.sum(tl.where(inside, pdp, 0.0)[:, None] * kt, 0)
        else:
            gp_k += tl.sum(p[:, None] * kt, 0)
            gpdp_k += tl.sum(pdp[:, None] * kt, 0)
        tl.store(PDP + pos * H + h, pdp, mask=live)
    tl.store(DELTA + t * H + h, delta)
    tl.store(DQ + t * sq_n + h * sq_h + offs_d, ((gpdp_k - delta * gp_k) * sc).to(DQ.dtype.element_ty),
             mask=offs_d < D)


@triton.jit
def _bwd_dkdv_kernel(Q, K, BIAS, MASK, DO, LSE, DELTA, DS, DK, DV_OUT, PTR, IDX, PERM,
                     sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sdo_n, sdo_h, sb_e, sb_h, sm_e, sm_h,
                     H, D, DV, scale: "fp64", lo: "fp64", hi: "fp64",
                     BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CLAMP: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, ACC: tl.constexpr):
    """DS holds p dp from `_bwd_dq_kernel` and leaves holding dscore = g (p dp - p delta)."""
    u = tl.program_id(0).to(tl.int64)  # a source node; PTR/IDX/PERM are the transposed CSR
    h = tl.program_id(1).to(tl.int64)
    sc, lo, hi = tl.full([], scale, ACC), tl.full([], lo, ACC), tl.full([], hi, ACC)
    offs_e, offs_d, offs_dv = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    start, end = tl.load(PTR + u), tl.load(PTR + u + 1)
    k = tl.load(K + u * sk_n + h * sk_h + offs_d, mask=offs_d < D, other=0.0).to(ACC)
    dk = tl.zeros([BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_DV], ACC)
    for e0 in range(start, end, BLOCK_E):
        e = e0 + offs_e
        live = e < end
        dst = tl.load(IDX + e, mask=live, other=0)
        pos = tl.load(PERM + e, mask=live, other=0)
        qt = tl.load(Q + dst[:, None] * sq_n + h * sq_h + offs_d[None, :],
                     mask=live[:, None] & (offs_d[None, :] < D), other=0.0).to(ACC)  # (BLOCK_E, BLOCK_D)
        s = tl.sum(qt * k[None, :], 1) * sc
        if HAS_BIAS:
            s += tl.load(BIAS + pos * sb_e + h * sb_h, mask=live, other=0.0).to(ACC)
        lse = tl.load(LSE + dst * H + h, mask=live, other=0.0)
        p = tl.where(live, tl.exp(_logit(s, lo, hi, CLAMP) - lse), 0.0)
        ds = tl.load(DS + pos * H + h, mask=live, other=0.0) - p * tl.load(DELTA + dst * H + h, mask=live, other=0.0)
        if CLAMP:
            ds = tl.where((s >= lo) & (s <= hi), ds, 0.0)
        tl.store(DS + pos * H + h, ds, mask=live)
        dk += tl.sum(ds[:, None] * qt, 0)
        if HAS_MASK:
            p *= tl.load(MASK + pos * sm_e + h * sm_h, mask=live, other=0.0).to(ACC)
        dot = tl.load(DO + dst[:, None] * sdo_n + h * sdo_h + offs_dv[None, :],
                      mask=live[:, None] & (offs_dv[None, :] < DV), other=0.0).to(ACC)  # (BLOCK_E, BLOCK_DV)
        dv += tl.sum(p[:, None] * dot, 0)
    tl.store(DK + u * sk_n + h * sk_h + offs_d, (dk * sc).to(DK.dtype.element_ty), mask=offs_d < D)
    tl.store(DV_OUT + u * sv_n + h * sv_h + offs_dv, dv.to(DV_OUT.dtype.element_ty), mask=offs_dv < DV)


def _config(d: int, dv: int, mean_degree: float) -> dict:
    """Tile sizes: BLOCK_D/BLOCK_DV pad D/Dv to powers of two; an edge tile covers the mean degree
    (16 to 64 edges) but at most ~2048 elements per gathered tile, so registers do not spill."""
    block_d, block_dv = triton.next_power_of_2(max(d, 1)), triton.next_power_of_2(max(dv, 1))
    widest = max(block_d, block_dv)
    block_e = min(triton.next_power_of_2(max(16, math.ceil(mean_degree))), 64, max(16, 2048 // widest))
    return dict(BLOCK_E=block_e, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=4 if block_e * widest >= 2048 else 2)


def _strides(t: Optional[Tensor]) -> Tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t is not None else (0, 0)


def _shared_args(q, v, scale, clamp, bias, dropout_mask):
    """What every kernel takes: bias and mask (a never-read stand-in when absent), the dims and
    scalars (H, D, Dv, scale, lo, hi), and the compile-time flags."""
    dummy = q.new_empty(1)
    lo, hi = clamp if clamp is not None else (0.0, 0.0)
    flags = dict(CLAMP=clamp is not None, HAS_BIAS=bias is not None, HAS_MASK=dropout_mask is not None,
                 ACC=_TL_DTYPE[accumulation_dtype(q.dtype)])
    return (bias if bias is not None else dummy, dropout_mask if dropout_mask is not None else dummy,
            (q.shape[1], q.shape[2], v.shape[2], scale, lo, hi), flags)


def _triton_forward(q, k, v, graph, scale, clamp, bias, dropout_mask, return_weights):
    """q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv) contiguous; bias, mask (E, H) or None.
    Returns out (N_dst, H, Dv), lse (N_dst, H) in the accumulation dtype, weights (E, H) or None."""
    (n_dst, h), num_edges = q.shape[:2], graph.num_edges
    bias_t, mask_t, dims, flags = _shared_args(q, v, scale, clamp, bias, dropout_mask)
    out = torch.empty(n_dst, h, v.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.empty(n_dst, h, dtype=accumulation_dtype(q.dtype), device=q.device)
    weights = torch.empty(num_edges, h, dtype=q.dtype, device=q.device) if return_weights else lse
    _fwd_kernel[(n_dst, h)](
        q, k, v, bias_t, mask_t, out, lse, weights, *graph.csr(),
        *_strides(q), *_strides(k), *_strides(v), *_strides(out), *_strides(bias), *_strides(dropout_mask), *dims,
        RETURN_WEIGHTS=return_weights, **flags, **_config(q.shape[2], v.shape[2], num_edges / n_dst))
    return out, lse, (weights if return_weights else None)


def _triton_backward(q, k, v, graph, scale, clamp, bias, dropout_mask, lse, d_out, d_weights):
    """Gradients (dq, dk, dv, dscore) of out (and of weights, if d_weights is given); dscore is
    (E, H) in caller order and the accumulation dtype: it is dbias."""
    (n_dst, h), n_src, num_edges = q.shape[:2], k.shape[0], graph.num_edges
    acc = accumulation_dtype(q.dtype)
    bias_t, mask_t, dims, flags = _shared_args(q, v, scale, clamp, bias, dropout_mask)
    d_out = d_out.contiguous()
    delta = torch.empty(n_dst, h, dtype=acc, device=q.device)  # sum_e p_e dp_e = <do, out> (+ p . dweights)
    ds = torch.empty(num_edges, h, dtype=acc, device=q.device)  # p dp, then dscore; caller order
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _bwd_dq_kernel[(n_dst, h)](
        q, k, v, bias_t, mask_t, d_out, lse, d_weights if d_weights is not None else ds, dq, delta, ds, *graph.csr(),
        *_strides(q), *_strides(k), *_strides(v), *_strides(d_out), *_strides(bias), *_strides(dropout_mask),
        *_strides(d_weights), *dims, HAS_DW=d_weights is not None, **flags,
        **_config(q.shape[2], v.shape[2], num_edges / n_dst))
    _bwd_dkdv_kernel[(n_src, h)](
        q, k, bias_t, mask_t, d_out, lse, delta, ds, dk, dv, *graph.csc(),
        *_strides(q), *_strides(k), *_strides(v), *_strides(d_out), *_strides(bias), *_strides(dropout_mask), *dims,
        **flags, **_config(q.shape[2], v.shape[2], num_edges / n_src))
    return dq, dk, dv, ds


def _on(device: torch.device):
    """Launch on the tensors' GPU (Triton launches on the current CUDA device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class _TritonEdgeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_mask, graph, scale, clamp, return_weights):
        with _on(q.device):
            out, lse, weights = _triton_forward(q, k, v, graph, scale, clamp, bias, dropout_mask, return_weights)
        ctx.save_for_backward(q, k, v, bias, dropout_mask, lse)
        ctx.graph, ctx.scale, ctx.clamp = graph, scale, clamp
        return out, weights

    @staticmethod
    def backward(ctx, d_out, d_weights):
        q, k, v, bias, dropout_mask, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            grads = reference_backward((q, k, v, bias), ctx.needs_input_grad[:4], ctx.graph, scale=ctx.scale,
                                       clamp=ctx.clamp, dropout_mask=dropout_mask, grad_out=d_out,
                                       grad_weights=d_weights)
            return (*grads, None, None, None, None, None)
        if d_out is None:  # only the weights were used
            d_out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        with _on(q.device):
            dq, dk, dv, ds = _triton_backward(q, k, v, ctx.graph, ctx.scale, ctx.clamp, bias, dropout_mask, lse,
                                              d_out, d_weights)
        dbias = ds.to(bias.dtype) if bias is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, dbias, None, None, None, None, None


def _check_runnable(q: Tensor) -> None:
    interpreted = not isinstance(_fwd_kernel, triton.runtime.jit.JITFunction)  # TRITON_INTERPRET=1 at import
    if q.device.type != "cuda" and not (q.device.type == "cpu" and interpreted):
        raise RuntimeError(f"the triton backend needs CUDA tensors, got {q.device.type} (on CPU it runs only in "
                           "Triton's interpreter: set TRITON_INTERPRET=1 before the backend is first used)")


def triton_attention(
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
    """The fused Triton backend, with the signature of `reference_attention`.
    q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv) with D, Dv <= 256; bias, dropout_mask:
    (E, H) in caller edge order or None. float16/bfloat16/float32 accumulate in float32, float64
    in float64. Returns out (N_dst, H, Dv) and, if asked, weights (E, H) in caller order."""
    _check_runnable(q)
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"the triton backend supports float16, bfloat16, float32 and float64, got {q.dtype}")
    if max(q.shape[2], v.shape[2]) > MAX_HEAD_DIM:
        raise ValueError(f"the triton backend supports head dims up to {MAX_HEAD_DIM}, got D={q.shape[2]}, "
                         f"Dv={v.shape[2]}; use another backend")
    if graph.num_edges == 0 or min(q.shape[2], v.shape[2], q.shape[1]) == 0:
        return reference_attention(q, k, v, graph, scale=scale, clamp=clamp, bias=bias, dropout_mask=dropout_mask,
                                   return_weights=return_weights)
    if dropout_mask is not None:
        dropout_mask = dropout_mask.detach()
    return _TritonEdgeAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bias, dropout_mask, graph,
                                      scale, clamp, return_weights)


__all__ = ["triton_attention", "MAX_HEAD_DIM"]
