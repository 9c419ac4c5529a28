"""Clamp-mode attention on equal dense blocks, fused in Triton (the dense backend's CUDA path).

For a bucket of B unpadded complete (Lq x Lk) or causal (L x L, key j <= query i) blocks, with
qb (B, H, Lq, D), kb (B, H, Lk, D), vb (B, H, Lk, Dv) as strided views of the caller's rows:
    out[b, h, i] = sum_j w_ij v[b, h, j] / z_i,   w_ij = exp(clamp(scale <q_i, k_j>, lo, hi)),
z_i = sum_j w_ij, as FlashAttention does it: tiles of BLOCK_M queries walk the keys in tiles of
BLOCK_N, scores and weights live in registers only, and nothing of shape (Lq, Lk) is stored. The
clamp bounds the weights, so no running maximum is needed. Products run on tensor cores with
float32 accumulation (half inputs; the weights are rounded to the input type before the second
product, as in FlashAttention) or in IEEE float32 (float32 inputs, exact but slow: the dense
backend sends only half types here); z is accumulated in float32.

Backward recomputes the weights from z. With p = w / z, dp_ij = <do_i, v_j> and g_ij = 1 where
lo <= score <= hi (clamp's gradient), ds_ij = g p (dp - delta_i) with delta_i = sum_j p dp:
`_dq_kernel` walks the keys per query tile and finds delta in float32 on the way
(dq = scale (sum g p dp k - delta sum g p k), one pass, not from the rounded output), and
`_dkdv_kernel` walks the queries per key tile: dv = sum p do, dk = scale sum ds q. No atomics,
so gradients are reproducible bit for bit. Under create_graph=True backward differentiates a
recomputation in plain torch ops instead.

Runs on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before import (tests).
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..triton_common import MAX_HEAD_DIM, logit, on, padded_dims, strides

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _tile(P, s_row, rows, n_rows, cols, n_cols):
    """P[rows, cols] (P already offset to its (batch, head)), 0 outside n_rows x n_cols. Offsets in
    int64: a long block's rows times its row stride can pass 2**31."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(P + rows[:, None].to(tl.int64) * s_row + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _live(rows, cols, n_cols, CAUSAL: tl.constexpr):
    """(BLOCK_M, BLOCK_N): which (query, key) pairs are edges of the block."""
    live = (cols[None, :] < n_cols) & (rows[:, None] >= 0)
    if CAUSAL:
        live = live & (cols[None, :] <= rows[:, None])
    return live


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32: on tensor cores in b's (half) type, or in IEEE float32."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def _recompute(q, k, do, v, z, live, scale, lo, hi, IEEE: tl.constexpr):
    """Backward's view of one (queries x keys) tile: p = w / z (0 off the edges), dp = <do, v>,
    and where clamp passes the gradient (lo <= score <= hi)."""
    s = _dot(q, tl.trans(k), IEEE) * scale
    p = tl.where(live, tl.exp(logit(s, lo, hi, True)) / z[:, None], 0.0)
    return p, _dot(do, tl.trans(v), IEEE), (s >= lo) & (s <= hi)


# Sizes are not specialized (triton makes an argument equal to 1 a constant): on an H100 with triton
# 3.6 that build gave 1-token causal blocks a dq off by 1.41 in float16 and bfloat16 (1.8e-4 and
# 3.6e-3 unspecialized, as in the interpreter), while 2- and 70-token blocks were right
_SIZES = ("H", "LQ", "LK", "D", "DV")


@triton.jit(do_not_specialize=_SIZES)
def _fwd_kernel(
    Q, K, V, Out, Z, scale, lo, hi, H, LQ, LK, D, DV,
    s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    pid_m, bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = _tile(Q + b * s_qb + h * s_qh, s_qm, rows, LQ, offs_d, D)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    z = tl.zeros((BLOCK_M,), dtype=tl.float32)
    end = LK
    if CAUSAL:
        end = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = _tile(K + b * s_kb + h * s_kh, s_kn, cols, LK, offs_d, D)
        v = _tile(V + b * s_vb + h * s_vh, s_vn, cols, LK, offs_dv, DV)
        s = _dot(q, tl.trans(k), IEEE) * scale
        w = tl.where(_live(rows, cols, LK, CAUSAL), tl.exp(logit(s, lo, hi, True)), 0.0)
        z += tl.sum(w, 1)
        acc += _dot(w, v, IEEE)
    z = tl.where(z == 0.0, 1.0, z)  # only rows past LQ: every block row has an edge
    out = acc / z[:, None]
    o_ptr = Out + b * s_ob + h * s_oh + rows[:, None] * s_om + offs_dv[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=(rows[:, None] < LQ) & (offs_dv[None, :] < DV))
    tl.store(Z + bh * LQ + rows, z, mask=rows < LQ)


@triton.jit(do_not_specialize=_SIZES)
def _dq_kernel(
    Q, K, V, DO, Z, DQ, DELTA, scale, lo, hi, H, LQ, LK, D, DV,
    s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om, s_gb, s_gh, s_gm,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    pid_m, bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = _tile(Q + b * s_qb + h * s_qh, s_qm, rows, LQ, offs_d, D)
    do = _tile(DO + b * s_ob + h * s_oh, s_om, rows, LQ, offs_dv, DV)
    z = tl.load(Z + bh * LQ + rows, mask=rows < LQ, other=1.0)
    gpdp_k = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)  # sum_j g p dp k_j
    gp_k = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)  # sum_j g p k_j
    delta = tl.zeros((BLOCK_M,), dtype=tl.float32)  # sum_j p dp
    end = LK
    if CAUSAL:
        end = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = _tile(K + b * s_kb + h * s_kh, s_kn, cols, LK, offs_d, D)
        v = _tile(V + b * s_vb + h * s_vh, s_vn, cols, LK, offs_dv, DV)
        p, dp, inside = _recompute(q, k, do, v, z, _live(rows, cols, LK, CAUSAL), scale, lo, hi, IEEE)
        gp = tl.where(inside, p, 0.0)
        delta += tl.sum(p * dp, 1)
        gpdp_k += _dot(gp * dp, k, IEEE)
        gp_k += _dot(gp, k, IEEE)
    dq = (gpdp_k - delta[:, None] * gp_k) * scale
    dq_ptr = DQ + b * s_gb + h * s_gh + rows[:, None] * s_gm + offs_d[None, :]
    tl.store(dq_ptr, dq.to(DQ.dtype.element_ty), mask=(rows[:, None] < LQ) & (offs_d[None, :] < D))
    tl.store(DELTA + bh * LQ + rows, delta, mask=rows < LQ)


