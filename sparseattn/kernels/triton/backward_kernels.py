"""The two backward kernels of the triton backend (see the package doc): `dq_kernel` walks the
destination-sorted CSR (dq, delta, dp per edge), `dkdv_kernel` the source-sorted one (dk, dv,
dscore and the edge terms' gradients). Both recompute the forward's weights with its helpers."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_common import edge_keys, gather, score, weight


@triton.jit
def dq_kernel(
    Q,
    K,
    V,
    BIAS,
    MASK,
    DO,
    STATS,
    S,
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
    SAVE_SCORES: tl.constexpr,
    WIDE: tl.constexpr,
    ACC: tl.constexpr,
):
    """One pass per destination t and group of BLOCK_H heads (`BACKWARD_LAYOUTS`): with g = clamp
    indicator and key_e = (k[s] + edge_key[e]) * edge_scale[e], delta = sum p dp and dq = scale
    sum g p (dp - delta) key; dp per edge and head into DP. delta is known only after the pass, so
    dq = scale (sum g p (dp - c) key - (delta - c) sum g p key) with a shift c, the dp of the
    largest weight so far (the first sum is shifted along when c changes): where one weight is near
    1 and its dp near delta, neither sum is large, where c = 0 would cancel two sums of size
    |dp key| into a far smaller dq (errors up to 20x csr's, 1e4x where nearly all weights round
    away). SAVE_SCORES: the scores are read from S (E, H), the forward's, in caller order."""
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
        kt = gather(K, src, heads, offs_d, sk_n, sk_h, live_h, D).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_D)
        if HAS_EDGE_KEY or HAS_EDGE_SCALE:
            kt = edge_keys(
                kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D, HAS_EDGE_KEY, HAS_EDGE_SCALE
            )
        if SAVE_SCORES:  # the forward's scores, bit for bit (common.score)
            s = tl.load(S + pos[:, None] * H + heads[None, :], mask=live_h, other=0.0)
        else:
            s = score(kt, q[None, :, :], sc, WIDE)  # (BLOCK_E, BLOCK_H)
            if HAS_BIAS:
                s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
        p = tl.where(live_h, weight(s, m[None, :], z[None, :], lo, hi, CLAMP), 0.0)
        vt = gather(V, src, heads, offs_dv, sv_n, sv_h, live_h, DV).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_DV)
        if HAS_EDGE_VALUE:
            vt += gather(EV, pos, heads, offs_dv, sev_e, sev_h, live_h, DV).to(ACC)
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
def dkdv_kernel(
    Q,
    K,
    BIAS,
    MASK,
    DO,
    STATS,
    S,
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
    SAVE_SCORES: tl.constexpr,
    WIDE: tl.constexpr,
    ACC: tl.constexpr,
):
    """One pass per source u and group of BLOCK_H heads. DS holds dp from `dq_kernel` and
    leaves holding dscore = g p (dp - delta): overwritten in place, so a triton.autotune of this
    kernel needs restore_value=["DS"]. DEK, DEV, DES: the edge terms' gradients, (E, H, D / Dv)
    contiguous in caller order, written where their GRAD_ flag is set; SAVE_SCORES: the scores are
    read from S (E, H), the forward's, in caller order."""
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
        qt = gather(Q, dst, heads, offs_d, sq_n, sq_h, live_h, D).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_D)
        key = k[None, :, :]  # k[s] + edge_key[e], broadcast over the edges without edge keys
        if HAS_EDGE_KEY:
            key = key + gather(EK, pos, heads, offs_d, sek_e, sek_h, live_h, D).to(ACC)
        kt = key  # the forward's keys, (k[s] + edge_key[e]) * edge_scale[e], so that s is the forward's
        if HAS_EDGE_SCALE:
            es = gather(ES, pos, heads, offs_d, ses_e, ses_h, live_h, D).to(ACC)
            kt = key * es
        if SAVE_SCORES:  # the forward's scores, bit for bit (common.score)
            s = tl.load(S + slot, mask=live_h, other=0.0)
        else:
            s = score(kt, qt, sc, WIDE)  # (BLOCK_E, BLOCK_H)
            if HAS_BIAS:
                s += tl.load(BIAS + pos[:, None] * sb_e + heads[None, :] * sb_h, mask=live_h, other=0.0).to(ACC)
        stat = STATS + (dst[:, None] * H + heads[None, :]) * 2  # (BLOCK_E, BLOCK_H): m, then z
        m = tl.load(stat, mask=live_h, other=0.0)
        z = tl.load(stat + 1, mask=live_h, other=1.0)
        p = tl.where(live_h, weight(s, m, z, lo, hi, CLAMP), 0.0)
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
        dot = gather(DO, dst, heads, offs_dv, sdo_n, sdo_h, live_h, DV).to(ACC)  # (BLOCK_E, BLOCK_H, BLOCK_DV)
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
