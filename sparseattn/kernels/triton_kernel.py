"""The triton backend: edge attention fused into one forward and two backward Triton kernels.

Forward (`_fwd_kernel`): one program per destination t and head h (or all heads: `LAYOUTS`, chosen
by `_config`) walks t's in-edges in the destination-sorted CSR in tiles of BLOCK_E, gathers k[s, h]
and v[s, h], and accumulates z = sum w_e and wv = sum w_e m_e v[s] in registers in float32 (float64
for float64 inputs), with w_e = exp(clamp(score_e)) or, for clamp=None, an online max as in
FlashAttention. It writes
out[t, h] = wv / (z + eps) once (0 without in-edges when eps = 0) and two statistics per
destination and head, stats = (m, z + eps) with m the max score (exact) or 0 (clamp), so that
p_e = w_e / (z + eps) = exp(logit_e - m) / (z + eps) (`_weight`; every kernel computes the scores
with `_score`, so the backward's p_e are the forward's). Bias, dropout mask, edge terms and
returned weights stay in the caller's edge order, read and written through perm (each sorted
edge's caller position).

Edge terms (each optional; absent ones compile away through the HAS_EDGE_* flags): per edge and head
the key is (k[s] + edge_key[e]) * edge_scale[e] and the value v[s] + edge_value[e]; the kernels load
those rows where they load k[s] and v[s], so no (E, H, D) tensor is made besides the inputs and their
gradients. An (E, 1, .) term, shared by the heads, is read with head stride 0.

Backward recomputes the weights; nothing of shape (E, H, D) is ever stored but the edge terms'
gradients. With dp_e = m_e <do[t], v[s] + edge_value[e]> + dweights_e and g_e clamp's gradient
indicator (1 in exact mode):
    dscore_e = g_e p_e (dp_e - delta[t]),   delta[t] = sum_{e -> t} p_e dp_e  (= <do[t], out[t]> + ...).
`_bwd_dq_kernel` walks the CSR once: delta in float32 (not from the rounded output, which costs
half-precision gradients accuracy), dq[t] = scale sum g p (dp - delta) key_e (shifted, see the
kernel), and dp per edge into an (E, H) buffer in caller order. `_bwd_dkdv_kernel` walks the
transposed CSR (per source): dscore = g p (dp - delta), which it leaves in that buffer as dbias;
with G_e = scale dscore_e q[t], dk[s] = sum_e G_e edge_scale[e], dv[s] = sum_e p_e m_e do[t], and
per edge d edge_key[e] = G_e edge_scale[e], d edge_scale[e] = G_e (k[s] + edge_key[e]),
d edge_value[e] = p_e m_e do[t] (a shared term's per-head rows are summed afterwards). Each
backward kernel runs one program per node and head, or per node for all heads
(`BACKWARD_LAYOUTS`, `backward_config`). No atomics, so
every run gives bit-identical gradients. Under create_graph=True (double backward) backward
recomputes through the reference instead (`reference.differentiable_grads`), whose gradients torch
can differentiate again.

The launches are two custom ops, `sparseattn::triton_attention_fwd`/`_bwd`, with an autograd rule:
eager, compiled and exported code call the same ops, and a compiled graph holds them whole. Runs on
CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before this module was imported
(tests do that).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .contract import AttentionInputs
from .op_autograd import with_autograd
from .reference import accumulation_dtype, differentiable_grads, op_grads

MAX_HEAD_DIM = 256
_TL_DTYPE = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def _logit(s, lo, hi, CLAMP: tl.constexpr):
    """clamp(s, lo, hi) with NaN kept NaN (like torch.clamp); s itself in exact mode."""
    if CLAMP:
        s = tl.where(s < lo, lo, tl.where(s > hi, hi, s))
    return s


@triton.jit
def _fold(x, LANES: tl.constexpr):
    """Sum a (BLOCK_E, ...) tile over its edges, keeping the axis; with per-lane accumulators
    (LANES) each edge slot keeps its own partial sum and nothing is reduced in the loop."""
    if not LANES:
        x = tl.sum(x, 0, keep_dims=True)
    return x


@triton.jit
def _fold_max(x, LANES: tl.constexpr):
    if not LANES:
        x = tl.max(x, 0, keep_dims=True)
    return x


@triton.jit
def _gather(P, rows, heads, offs, s_n, s_h, live_h, width):
    """P[rows, heads, :width] as a (BLOCK_E, BLOCK_H, BLOCK_X) tile, 0 where live_h (BLOCK_E, BLOCK_H) is False."""
    mask = live_h[:, :, None] & (offs < width)[None, None, :]
    return tl.load(
        P + rows[:, None, None] * s_n + heads[None, :, None] * s_h + offs[None, None, :], mask=mask, other=0.0
    )


@triton.jit
def _edge_keys(
    kt,
    EK,
    ES,
    pos,
    heads,
    offs_d,
    sek_e,
    sek_h,
    ses_e,
    ses_h,
    live_h,
    D,
    HAS_EDGE_KEY: tl.constexpr,
    HAS_EDGE_SCALE: tl.constexpr,
):
    """Gathered keys kt (BLOCK_E, BLOCK_H, BLOCK_D) -> (kt + edge_key[pos]) * edge_scale[pos]."""
    if HAS_EDGE_KEY:
        kt += _gather(EK, pos, heads, offs_d, sek_e, sek_h, live_h, D).to(kt.dtype)
    if HAS_EDGE_SCALE:
        kt *= _gather(ES, pos, heads, offs_d, ses_e, ses_h, live_h, D).to(kt.dtype)
    return kt


@triton.jit
def _score(kt, q, sc):
    """The scores of a tile, sum_d kt * q times the scale, (BLOCK_E, BLOCK_H): kt the keys with their
    edge terms (`_edge_keys`), q the queries, both broadcast to (BLOCK_E, BLOCK_H, BLOCK_D). Every
    kernel computes them here, in one association: a peaked softmax turns the last bit of a large
    score into a relative error of its weight, which dscore = p (dp - delta) then cancels into."""
    return tl.sum(kt * q, 2) * sc


@triton.jit
def _weight(s, m, z, lo, hi, CLAMP: tl.constexpr):
    """p = exp(logit - m) / z from the forward's statistics m (the max score; 0 in clamp mode) and
    z (+ eps), as the forward normalizes: a log-sum-exp m + log z in one float would round off
    log z's low bits (1e-4 relative at m = 2e3 in float32), and exp(-log z) is a bit off 1 / z."""
    return tl.exp(_logit(s, lo, hi, CLAMP) - m) / z


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    BIAS,
    MASK,
    OUT,
    STATS,
    W,
    EK,
    EV,
    ES,
    PTR,
    IDX,
    PERM,
    sq_n,
    sq_h,
    sk_n,
    sk_h,
    sv_n,
    sv_h,
    so_n,
    so_h,
    sb_e,
    sb_h,
    sm_e,
    sm_h,
    sek_e,
    sek_h,
    sev_e,
    sev_h,
    ses_e,
    ses_h,
    H,
    D,
    DV,
    SCALARS,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    LANES: tl.constexpr,
    V_EARLY: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CLAMP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    RETURN_WEIGHTS: tl.constexpr,
    HAS_EDGE_KEY: tl.constexpr,
    HAS_EDGE_VALUE: tl.constexpr,
    HAS_EDGE_SCALE: tl.constexpr,
    HAS_EPS: tl.constexpr,
    ACC: tl.constexpr,
):
    """One program per destination t and group of BLOCK_H heads (see LAYOUTS). Accumulators have
    ROWS = BLOCK_E rows with per-lane accumulators (LANES), else 1: z, m (ROWS, BLOCK_H),
    acc (ROWS, BLOCK_H, BLOCK_DV); the lanes are combined once, after the loop. EK, EV, ES: the edge
    terms (E, H or 1, D / Dv) in caller order, read when their HAS_ flag is set; HAS_EPS: SCALARS[3]
    is eps."""
    ROWS: tl.constexpr = BLOCK_E if LANES else 1
    TERMS: tl.constexpr = HAS_EDGE_KEY or HAS_EDGE_VALUE or HAS_EDGE_SCALE
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    in_h = heads < H
    sc, lo, hi = tl.load(SCALARS), tl.load(SCALARS + 1), tl.load(SCALARS + 2)  # in ACC
    offs_e, offs_d, offs_dv = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    start, end = tl.load(PTR + t), tl.load(PTR + t + 1)
    q = tl.load(
        Q + t * sq_n + heads[:, None] * sq_h + offs_d[None, :], mask=in_h[:, None] & (offs_d[None, :] < D), other=0.0
    ).to(ACC)  # (BLOCK_H, BLOCK_D)
    m_i = tl.full([ROWS, BLOCK_H], float("-inf"), ACC)  # running max of the scores (exact mode)
    z_i = tl.zeros([ROWS, BLOCK_H], ACC)
    acc = tl.zeros([ROWS, BLOCK_H, BLOCK_DV], ACC)
    for e0 in tl.range(start, end, BLOCK_E, num_stages=NUM_STAGES):
        e = e0 + offs_e
        live = e < end
        live_h = live[:, None] & in_h[None, :]  # (BLOCK_E, BLOCK_H)
        src = tl.load(IDX + e, mask=live, other=0)
        if TERMS:  # the edge terms' gathers need each edge's caller-order position up front
            pos = tl.load(PERM + e, mask=live, other=0)
        kt = _gather(K, src, heads, offs_d, sk_n, sk_h, live_h, D).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_D)
        if V_EARLY:  # one memory round trip for both gathers
            vt = _gather(V, src, heads, offs_dv, sv_n, sv_h, live_h, DV).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_DV)
            if HAS_EDGE_VALUE:
                vt += _gather(EV, pos, heads, offs_dv, sev_e, sev_h, live_h, DV).to(ACC)
        if HAS_EDGE_KEY or HAS_EDGE_SCALE:
            kt = _edge_keys(
                kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D, HAS_EDGE_KEY, HAS_EDGE_SCALE
            )
        s = _score(kt, q[None, :, :], sc)  # (BLOCK_E, BLOCK_H)
        if (HAS_BIAS or HAS_MASK) and not TERMS:
            pos = tl.load(PERM + e, mask=live, other=0)  # caller-order position of each edge
        if HAS_BIAS:
            s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
        if CLAMP:
            w = tl.where(live_h, tl.exp(_logit(s, lo, hi, CLAMP)), 0.0)
            z_i += _fold(w, LANES)
        else:
            s = tl.where(live_h, s, float("-inf"))
            m_new = tl.maximum(m_i, _fold_max(s, LANES))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: w = 0, no NaN
            alpha = tl.exp(m_i - m_use)
            w = tl.exp(s - m_use)
            z_i = z_i * alpha + _fold(w, LANES)
            acc, m_i = acc * alpha[:, :, None], m_new
        if HAS_MASK:
            w = w * tl.load(MASK + pos[:, None] * sm_e + heads[None, :] * sm_h, mask=live_h, other=0.0).to(ACC)
        if not V_EARLY:
            vt = _gather(V, src, heads, offs_dv, sv_n, sv_h, live_h, DV).to(ACC)
            if HAS_EDGE_VALUE:
                vt += _gather(EV, pos, heads, offs_dv, sev_e, sev_h, live_h, DV).to(ACC)
        acc += _fold(w[:, :, None] * vt, LANES)
    if CLAMP:
        m = tl.zeros([BLOCK_H], ACC)
        z, wv = tl.sum(z_i, 0), tl.sum(acc, 0)
    else:  # rescale every lane to the common max
        m = tl.max(m_i, 0)
        m = tl.where(m == float("-inf"), 0.0, m)  # (BLOCK_H,)
        f = tl.exp(m_i - m[None, :])  # 0 for a lane that saw no edge
        z, wv = tl.sum(z_i * f, 0), tl.sum(acc * f[:, :, None], 0)
    if HAS_EPS:
        z += tl.load(SCALARS + 3)
    z_safe = tl.where(z > 0, z, 1.0)  # no in-edges (and eps = 0): wv = 0, so out = 0
    tl.store(
        OUT + t * so_n + heads[:, None] * so_h + offs_dv[None, :],
        (wv / z_safe[:, None]).to(OUT.dtype.element_ty),
        mask=in_h[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(STATS + (t * H + heads) * 2, m, mask=in_h)
    tl.store(STATS + (t * H + heads) * 2 + 1, z_safe, mask=in_h)
    if RETURN_WEIGHTS:  # second pass over the scores, now that m and z are known
        for e0 in range(start, end, BLOCK_E):
            e = e0 + offs_e
            live = e < end
            live_h = live[:, None] & in_h[None, :]
            src = tl.load(IDX + e, mask=live, other=0)
            pos = tl.load(PERM + e, mask=live, other=0)
            kt = _gather(K, src, heads, offs_d, sk_n, sk_h, live_h, D).to(ACC)
            if HAS_EDGE_KEY or HAS_EDGE_SCALE:
                kt = _edge_keys(
                    kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D, HAS_EDGE_KEY, HAS_EDGE_SCALE
                )
            s = _score(kt, q[None, :, :], sc)
            if HAS_BIAS:
                s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
            p = _weight(s, m[None, :], z_safe[None, :], lo, hi, CLAMP)
            tl.store(W + pos[:, None] * H + heads[None, :], p.to(W.dtype.element_ty), mask=live_h)


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    BIAS,
    MASK,
    DO,
    STATS,
    DW,
    DQ,
    DELTA,
    DP,
    EK,
    EV,
    ES,
    PTR,
    IDX,
    PERM,
    sq_n,
    sq_h,
    sk_n,
    sk_h,
    sv_n,
    sv_h,
    sdo_n,
    sdo_h,
    sb_e,
    sb_h,
    sm_e,
    sm_h,
    sw_e,
    sw_h,
    sek_e,
    sek_h,
    sev_e,
    sev_h,
    ses_e,
    ses_h,
    H,
    D,
    DV,
    SCALARS,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CLAMP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_EDGE_KEY: tl.constexpr,
    HAS_EDGE_VALUE: tl.constexpr,
    HAS_EDGE_SCALE: tl.constexpr,
    ACC: tl.constexpr,
):
    """One pass per destination t and group of BLOCK_H heads (`BACKWARD_LAYOUTS`): with g = clamp
    indicator and key_e = (k[s] + edge_key[e]) * edge_scale[e], delta = sum p dp and dq = scale
    sum g p (dp - delta) key; dp per edge and head into DP. delta is known only after the pass, so
    dq = scale (sum g p (dp - c) key - (delta - c) sum g p key) with a shift c, the dp of the
    largest weight so far (the first sum is shifted along when c changes): where one weight is near
    1 and its dp near delta, neither sum is large, where c = 0 would cancel two sums of size
    |dp key| into a far smaller dq (errors up to 20x csr's, 1e4x where nearly all weights round
    away)."""
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    in_h = heads < H
    sc, lo, hi = tl.load(SCALARS), tl.load(SCALARS + 1), tl.load(SCALARS + 2)  # in ACC
    offs_e, offs_d, offs_dv = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    start, end = tl.load(PTR + t), tl.load(PTR + t + 1)
    q = tl.load(
        Q + t * sq_n + heads[:, None] * sq_h + offs_d[None, :], mask=in_h[:, None] & (offs_d[None, :] < D), other=0.0
    ).to(ACC)  # (BLOCK_H, BLOCK_D)
    do = tl.load(
        DO + t * sdo_n + heads[:, None] * sdo_h + offs_dv[None, :],
        mask=in_h[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    ).to(ACC)  # (BLOCK_H, BLOCK_DV)
    m = tl.load(STATS + (t * H + heads) * 2, mask=in_h, other=0.0)  # (BLOCK_H,)
    z = tl.load(STATS + (t * H + heads) * 2 + 1, mask=in_h, other=1.0)
    delta = tl.zeros([BLOCK_H], ACC)
    c = tl.zeros([BLOCK_H], ACC)  # the shift: dp of the largest weight so far
    top = tl.zeros([BLOCK_H], ACC)  # that weight
    gpdpc_k = tl.zeros([BLOCK_H, BLOCK_D], ACC)  # sum g p (dp - c) key
    gp_k = tl.zeros([BLOCK_H, BLOCK_D], ACC)  # sum g p key
    for e0 in tl.range(start, end, BLOCK_E, num_stages=NUM_STAGES):
        e = e0 + offs_e
        live = e < end
        live_h = live[:, None] & in_h[None, :]  # (BLOCK_E, BLOCK_H)
        src = tl.load(IDX + e, mask=live, other=0)
        pos = tl.load(PERM + e, mask=live, other=0)
        kt = _gather(K, src, heads, offs_d, sk_n, sk_h, live_h, D).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_D)
        if HAS_EDGE_KEY or HAS_EDGE_SCALE:
            kt = _edge_keys(
                kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D, HAS_EDGE_KEY, HAS_EDGE_SCALE
            )
        s = _score(kt, q[None, :, :], sc)  # (BLOCK_E, BLOCK_H)
        if HAS_BIAS:
            s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
        p = tl.where(live_h, _weight(s, m[None, :], z[None, :], lo, hi, CLAMP), 0.0)
        vt = _gather(V, src, heads, offs_dv, sv_n, sv_h, live_h, DV).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_DV)
        if HAS_EDGE_VALUE:
            vt += _gather(EV, pos, heads, offs_dv, sev_e, sev_h, live_h, DV).to(ACC)
        dp = tl.sum(vt * do[None, :, :], 2)  # <do[t], v[s] + edge_value[e]>
        if HAS_MASK:
            dp *= tl.load(MASK + pos[:, None] * sm_e + heads[None, :] * sm_h, mask=live_h, other=0.0).to(ACC)
        if HAS_DW:
            dp += tl.load(DW + pos[:, None] * sw_e + heads[None, :] * sw_h, mask=live_h, other=0.0).to(ACC)
        delta += tl.sum(p * dp, 0)
        tile_top = tl.max(p, 0)  # (BLOCK_H,)
        new_c = tl.where(tile_top > top, tl.max(tl.where(p == tile_top[None, :], dp, float("-inf")), 0), c)
        gpdpc_k -= (new_c - c)[:, None] * gp_k  # the edges so far, shifted to the new c
        c, top = new_c, tl.maximum(top, tile_top)
        gp = p
        if CLAMP:  # torch.clamp's gradient passes where lo <= s <= hi
            gp = tl.where((s >= lo) & (s <= hi), p, 0.0)
        gp_k += tl.sum(gp[:, :, None] * kt, 0)
        gpdpc_k += tl.sum((gp * (dp - c[None, :]))[:, :, None] * kt, 0)
        tl.store(DP + pos[:, None] * H + heads[None, :], dp, mask=live_h)
    tl.store(DELTA + t * H + heads, delta, mask=in_h)
    tl.store(
        DQ + t * sq_n + heads[:, None] * sq_h + offs_d[None, :],
        ((gpdpc_k - (delta - c)[:, None] * gp_k) * sc).to(DQ.dtype.element_ty),
        mask=in_h[:, None] & (offs_d[None, :] < D),
    )


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    BIAS,
    MASK,
    DO,
    STATS,
    DELTA,
    DS,
    DK,
    DV_OUT,
    EK,
    EV,
    ES,
    DEK,
    DEV,
    DES,
    PTR,
    IDX,
    PERM,
    sq_n,
    sq_h,
    sk_n,
    sk_h,
    sv_n,
    sv_h,
    sdo_n,
    sdo_h,
    sb_e,
    sb_h,
    sm_e,
    sm_h,
    sek_e,
    sek_h,
    sev_e,
    sev_h,
    ses_e,
    ses_h,
    H,
    D,
    DV,
    SCALARS,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CLAMP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_EDGE_KEY: tl.constexpr,
    HAS_EDGE_VALUE: tl.constexpr,
    HAS_EDGE_SCALE: tl.constexpr,
    GRAD_EDGE_KEY: tl.constexpr,
    GRAD_EDGE_VALUE: tl.constexpr,
    GRAD_EDGE_SCALE: tl.constexpr,
    ACC: tl.constexpr,
):
    """One pass per source u and group of BLOCK_H heads. DS holds dp from `_bwd_dq_kernel` and
    leaves holding dscore = g p (dp - delta): overwritten in place, so a triton.autotune of this
    kernel needs restore_value=["DS"]. DEK, DEV, DES: the edge terms' gradients, (E, H, D / Dv)
    contiguous in caller order, written where their GRAD_ flag is set."""
    u = tl.program_id(0).to(tl.int64)  # a source node; PTR/IDX/PERM are the transposed CSR
    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    in_h = heads < H
    sc, lo, hi = tl.load(SCALARS), tl.load(SCALARS + 1), tl.load(SCALARS + 2)  # in ACC
    offs_e, offs_d, offs_dv = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    start, end = tl.load(PTR + u), tl.load(PTR + u + 1)
    k = tl.load(
        K + u * sk_n + heads[:, None] * sk_h + offs_d[None, :], mask=in_h[:, None] & (offs_d[None, :] < D), other=0.0
    ).to(ACC)  # (BLOCK_H, BLOCK_D)
    dk = tl.zeros([BLOCK_H, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_H, BLOCK_DV], ACC)
    for e0 in tl.range(start, end, BLOCK_E, num_stages=NUM_STAGES):
        e = e0 + offs_e
        live = e < end
        live_h = live[:, None] & in_h[None, :]  # (BLOCK_E, BLOCK_H)
        live_d = live_h[:, :, None] & (offs_d < D)[None, None, :]
        dst = tl.load(IDX + e, mask=live, other=0)
        pos = tl.load(PERM + e, mask=live, other=0)
        slot = pos[:, None] * H + heads[None, :]  # (edge, head) in caller order, (BLOCK_E, BLOCK_H)
        qt = _gather(Q, dst, heads, offs_d, sq_n, sq_h, live_h, D).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_D)
        key = k[None, :, :]  # k[s] + edge_key[e], broadcast over the edges without edge keys
        if HAS_EDGE_KEY:
            key = key + _gather(EK, pos, heads, offs_d, sek_e, sek_h, live_h, D).to(ACC)
        kt = key  # the forward's keys, (k[s] + edge_key[e]) * edge_scale[e], so that s is the forward's
        if HAS_EDGE_SCALE:
            es = _gather(ES, pos, heads, offs_d, ses_e, ses_h, live_h, D).to(ACC)
            kt = key * es
        s = _score(kt, qt, sc)  # (BLOCK_E, BLOCK_H)
        if HAS_BIAS:
            s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
        stat = STATS + (dst[:, None] * H + heads[None, :]) * 2  # (BLOCK_E, BLOCK_H): m, then z
        m = tl.load(stat, mask=live_h, other=0.0)
        z = tl.load(stat + 1, mask=live_h, other=1.0)
        p = tl.where(live_h, _weight(s, m, z, lo, hi, CLAMP), 0.0)
        delta = tl.load(DELTA + dst[:, None] * H + heads[None, :], mask=live_h, other=0.0)
        ds = p * (tl.load(DS + slot, mask=live_h, other=0.0) - delta)  # not p dp - p delta: that cancels
        if CLAMP:
            ds = tl.where((s >= lo) & (s <= hi), ds, 0.0)
        tl.store(DS + slot, ds, mask=live_h)
        g = ds[:, :, None] * qt  # (BLOCK_E, BLOCK_H, BLOCK_D): the score's gradient per key channel, / scale
        if HAS_EDGE_SCALE:
            if GRAD_EDGE_SCALE:
                tl.store(
                    DES + slot[:, :, None] * D + offs_d[None, None, :],
                    (g * key * sc).to(DES.dtype.element_ty),
                    mask=live_d,
                )
            g *= es
        if GRAD_EDGE_KEY:
            tl.store(DEK + slot[:, :, None] * D + offs_d[None, None, :], (g * sc).to(DEK.dtype.element_ty), mask=live_d)
        dk += tl.sum(g, 0)
        if HAS_MASK:
            p *= tl.load(MASK + pos[:, None] * sm_e + heads[None, :] * sm_h, mask=live_h, other=0.0).to(ACC)
        dot = _gather(DO, dst, heads, offs_dv, sdo_n, sdo_h, live_h, DV).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_DV)
        pdo = p[:, :, None] * dot
        if GRAD_EDGE_VALUE:
            tl.store(
                DEV + slot[:, :, None] * DV + offs_dv[None, None, :],
                pdo.to(DEV.dtype.element_ty),
                mask=live_h[:, :, None] & (offs_dv < DV)[None, None, :],
            )
        dv += tl.sum(pdo, 0)
    tl.store(
        DK + u * sk_n + heads[:, None] * sk_h + offs_d[None, :],
        (dk * sc).to(DK.dtype.element_ty),
        mask=in_h[:, None] & (offs_d[None, :] < D),
    )
    tl.store(
        DV_OUT + u * sv_n + heads[:, None] * sv_h + offs_dv[None, :],
        dv.to(DV_OUT.dtype.element_ty),
        mask=in_h[:, None] & (offs_dv[None, :] < DV),
    )