@triton.jit(do_not_specialize=_SIZES)
def _dkdv_kernel(
    Q, K, V, DO, Z, DELTA, DK, DVG, scale, lo, hi, H, LQ, LK, D, DV,
    s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om,
    s_kgb, s_kgh, s_kgn, s_vgb, s_vgh, s_vgn,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    pid_n, bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    k = _tile(K + b * s_kb + h * s_kh, s_kn, cols, LK, offs_d, D)
    v = _tile(V + b * s_vb + h * s_vh, s_vn, cols, LK, offs_dv, DV)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), dtype=tl.float32)
    begin = 0
    if CAUSAL:  # queries before this key tile see none of it
        begin = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start in range(begin, LQ, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        q = _tile(Q + b * s_qb + h * s_qh, s_qm, rows, LQ, offs_d, D)
        do = _tile(DO + b * s_ob + h * s_oh, s_om, rows, LQ, offs_dv, DV)
        z = tl.load(Z + bh * LQ + rows, mask=rows < LQ, other=1.0)
        delta = tl.load(DELTA + bh * LQ + rows, mask=rows < LQ, other=0.0)
        live = _live(rows, cols, LK, CAUSAL) & (rows[:, None] < LQ)
        p, dp, inside = _recompute(q, k, do, v, z, live, scale, lo, hi, IEEE)
        ds = tl.where(inside, p * (dp - delta[:, None]), 0.0)
        dv += _dot(tl.trans(p), do, IEEE)
        dk += _dot(tl.trans(ds), q, IEEE)
    dk_ptr = DK + b * s_kgb + h * s_kgh + cols[:, None] * s_kgn + offs_d[None, :]
    tl.store(dk_ptr, (dk * scale).to(DK.dtype.element_ty), mask=(cols[:, None] < LK) & (offs_d[None, :] < D))
    dv_ptr = DVG + b * s_vgb + h * s_vgh + cols[:, None] * s_vgn + offs_dv[None, :]
    tl.store(dv_ptr, dv.to(DVG.dtype.element_ty), mask=(cols[:, None] < LK) & (offs_dv[None, :] < DV))


def _tiles(d: int, dv: int) -> dict:
    """Query/key tiles, warps and pipeline stages. Up to 64-wide heads: 64 x 64 with 4 warps and 3
    stages, the fastest of 7 settings swept on an H100 in 5 of 6 timings (bf16, H=8, D=64, fwd and
    fwd+bwd on complete 512/2048 and causal 512 blocks; 128 x 128 tiles were 19% faster on causal
    fwd+bwd); wider heads take 32-key tiles and 8 warps (the float32 accumulators share the
    registers; D=128 and 256 ran 1.3-2.4x faster fwd+bwd than the materialized path in two runs)."""
    block_d, block_dv = padded_dims(d, dv, least=16)
    if max(block_d, block_dv) <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8)


def _like_rows(x: Tensor, width: int) -> Tensor:
    """An empty (B, H, L, width) tensor laid out as (B, L, H, width), like the caller's row views."""
    b, h, n = x.shape[:3]
    return torch.empty(b, n, h, width, dtype=x.dtype, device=x.device).transpose(1, 2)


def _strides(t: Tensor) -> Tuple[int, ...]:
    assert t.stride(-1) == 1, "the head dimension must be contiguous"
    return strides(t, 3)


