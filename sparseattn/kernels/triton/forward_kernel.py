"""The forward kernel of the triton backend (see the package doc): one pass over each destination's
in-edges in the destination-sorted CSR, writing out, the statistics (m, z) and the weights."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_common import edge_keys, fold, fold_max, gather, logit, score, weight


@triton.jit
def forward_kernel(
    Q,
    K,
    V,
    BIAS,
    MASK,
    OUT,
    STATS,
    W,
    S,
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
    SAVE_SCORES: tl.constexpr,
    WIDE: tl.constexpr,
    ACC: tl.constexpr,
):
    """One program per destination t and group of BLOCK_H heads (see LAYOUTS). Accumulators have
    ROWS = BLOCK_E rows with per-lane accumulators (LANES), else 1: z, m (ROWS, BLOCK_H),
    acc (ROWS, BLOCK_H, BLOCK_DV); the lanes are combined once, after the loop. EK, EV, ES: the edge
    terms (E, H or 1, D / Dv) in caller order, read when their HAS_ flag is set; HAS_EPS: SCALARS[3]
    is eps; SAVE_SCORES: each edge's score (bias added, before the clamp) into S (E, H) in caller
    order, for the backward (`common.score`)."""
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
        kt = gather(K, src, heads, offs_d, sk_n, sk_h, live_h, D).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_D)
        if V_EARLY:  # one memory round trip for both gathers
            vt = gather(V, src, heads, offs_dv, sv_n, sv_h, live_h, DV).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_DV)
            if HAS_EDGE_VALUE:
                vt += gather(EV, pos, heads, offs_dv, sev_e, sev_h, live_h, DV).to(ACC)
        if HAS_EDGE_KEY or HAS_EDGE_SCALE:
            kt = edge_keys(
                kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D, HAS_EDGE_KEY, HAS_EDGE_SCALE
            )
        s = score(kt, q[None, :, :], sc, WIDE)  # (BLOCK_E, BLOCK_H)
        if (HAS_BIAS or HAS_MASK or SAVE_SCORES) and not TERMS:
            pos = tl.load(PERM + e, mask=live, other=0)  # caller-order position of each edge
        if HAS_BIAS:
            s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
        if SAVE_SCORES:
            tl.store(S + pos[:, None] * H + heads[None, :], s, mask=live_h)
        if CLAMP:
            w = tl.where(live_h, tl.exp(logit(s, lo, hi, CLAMP)), 0.0)
            z_i += fold(w, LANES)
        else:
            s = tl.where(live_h, s, float("-inf"))
            m_new = tl.maximum(m_i, fold_max(s, LANES))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: w = 0, no NaN
            alpha = tl.exp(m_i - m_use)
            w = tl.exp(s - m_use)
            z_i = z_i * alpha + fold(w, LANES)
            acc, m_i = acc * alpha[:, :, None], m_new
        if HAS_MASK:
            w = w * tl.load(MASK + pos[:, None] * sm_e + heads[None, :] * sm_h, mask=live_h, other=0.0).to(ACC)
        if not V_EARLY:
            vt = gather(V, src, heads, offs_dv, sv_n, sv_h, live_h, DV).to(ACC)
            if HAS_EDGE_VALUE:
                vt += gather(EV, pos, heads, offs_dv, sev_e, sev_h, live_h, DV).to(ACC)
        acc += fold(w[:, :, None] * vt, LANES)
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
    z_safe = tl.where(z == 0, 1.0, z)  # no in-edges (and eps = 0): wv = 0, so out = 0; NaN stays
    tl.store(
        OUT + t * so_n + heads[:, None] * so_h + offs_dv[None, :],
        (wv / z_safe[:, None]).to(OUT.dtype.element_ty),
        mask=in_h[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(STATS + (t * H + heads) * 2, m, mask=in_h)
    tl.store(STATS + (t * H + heads) * 2 + 1, z_safe, mask=in_h)
    if RETURN_WEIGHTS:  # second pass over the scores, now that m and z are known
        if SAVE_SCORES:
            tl.debug_barrier()  # the pass reads back S, which other threads of the program wrote
        for e0 in range(start, end, BLOCK_E):
            e = e0 + offs_e
            live = e < end
            live_h = live[:, None] & in_h[None, :]
            src = tl.load(IDX + e, mask=live, other=0)
            pos = tl.load(PERM + e, mask=live, other=0)
            if SAVE_SCORES:
                s = tl.load(S + pos[:, None] * H + heads[None, :], mask=live_h, other=0.0)
            else:
                kt = gather(K, src, heads, offs_d, sk_n, sk_h, live_h, D).to(ACC)
                if HAS_EDGE_KEY or HAS_EDGE_SCALE:
                    kt = edge_keys(
                        kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D, HAS_EDGE_KEY,
                        HAS_EDGE_SCALE,
                    )  # fmt: skip
                s = score(kt, q[None, :, :], sc, WIDE)
                if HAS_BIAS:
                    s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
            p = weight(s, m[None, :], z_safe[None, :], lo, hi, CLAMP)
            tl.store(W + pos[:, None] * H + heads[None, :], p.to(W.dtype.element_ty), mask=live_h)