def _dims(d: int, dv: int) -> Tuple[int, int]:
    """BLOCK_D, BLOCK_DV: D and Dv padded to powers of two."""
    return triton.next_power_of_2(max(d, 1)), triton.next_power_of_2(max(dv, 1))


def _tiles(d: int, dv: int, mean_degree: float) -> dict:
    """Tile sizes of the tile and lanes forward layouts (`_dims`); an edge tile covers the mean
    degree (16 to 64 edges) but at most ~2048 elements per gathered tile, so registers do not spill."""
    block_d, block_dv = _dims(d, dv)
    widest = max(block_d, block_dv)
    block_e = min(triton.next_power_of_2(max(16, math.ceil(mean_degree))), 64, max(16, 2048 // widest))
    return dict(BLOCK_E=block_e, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=4 if block_e * widest >= 2048 else 2)


def _bwd_tiles(d: int, dv: int) -> dict:
    """Tile sizes of the backward kernels' tile layout: 8 edges per tile and one warp per 512
    elements of a gathered tile (1 to 4). Measured on an H100 (bf16, H=8, D=64; benchmarks/results/):
    8 edges with 1 warp took fwd+bwd from 85 to 65 ms on a 1M-node random graph, 31 to 11 ms on
    window r=8, and 15 to 7 ms on complete 512-token blocks against `_tiles`' 16-64 edges with 2-4
    warps."""
    block_d, block_dv = _dims(d, dv)
    warps = max(1, min(4, 8 * max(block_d, block_dv) // 512))
    return dict(BLOCK_E=8, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=warps)


def _heads_tiles(d: int, dv: int, heads: int) -> dict:
    """BLOCK_H (all heads, padded to a power of two) and BLOCK_E of a layout with all heads in one
    program: an edge tile of BLOCK_E * BLOCK_H * max(BLOCK_D, BLOCK_DV) near 2048 elements, BLOCK_E
    from 1 to 16."""
    block_d, block_dv = _dims(d, dv)
    block_h = triton.next_power_of_2(max(heads, 1))
    per_edge = block_h * max(block_d, block_dv)
    return dict(BLOCK_H=block_h, BLOCK_E=min(16, 1 << max(0, (2048 // per_edge).bit_length() - 1)))


# Forward layouts, measured against each other on an H100 (`_config` picks; benchmarks/results/):
#   tile:  one program per (destination, head); each edge tile is reduced in the loop, v gathered after the
#          score (three dependent memory round trips per tile); the loop is not explicitly pipelined.
#   lanes: one program per (destination, head); k and v gathered together, one accumulator per edge slot
#          (no reduction inside the loop, lanes combined once at the end), loop pipelined with num_stages.
#   heads: one program per destination for all heads: (BLOCK_E, H, D) tiles read whole H * D source rows
#          and the index once instead of H times; k and v gathered together, pipelined with num_stages.
LAYOUTS = {
    "tile": dict(all_heads=False, LANES=False, V_EARLY=False),
    "lanes": dict(all_heads=False, LANES=True, V_EARLY=True),
    "heads": dict(all_heads=True, LANES=False, V_EARLY=True),
}
DEFAULT_LAYOUT = "heads"
_overrides: dict = {}  # set by forward_config()


@contextlib.contextmanager
def _overriding(overrides: dict, settings: dict):
    """Inside the block, overrides (a module-level dict) also holds settings; restored on exit."""
    saved = dict(overrides)
    overrides.update(settings)
    try:
        yield
    finally:
        overrides.clear()
        overrides.update(saved)


def _overridden(cfg: dict, overrides: dict) -> dict:
    """cfg with a *_config block's settings in force (its num_stages is the kernels' NUM_STAGES;
    its layout was read already)."""
    cfg.update({("NUM_STAGES" if k == "num_stages" else k): v for k, v in overrides.items() if k != "layout"})
    return cfg


@contextlib.contextmanager
def forward_config(**settings):
    """Inside the block, forward launches use these settings (layout, BLOCK_E, num_warps, num_stages)
    instead of `_config`'s choice: how benchmarks sweep the layouts and tests cover them."""
    unknown = set(settings) - {"layout", "BLOCK_E", "num_warps", "num_stages"}
    if unknown or settings.get("layout", DEFAULT_LAYOUT) not in LAYOUTS:
        raise ValueError(f"bad forward settings {settings}; layouts are {list(LAYOUTS)}")
    with _overriding(_overrides, settings):
        yield


# Backward layouts (`_bwd_config` picks; `backward_config(layout=...)` forces):
#   tile:  one program per (node, head) in each kernel, 8-edge tiles (`_bwd_tiles`), the loop not
#          explicitly pipelined: measured on an H100, the default.
#   heads: one program per node for all heads, as the forward's heads layout: (BLOCK_E, H, D) tiles
#          read whole H * D rows of the gathered nodes and the index once instead of H times, loop
#          pipelined with num_stages. Exact in Triton's interpreter; not yet timed on a GPU
#          (bench_triton_gpu --sweep-backward compares the two).
BACKWARD_LAYOUTS = ("tile", "heads")
DEFAULT_BACKWARD_LAYOUT = "tile"
_bwd_overrides: dict = {}  # set by backward_config()


@contextlib.contextmanager
def backward_config(**settings):
    """Calls whose forward runs inside the block launch their backward kernels with these settings
    (layout, BLOCK_E, num_warps, num_stages) instead of `_bwd_config`'s choice, whenever that
    backward runs: how benchmarks sweep them and tests cover them."""
    unknown = set(settings) - {"layout", "BLOCK_E", "num_warps", "num_stages"}
    if unknown or settings.get("layout", DEFAULT_BACKWARD_LAYOUT) not in BACKWARD_LAYOUTS:
        raise ValueError(f"bad backward settings {settings}; layouts are {list(BACKWARD_LAYOUTS)}")
    with _overriding(_bwd_overrides, settings):
        yield


def _bwd_config(d: int, dv: int, heads: int) -> dict:
    """Launch settings of the two backward kernels, with `backward_config`'s overrides: BLOCK_H,
    BLOCK_E, BLOCK_D, BLOCK_DV, NUM_STAGES (None: no explicit pipelining) and num_warps. tile:
    `_bwd_tiles`; heads: `_heads_tiles`, 4 warps, 2 stages."""
    layout = _bwd_overrides.get("layout", DEFAULT_BACKWARD_LAYOUT)
    cfg = _bwd_tiles(d, dv)
    if layout == "heads":
        cfg.update(_heads_tiles(d, dv, heads), NUM_STAGES=2, num_warps=4)
    else:
        cfg.update(BLOCK_H=1, NUM_STAGES=None)
    return _overridden(cfg, _bwd_overrides)


_LAUNCH = ("BLOCK_H", "BLOCK_E", "NUM_STAGES", "num_warps")  # the settings the backward op carries


def _launch_ints(cfg: dict) -> List[int]:
    """The backward's settings that do not follow from the dims, as the op's int list (0 for NUM_STAGES=None)."""
    return [cfg[k] or 0 for k in _LAUNCH]


def _launch_settings(launch: List[int]) -> dict:
    """`_launch_ints`' inverse."""
    cfg: dict = dict(zip(_LAUNCH, launch))
    cfg["NUM_STAGES"] = cfg["NUM_STAGES"] or None
    return cfg


def _config(d: int, dv: int, heads: int, mean_degree: float) -> dict:
    """Launch settings of `_fwd_kernel`: the layout's flags, BLOCK_H heads per program, tile sizes,
    num_warps, and NUM_STAGES for the edge loop (None: Triton's default, no explicit pipelining).
    tile and lanes use `_tiles`; heads keeps BLOCK_E * BLOCK_H * max(BLOCK_D, BLOCK_DV) near 2048
    elements (BLOCK_E from 1 to 16) with 4 warps. Unless a layout is forced, head sets narrower than
    512 elements (H * D) take tile instead. Forward ms on an H100, bf16, a 65K-node random graph of
    in-degree 16, heads / tile: H=4 D=64 1.12 / 0.77; H=32 D=64 3.32 / 4.22; H=8 D=256 3.47 / 8.98;
    H=16 D=256 6.40 / 17.3 (and H=8 D=64 on 1M nodes 13.2 / 18.3, `benchmarks/results/`)."""
    cfg = _tiles(d, dv, mean_degree)
    all_heads = triton.next_power_of_2(max(heads, 1))
    per_edge = all_heads * max(cfg["BLOCK_D"], cfg["BLOCK_DV"])  # elements of one edge's rows, all heads
    layout = _overrides.get("layout", DEFAULT_LAYOUT)
    if "layout" not in _overrides and layout == "heads" and per_edge < 512:
        layout = "tile"
    flags = dict(LAYOUTS[layout])
    if flags.pop("all_heads"):
        cfg.update(_heads_tiles(d, dv, heads), num_warps=4)
    else:
        cfg.update(BLOCK_H=1)
    cfg.update(NUM_STAGES=None if layout == "tile" else 2, **flags)
    return _overridden(cfg, _overrides)


def _contiguous(index: Tuple[Tensor, ...]) -> Tuple[Tensor, ...]:
    """The kernels read index tensors as dense arrays: a strided view (a transposed edge_index's
    row) would be read wrongly, so one is copied (a no-op for the contiguous ones Graph keeps)."""
    return tuple(t.contiguous() for t in index)


def _strides(t: Optional[Tensor]) -> Tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t is not None else (0, 0)


EdgeTerms = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]  # edge_key, edge_value, edge_scale
_NO_TERMS: EdgeTerms = (None, None, None)


@functools.lru_cache(maxsize=64)
def _scalars(values: Tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """[scale, lo, hi] (and eps, where the forward adds one) as a tensor on the device, made once
    per setting and then only read. A tensor, not float arguments: Triton passes Python floats to
    compiled kernels as float32, which cost float64 inputs 1e-8 relative error on a GPU (the
    interpreter keeps them exact). Made once: a new one per call was a host-to-device copy that
    CUDA's sync debug mode flagged as synchronizing, 18 per Multi30k training step (H100, two per
    attention call)."""
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.tensor(values, dtype=dtype, device=device)


def _shared_args(q, v, scale, clamp, bias, dropout_mask, eps=0.0):
    """What every kernel takes: bias and mask (a never-read stand-in when absent), the dims
    (H, D, Dv) and scalars ([scale, lo, hi], then eps if it is not 0, in the accumulation dtype),
    and the compile-time flags."""
    dummy = q.new_empty(1)
    lo, hi = clamp if clamp is not None else (0.0, 0.0)
    values = (float(scale), float(lo), float(hi)) + ((float(eps),) if eps else ())
    scalars = _scalars(values, accumulation_dtype(q.dtype), q.device)
    flags = dict(
        CLAMP=clamp is not None,
        HAS_BIAS=bias is not None,
        HAS_MASK=dropout_mask is not None,
        ACC=_TL_DTYPE[accumulation_dtype(q.dtype)],
    )
    return (
        bias if bias is not None else dummy,
        dropout_mask if dropout_mask is not None else dummy,
        (q.shape[1], q.shape[2], v.shape[2], scalars),
        flags,
    )


def _edge_args(q: Tensor, terms: EdgeTerms) -> Tuple[Tuple[Tensor, ...], Tuple[int, ...], dict]:
    """The edge terms as kernel arguments: the pointers EK, EV, ES (a never-read stand-in when
    absent), their (edge, head) strides (head stride 0 for an (E, 1, .) term shared by the heads)
    and the HAS_EDGE_* flags. Each term's last dim is contiguous (`triton_attention`)."""
    dummy = q.new_empty(1)
    ptrs = tuple(t if t is not None else dummy for t in terms)
    strides = tuple(
        x for t in terms for x in ((t.stride(0), t.stride(1) if t.shape[1] > 1 else 0) if t is not None else (0, 0))
    )
    names = ("HAS_EDGE_KEY", "HAS_EDGE_VALUE", "HAS_EDGE_SCALE")
    return ptrs, strides, {n: t is not None for n, t in zip(names, terms)}


def _triton_forward(q, k, v, csr, scale, clamp, bias, dropout_mask, return_weights, terms=_NO_TERMS, eps=0.0):
    """q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv) contiguous; csr: the destination-sorted
    (ptr, idx, perm); bias, mask (E, H) or None; terms: edge_key (E, H or 1, D), edge_value
    (E, H or 1, Dv), edge_scale (E, H or 1, D), each or None; eps added to each normalizer. Returns
    out (N_dst, H, Dv), stats (N_dst, H, 2) (m and z: `_weight`) in the accumulation dtype,
    weights (E, H) or None."""
    (n_dst, h), num_edges = q.shape[:2], csr[1].shape[0]
    bias_t, mask_t, dims, flags = _shared_args(q, v, scale, clamp, bias, dropout_mask, eps)
    term_ptrs, term_strides, term_flags = _edge_args(q, terms)
    out = torch.empty(n_dst, h, v.shape[2], dtype=q.dtype, device=q.device)
    stats = torch.empty(n_dst, h, 2, dtype=accumulation_dtype(q.dtype), device=q.device)  # m, z
    weights = torch.empty(num_edges, h, dtype=q.dtype, device=q.device) if return_weights else stats
    cfg = _config(q.shape[2], v.shape[2], h, num_edges / n_dst)
    _fwd_kernel[(n_dst, triton.cdiv(h, cfg["BLOCK_H"]))](
        q,
        k,
        v,
        bias_t,
        mask_t,
        out,
        stats,
        weights,
        *term_ptrs,
        *_contiguous(csr),
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(out),
        *_strides(bias),
        *_strides(dropout_mask),
        *term_strides,
        *dims,
        RETURN_WEIGHTS=return_weights,
        HAS_EPS=bool(eps),
        **flags,
        **term_flags,
        **cfg,
    )
    return out, stats, (weights if return_weights else None)


def _term_grad(t: Optional[Tensor], needed: bool, heads: int, acc: torch.dtype) -> Tuple[Optional[Tensor], bool]:
    """The buffer an edge term's gradient is written into, (E, H, .) contiguous (in the accumulation
    dtype for a term shared by the heads, whose rows are summed afterwards), or None; and whether
    the term is shared."""
    if t is None or not needed:
        return None, False
    shared = t.shape[1] == 1 and heads > 1
    return torch.empty(t.shape[0], heads, t.shape[2], dtype=acc if shared else t.dtype, device=t.device), shared


def _triton_backward(
    q, k, v, csr, csc, scale, clamp, bias, dropout_mask, stats, d_out, d_weights, terms, needs_terms, tiles
):
    """Gradients (dq, dk, dv, dscore, d edge_key, d edge_value, d edge_scale) of out (and of weights,
    if d_weights is given); dscore is (E, H) in caller order and the accumulation dtype: it is
    dbias. The edge terms' gradients are shaped as the terms, None where absent or where
    needs_terms (3 bools) says no. csr, csc: the destination- and source-sorted (ptr, idx, perm);
    tiles: both kernels' launch settings (`_bwd_config`)."""
    (n_dst, h), n_src, num_edges = q.shape[:2], k.shape[0], csr[1].shape[0]
    acc = accumulation_dtype(q.dtype)
    bias_t, mask_t, dims, flags = _shared_args(q, v, scale, clamp, bias, dropout_mask)
    term_ptrs, term_strides, term_flags = _edge_args(q, terms)
    d_out = d_out.contiguous()
    delta = torch.empty(n_dst, h, dtype=acc, device=q.device)  # sum_e p_e dp_e = <do, out> (+ p . dweights)
    ds = torch.empty(num_edges, h, dtype=acc, device=q.device)  # dp, then dscore; caller order
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    d_terms, shared = zip(*(_term_grad(t, need, h, acc) for t, need in zip(terms, needs_terms)))
    heads_grid = triton.cdiv(h, tiles["BLOCK_H"])
    _bwd_dq_kernel[(n_dst, heads_grid)](
        q,
        k,
        v,
        bias_t,
        mask_t,
        d_out,
        stats,
        d_weights if d_weights is not None else ds,
        dq,
        delta,
        ds,
        *term_ptrs,
        *_contiguous(csr),
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(d_out),
        *_strides(bias),
        *_strides(dropout_mask),
        *_strides(d_weights),
        *term_strides,
        *dims,
        HAS_DW=d_weights is not None,
        **flags,
        **term_flags,
        **tiles,
    )
    _bwd_dkdv_kernel[(n_src, heads_grid)](
        q,
        k,
        bias_t,
        mask_t,
        d_out,
        stats,
        delta,
        ds,
        dk,
        dv,
        *term_ptrs,
        *(d if d is not None else ds for d in d_terms),
        *_contiguous(csc),
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(d_out),
        *_strides(bias),
        *_strides(dropout_mask),
        *term_strides,
        *dims,
        GRAD_EDGE_KEY=d_terms[0] is not None,
        GRAD_EDGE_VALUE=d_terms[1] is not None,
        GRAD_EDGE_SCALE=d_terms[2] is not None,
        **flags,
        **term_flags,
        **tiles,
    )
    d_terms = tuple(d.sum(1, keepdim=True).to(t.dtype) if sh else d for d, t, sh in zip(d_terms, terms, shared))
    return (dq, dk, dv, ds, *d_terms)


def _on(device: torch.device):
    """Launch on the tensors' GPU (Triton launches on the current CUDA device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@torch.library.custom_op("sparseattn::triton_attention_fwd", mutates_args=())
def triton_attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    ptr: Tensor,
    idx: Tensor,
    perm: Tensor,
    cptr: Optional[Tensor],
    cidx: Optional[Tensor],
    cperm: Optional[Tensor],
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    edge_key: Optional[Tensor],
    edge_value: Optional[Tensor],
    edge_scale: Optional[Tensor],
    eps: float,
    scale: float,
    clamp: Optional[List[float]],
    return_weights: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The forward kernel as an op: out (N_dst, H, Dv), stats (N_dst, H, 2) in the accumulation
    dtype (m and z, saved for the backward) and the weights (E, H) (empty unless return_weights).
    ptr, idx, perm: the destination-sorted CSR; cptr, cidx, cperm: the source-sorted one, for the
    backward (None when no gradient is wanted); edge_index only for a double backward. edge_key
    (E, H or 1, D), edge_value (E, H or 1, Dv), edge_scale (E, H or 1, D): caller order, last dim
    contiguous."""
    with _on(q.device):
        out, stats, weights = _triton_forward(
            q, k, v, (ptr, idx, perm), scale, _pair(clamp), bias, mask, return_weights,
            (edge_key, edge_value, edge_scale), eps,
        )  # fmt: skip
    return out, stats, weights if weights is not None else q.new_empty(0)


@triton_attention_fwd.register_fake
def _(q, k, v, edge_index, ptr, idx, perm, *rest):
    return_weights = rest[-1]
    (n_dst, h), acc = q.shape[:2], accumulation_dtype(q.dtype)
    weights = q.new_empty(idx.shape[0], h) if return_weights else q.new_empty(0)
    return q.new_empty(n_dst, h, v.shape[2]), q.new_empty(n_dst, h, 2, dtype=acc), weights


@torch.library.custom_op("sparseattn::triton_attention_bwd", mutates_args=())
def triton_attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    idx: Tensor,
    perm: Tensor,
    cptr: Tensor,
    cidx: Tensor,
    cperm: Tensor,
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    edge_key: Optional[Tensor],
    edge_value: Optional[Tensor],
    edge_scale: Optional[Tensor],
    stats: Tensor,
    d_out: Tensor,
    d_weights: Optional[Tensor],
    scale: float,
    clamp: Optional[List[float]],
    launch: List[int],
    needs_terms: List[bool],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The two backward kernels as an op: dq, dk, dv, dscore ((E, H), the accumulation dtype: the
    gradient of bias) and the gradients of edge_key, edge_value, edge_scale (shaped as they are;
    empty where a term is absent or needs_terms says no), launched with the settings `launch` holds:
    `_launch_ints` of `_bwd_config` as it was when the forward ran."""
    tiles = dict(zip(("BLOCK_D", "BLOCK_DV"), _dims(q.shape[2], v.shape[2])), **_launch_settings(launch))
    terms = (edge_key, edge_value, edge_scale)
    with _on(q.device):
        *grads, dek, dev, des = _triton_backward(
            q, k, v, (ptr, idx, perm), (cptr, cidx, cperm), scale, _pair(clamp), bias, mask, stats, d_out, d_weights,
            terms, needs_terms, tiles,
        )  # fmt: skip
    return (*grads, *(d if d is not None else q.new_empty(0) for d in (dek, dev, des)))


@triton_attention_bwd.register_fake
def _(q, k, v, ptr, idx, perm, cptr, cidx, cperm, bias, mask, edge_key, edge_value, edge_scale, *rest):
    needs_terms = rest[-1]
    ds = q.new_empty(idx.shape[0], q.shape[1], dtype=accumulation_dtype(q.dtype))
    terms = (edge_key, edge_value, edge_scale)
    d_terms = (
        t.new_empty(t.shape) if t is not None and need else q.new_empty(0) for t, need in zip(terms, needs_terms)
    )
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), ds, *d_terms)


def _pair(clamp: Optional[List[float]]) -> Optional[Tuple[float, float]]:
    return None if clamp is None else (clamp[0], clamp[1])


# inputs of the forward op, by name: the autograd rule returns a gradient for q, k, v, bias and the edge terms
_FWD_INPUTS = (
    "q k v edge_index ptr idx perm cptr cidx cperm bias mask edge_key edge_value edge_scale eps scale clamp "
    "return_weights"
).split()
_GRADIENTS = ("q", "k", "v", "bias", "edge_key", "edge_value", "edge_scale")
_GRAD_INPUTS = tuple(_FWD_INPUTS.index(n) for n in _GRADIENTS)
_SAVED = "q k v edge_index ptr idx perm cptr cidx cperm bias mask edge_key edge_value edge_scale".split()


def _setup(ctx, inputs, output):
    named = dict(zip(_FWD_INPUTS, inputs))
    ctx.mark_non_differentiable(output[1])  # the stats only reach the backward
    ctx.set_materialize_grads(False)  # no zeros made up for an output left unused
    ctx.save_for_backward(*(named[n] for n in _SAVED), output[1])
    ctx.scale, ctx.clamp, ctx.eps = named["scale"], named["clamp"], named["eps"]
    q, v = named["q"], named["v"]
    ctx.launch = _launch_ints(_bwd_config(q.shape[2], v.shape[2], q.shape[1]))  # as set when the forward ran


def _backward(ctx, d_out, _d_stats, d_weights):
    q, k, v, edge_index, ptr, idx, perm, cptr, cidx, cperm, bias, mask, *terms, stats = ctx.saved_tensors
    wanted = [ctx.needs_input_grad[i] for i in _GRAD_INPUTS]
    if d_weights is not None and d_weights.numel() == 0:
        d_weights = None
    if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
        again = differentiable_grads(
            edge_index, q, k, v, bias, mask, tuple(wanted), ctx.scale, ctx.clamp, d_out, d_weights,
            edge_terms=tuple(terms), eps=ctx.eps,
        )  # fmt: skip
        return op_grads(len(_FWD_INPUTS), _GRAD_INPUTS, again)
    if d_out is None:  # only the weights were used
        d_out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    needs_terms = [want and t is not None for want, t in zip(wanted[4:], terms)]
    dq, dk, dv, ds, *d_terms = triton_attention_bwd(
        q, k, v, ptr, idx, perm, cptr, cidx, cperm, bias, mask, *terms, stats, d_out.contiguous(), d_weights,
        ctx.scale, ctx.clamp, ctx.launch, needs_terms,
    )  # fmt: skip
    dbias = ds.to(bias.dtype) if bias is not None and wanted[3] else None
    d_terms = [d if need else None for d, need in zip(d_terms, needs_terms)]
    return op_grads(len(_FWD_INPUTS), _GRAD_INPUTS, (dq, dk, dv, dbias, *d_terms))


_attention_op = with_autograd(triton_attention_fwd, _setup, _backward)  # an autograd.Function in eager code


def _check_runnable(q: Tensor) -> None:
    interpreted = not isinstance(_fwd_kernel, triton.runtime.jit.JITFunction)  # TRITON_INTERPRET=1 at import
    if q.device.type != "cuda" and not (q.device.type == "cpu" and interpreted):
        raise RuntimeError(
            f"the triton backend needs CUDA tensors, got {q.device.type} (on CPU it runs only in "
            "Triton's interpreter: set TRITON_INTERPRET=1 before the backend is first used)"
        )


def _last_dim_contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    """An edge term as the kernels read it: rows with unit stride (other strides are passed)."""
    return t if t is None or t.stride(2) == 1 else t.contiguous()


def triton_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The fused Triton backend (the contract in contract.py): D, Dv <= 256; float16/bfloat16/float32
    accumulate in float32, float64 in float64. Takes the edge terms and eps (`Backend.edge_terms`)."""
    q, k, v, graph, scale, clamp, bias, dropout_mask, return_weights = inputs[:9]
    _check_runnable(q)
    if max(q.shape[2], v.shape[2]) > MAX_HEAD_DIM:
        raise ValueError(
            f"the triton backend supports head dims up to {MAX_HEAD_DIM}, got D={q.shape[2]}, "
            f"Dv={v.shape[2]}; use another backend"
        )
    terms = tuple(_last_dim_contiguous(t) for t in (inputs.edge_key, inputs.edge_value, inputs.edge_scale))
    differentiable = (q, k, v, bias, *terms)
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in differentiable)
    transposed = graph.csc() if wants_grad else (None, None, None)  # the backward walks both orders
    out, _, weights = _attention_op(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        graph.edge_index,
        *graph.csr(),
        *transposed,
        bias,
        None if dropout_mask is None else dropout_mask.detach(),
        *terms,
        float(inputs.eps),
        scale,
        None if clamp is None else list(clamp),
        return_weights,
    )
    return out, weights if return_weights else None


__all__ = ["triton_attention", "MAX_HEAD_DIM"]