def _forward(qb, kb, vb, scale, lo, hi, causal):
    bsz, heads, lq, d = qb.shape
    lk, dv = kb.shape[2], vb.shape[3]
    out = _like_rows(qb, dv)
    z = torch.empty(bsz * heads, lq, dtype=torch.float32, device=qb.device)
    block_d, block_dv = padded_dims(d, dv, least=16)
    t = _tiles(d, dv)
    grid = (triton.cdiv(lq, t["BLOCK_M"]), bsz * heads)
    _fwd_kernel[grid](
        qb, kb, vb, out, z, scale, lo, hi, heads, lq, lk, d, dv,
        *_strides(qb), *_strides(kb), *_strides(vb), *_strides(out),
        CAUSAL=causal, IEEE=qb.dtype == torch.float32, BLOCK_D=block_d, BLOCK_DV=block_dv, **t,
    )  # fmt: skip
    return out, z


def _backward(qb, kb, vb, z, d_out, scale, lo, hi, causal):
    bsz, heads, lq, d = qb.shape
    lk, dv = kb.shape[2], vb.shape[3]
    d_out = d_out if d_out.stride(-1) == 1 else d_out.contiguous()
    dq, dk, dvv = _like_rows(qb, d), _like_rows(kb, d), _like_rows(vb, dv)
    delta = torch.empty_like(z)
    block_d, block_dv = padded_dims(d, dv, least=16)
    t = _tiles(d, dv)
    common = dict(CAUSAL=causal, IEEE=qb.dtype == torch.float32, BLOCK_D=block_d, BLOCK_DV=block_dv, **t)
    _dq_kernel[(triton.cdiv(lq, t["BLOCK_M"]), bsz * heads)](
        qb, kb, vb, d_out, z, dq, delta, scale, lo, hi, heads, lq, lk, d, dv,
        *_strides(qb), *_strides(kb), *_strides(vb), *_strides(d_out), *_strides(dq), **common,
    )  # fmt: skip
    _dkdv_kernel[(triton.cdiv(lk, t["BLOCK_N"]), bsz * heads)](
        qb, kb, vb, d_out, z, delta, dk, dvv, scale, lo, hi, heads, lq, lk, d, dv,
        *_strides(qb), *_strides(kb), *_strides(vb), *_strides(d_out), *_strides(dk), *_strides(dvv), **common,
    )  # fmt: skip
    return dq, dk, dvv


def recompute(qb: Tensor, kb: Tensor, vb: Tensor, scale: float, lo: float, hi: float, causal: bool) -> Tensor:
    """The same output in differentiable torch ops (float32 at least), for double backward."""
    acc = torch.promote_types(qb.dtype, torch.float32)
    s = torch.matmul(qb.to(acc), kb.to(acc).transpose(-1, -2)) * scale
    w = torch.exp(s.clamp(lo, hi))
    if causal:
        w = w.masked_fill(torch.ones_like(w[0, 0], dtype=torch.bool).triu(1), 0.0)
    return (torch.matmul(w, vb.to(acc)) / w.sum(-1, keepdim=True)).to(qb.dtype)


class _FusedBlockClamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qb, kb, vb, scale: float, lo: float, hi: float, causal: bool):
        with on(qb.device):
            out, z = _forward(qb, kb, vb, scale, lo, hi, causal)
        ctx.save_for_backward(qb, kb, vb, z)
        ctx.args = (scale, lo, hi, causal)
        return out

    @staticmethod
    def backward(ctx, d_out):
        qb, kb, vb, z = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate a recomputation
            with torch.enable_grad():
                again = recompute(qb, kb, vb, *ctx.args)
                grads = torch.autograd.grad(again, (qb, kb, vb), d_out, create_graph=True)
            return (*grads, None, None, None, None)
        with on(qb.device):
            grads = _backward(qb, kb, vb, z, d_out, *ctx.args)
        return (*grads, None, None, None, None)


def runs(qb: Tensor, kb: Tensor, vb: Tensor) -> bool:
    """Whether `block_clamp_attention` takes these inputs: float16/bfloat16/float32, head dims up
    to MAX_HEAD_DIM, contiguous head dimensions and no empty axis."""
    return (
        qb.dtype in DTYPES
        and max(qb.shape[-1], vb.shape[-1]) <= MAX_HEAD_DIM
        and all(t.stride(-1) == 1 and t.numel() > 0 for t in (qb, kb, vb))
    )


def block_clamp_attention(
    qb: Tensor, kb: Tensor, vb: Tensor, *, scale: float, clamp: Tuple[float, float], causal: bool
) -> Tensor:
    """Clamp-mode attention on B equal blocks: qb (B, H, Lq, D), kb (B, H, Lk, D), vb (B, H, Lk, Dv),
    complete blocks or (causal=True, Lq == Lk) key j <= query i. Returns (B, H, Lq, Dv) in qb's
    dtype, laid out as (B, Lq, H, Dv) underneath. Check `runs(qb, kb, vb)` first."""
    if causal and qb.shape[2] != kb.shape[2]:
        raise ValueError(f"causal blocks must be square, got {qb.shape[2]} queries and {kb.shape[2]} keys")
    return _FusedBlockClamp.apply(qb, kb, vb, float(scale), float(clamp[0]), float(clamp[1]), causal)


__all__ = ["block_clamp_attention", "runs", "recompute", "MAX_HEAD_DIM"]
