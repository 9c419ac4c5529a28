"""The local backend's tiles as Triton kernels: the GPU form of `tiles.py`, products by `tl.dot`
(tensor cores for half types), nothing of shape (T, S) stored.

A program takes one tile of T consecutive destinations and one query head, and walks the tile's
span of S source rows (starting at t*T - c, `plan.Layout`) in blocks of BLOCK_N keys:

    x = clamp(scale q k^T) + bias     (bias: 0 at an edge, log m at one counted m times, -inf off the edges)
    clamp mode: w = exp(x), z = sum w, out = (w @ v) / z          (the clamp bounds w: no maximum kept)
    exact mode: the same with x unclamped, from a running maximum m as in FlashAttention

Each tile's bias is a (T, S) slab of a bank, `bank[index[t]]`: one shared slab for the interior
tiles of a window, one per boundary tile (`Plan.biases`). Positions outside the source rows read
bias -inf. The backward recomputes p = exp(x - m) / z: `_dq_kernel` per tile (and delta =
sum p dp on the way, in the accumulation type, not from the rounded output), `_dkdv_kernel` per
block of BLOCK_N source rows and kv head, over the tiles whose span holds them and the query heads
of its group (grouped kv heads): no atomics, reproducible bit for bit.

Like `tiles.py`, a NaN or inf in one row reaches the whole tile (the registered backend checks the
results, kernels/guard.py). Half types accumulate in float32, float32 in IEEE float32, float64 in
float64 (the interpreter's exact tests). Runs on CUDA tensors, or on CPU ones when
TRITON_INTERPRET=1 was set before import (tests).

Shapes: q (N_dst, H, D), k (N_src, H_kv, D), v (N_src, H_kv, Dv), contiguous, H_kv dividing H.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...graphs import Graph
from ..triton_common import MAX_HEAD_DIM, logit, on, padded_dims
from .plan import Plan, takes

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Keys per step of a tile's span, and destinations per tile (None: the plan's own choice,
# `local.choose_tile_rows`, tuned on a CPU). Not tuned on a GPU yet: benchmarks/gpu_check.sh times
# other values (bench_triton_gpu's local-triton contenders).
BLOCK_N = 32
TILE_ROWS: Optional[int] = None


@triton.jit
def _dot(a, b, ACC: tl.constexpr, IEEE: tl.constexpr):
    """a @ b accumulated in ACC: IEEE (float32, float64) or on tensor cores in b's half type."""
    if IEEE:
        return tl.dot(a.to(b.dtype), b, input_precision="ieee", out_dtype=ACC)
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def _rows(P, rows, n_rows, head, s_n, s_h, offs, width):
    """P[rows, head, :width] as (len(rows), BLOCK), 0 outside 0 <= row < n_rows and past width."""
    ok = (rows[:, None] >= 0) & (rows[:, None] < n_rows) & (offs[None, :] < width)
    return tl.load(P + rows[:, None].to(tl.int64) * s_n + head * s_h + offs[None, :], mask=ok, other=0.0)


@triton.jit
def _bias(BANK, slab, pos, S, T: tl.constexpr):
    """The tile's bias at span positions pos (BLOCK_N,), (T, BLOCK_N); -inf outside 0 <= pos < S."""
    r = tl.arange(0, T)
    ok = (pos[None, :] >= 0) & (pos[None, :] < S) & (r[:, None] >= 0)
    return tl.load(BANK + (slab * T + r[:, None]).to(tl.int64) * S + pos[None, :], mask=ok, other=float("-inf"))


@triton.jit
def _logits(q, k, b, scale, lo, hi, ACC: tl.constexpr, IEEE: tl.constexpr, CLAMP: tl.constexpr):
    """(scores, x): scores = scale q k^T (T, BLOCK_N) and x = clamp(scores) + bias (unclamped in exact mode)."""
    s = _dot(q, tl.trans(k), ACC, IEEE) * scale
    return s, logit(s, lo, hi, CLAMP) + b


@triton.jit
def _program(C, GROUP, T: tl.constexpr):
    """This program's tile, query head, kv head, destination rows (T,) and first span row."""
    tile, h = tl.program_id(0), tl.program_id(1)
    return tile, h, h // GROUP, tile * T + tl.arange(0, T), tile * T - C


# sizes stay unspecialized, as in dense/triton_blocks.py (a size of 1 made a constant once miscompiled)
_SIZES = ("N_DST", "N_SRC", "H", "GROUP", "S", "C", "D", "DV")


@triton.jit(do_not_specialize=_SIZES)
def _fwd_kernel(
    Q, K, V, BANK, INDEX, OUT, STATS, scale, lo, hi, N_DST, N_SRC, H, GROUP, S, C, D, DV,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_on, s_oh,
    T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, IEEE: tl.constexpr, CLAMP: tl.constexpr,
):  # fmt: skip
    tile, h, hk, rows, start = _program(C, GROUP, T)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = _rows(Q, rows, N_DST, h, s_qn, s_qh, offs_d, D)
    slab = tl.load(INDEX + tile)
    acc = tl.zeros((T, BLOCK_DV), dtype=ACC)
    z = tl.zeros((T,), dtype=ACC)
    m = tl.zeros((T,), dtype=ACC)
    if not CLAMP:
        m += float("-inf")
    for n0 in range(0, S, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        k = _rows(K, start + pos, N_SRC, hk, s_kn, s_kh, offs_d, D)
        v = _rows(V, start + pos, N_SRC, hk, s_vn, s_vh, offs_dv, DV)
        _, x = _logits(q, k, _bias(BANK, slab, pos, S, T), scale, lo, hi, ACC, IEEE, CLAMP)
        if CLAMP:
            w = tl.exp(x)
        else:
            m_new = tl.maximum(m, tl.max(x, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            rescale = tl.exp(m - m_use)
            w = tl.exp(x - m_use[:, None])
            z *= rescale
            acc *= rescale[:, None]
            m = m_new
        z += tl.sum(w, 1)
        acc += _dot(w, v, ACC, IEEE)
    z = tl.where(z == 0.0, 1.0, z)  # rows without any position: only rows past N_DST
    m = tl.where(m == float("-inf"), 0.0, m)
    live = rows < N_DST
    out_ptr = OUT + rows[:, None].to(tl.int64) * s_on + h * s_oh + offs_dv[None, :]
    tl.store(out_ptr, (acc / z[:, None]).to(OUT.dtype.element_ty), mask=live[:, None] & (offs_dv[None, :] < DV))
    stat = STATS + (rows.to(tl.int64) * H + h) * 2
    tl.store(stat, m, mask=live)
    tl.store(stat + 1, z, mask=live)


@triton.jit
def _recompute(q, k, v, do, b, m, z, scale, lo, hi, ACC: tl.constexpr, IEEE: tl.constexpr, CLAMP: tl.constexpr):
    """The backward's view of (tile rows x span block): p = exp(x - m) / z, dp = do v^T, and where the
    clamp passes the gradient (lo <= score <= hi; everywhere in exact mode)."""
    s, x = _logits(q, k, b, scale, lo, hi, ACC, IEEE, CLAMP)
    p = tl.exp(x - m[:, None]) / z[:, None]
    dp = _dot(do, tl.trans(v), ACC, IEEE)
    if CLAMP:
        inside = (s >= lo) & (s <= hi)
    else:
        inside = s == s
    return p, dp, inside


@triton.jit
def _stats(STATS, rows, N_DST, H, h):
    """(m, z) of rows at head h: (0, 1) past N_DST."""
    stat = STATS + (rows.to(tl.int64) * H + h) * 2
    live = (rows >= 0) & (rows < N_DST)
    return tl.load(stat, mask=live, other=0.0), tl.load(stat + 1, mask=live, other=1.0)


@triton.jit(do_not_specialize=_SIZES)
def _dq_kernel(
    Q, K, V, DO, BANK, INDEX, STATS, DQ, DELTA, scale, lo, hi, N_DST, N_SRC, H, GROUP, S, C, D, DV,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh,
    T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, IEEE: tl.constexpr, CLAMP: tl.constexpr,
):  # fmt: skip
    tile, h, hk, rows, start = _program(C, GROUP, T)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = _rows(Q, rows, N_DST, h, s_qn, s_qh, offs_d, D)
    do = _rows(DO, rows, N_DST, h, s_gn, s_gh, offs_dv, DV)
    m, z = _stats(STATS, rows, N_DST, H, h)
    slab = tl.load(INDEX + tile)
    gpdp_k = tl.zeros((T, BLOCK_D), dtype=ACC)  # sum_j g p dp k_j
    gp_k = tl.zeros((T, BLOCK_D), dtype=ACC)  # sum_j g p k_j
    delta = tl.zeros((T,), dtype=ACC)  # sum_j p dp
    for n0 in range(0, S, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        k = _rows(K, start + pos, N_SRC, hk, s_kn, s_kh, offs_d, D)
        v = _rows(V, start + pos, N_SRC, hk, s_vn, s_vh, offs_dv, DV)
        b = _bias(BANK, slab, pos, S, T)
        p, dp, inside = _recompute(q, k, v, do, b, m, z, scale, lo, hi, ACC, IEEE, CLAMP)
        gp = tl.where(inside, p, 0.0)
        delta += tl.sum(p * dp, 1)
        gpdp_k += _dot(gp * dp, k, ACC, IEEE)
        gp_k += _dot(gp, k, ACC, IEEE)
    dq = (gpdp_k - delta[:, None] * gp_k) * scale
    live = rows < N_DST
    dq_ptr = DQ + rows[:, None].to(tl.int64) * s_qn + h * s_qh + offs_d[None, :]
    tl.store(dq_ptr, dq.to(DQ.dtype.element_ty), mask=live[:, None] & (offs_d[None, :] < D))
    tl.store(DELTA + rows.to(tl.int64) * H + h, delta, mask=live)


@triton.jit(do_not_specialize=_SIZES + ("TILES",))
def _dkdv_kernel(
    Q, K, V, DO, BANK, INDEX, STATS, DELTA, DK, DVG, scale, lo, hi, N_DST, N_SRC, H, GROUP, S, C, D, DV, TILES,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh,
    T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ACC: tl.constexpr, IEEE: tl.constexpr, CLAMP: tl.constexpr,
):  # fmt: skip
    block, hk = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    k = _rows(K, cols, N_SRC, hk, s_kn, s_kh, offs_d, D)
    v = _rows(V, cols, N_SRC, hk, s_vn, s_vh, offs_dv, DV)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=ACC)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), dtype=ACC)
    # tile t's span t*T - C .. t*T - C + S - 1 meets these columns for first <= t <= last
    first = (tl.maximum(block * BLOCK_N + C - S + 1, 0) + T - 1) // T
    last = tl.minimum(TILES - 1, (block * BLOCK_N + BLOCK_N - 1 + C) // T)
    for tile in range(first, last + 1):
        rows = tile * T + tl.arange(0, T)
        slab = tl.load(INDEX + tile)
        b = _bias(BANK, slab, cols - (tile * T - C), S, T)
        for i in range(0, GROUP):
            h = hk * GROUP + i
            q = _rows(Q, rows, N_DST, h, s_qn, s_qh, offs_d, D)
            do = _rows(DO, rows, N_DST, h, s_gn, s_gh, offs_dv, DV)
            m, z = _stats(STATS, rows, N_DST, H, h)
            delta = tl.load(DELTA + rows.to(tl.int64) * H + h, mask=rows < N_DST, other=0.0)
            p, dp, inside = _recompute(q, k, v, do, b, m, z, scale, lo, hi, ACC, IEEE, CLAMP)
            ds = tl.where(inside, p * (dp - delta[:, None]), 0.0)
            dv += _dot(tl.trans(p), do, ACC, IEEE)
            dk += _dot(tl.trans(ds), q, ACC, IEEE)
    live = (cols[:, None] < N_SRC) & (offs_d[None, :] < D)
    tl.store(
        DK + cols[:, None].to(tl.int64) * s_kn + hk * s_kh + offs_d[None, :],
        (dk * scale).to(DK.dtype.element_ty),
        mask=live,
    )
    live_v = (cols[:, None] < N_SRC) & (offs_dv[None, :] < DV)
    tl.store(
        DVG + cols[:, None].to(tl.int64) * s_vn + hk * s_vh + offs_dv[None, :], dv.to(DVG.dtype.element_ty), mask=live_v
    )


def tile_bank(p: Plan, device: torch.device, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(bank (slabs, T, S) in dtype (the accumulation type: log m of a repeated edge rounds in it),
    index (tiles,) int32): tile t's bias is bank[index[t]], the plan's interior slabs first (one
    when the interior tiles share their edges), then one per boundary tile. Cached on the plan."""
    key = ("triton_bank", device, dtype)
    if key not in p._bias:
        lay = p.layout
        interior, boundary = p.biases(dtype)
        index = torch.empty(lay.tiles, dtype=torch.int32, device=interior.device)
        inner = torch.arange(lay.first, lay.stop, device=index.device)
        index[inner] = 0 if p.shared else (inner - lay.first).to(torch.int32)
        index[p.boundary] = interior.shape[0] * (lay.interior > 0) + torch.arange(
            p.boundary.numel(), dtype=torch.int32, device=index.device
        )
        bank = torch.cat([interior[: interior.shape[0] * (lay.interior > 0)], boundary])
        p._bias[key] = (bank.to(device).contiguous(), index.to(device))  # type: ignore[index]
    return p._bias[key]  # type: ignore[index]


def _launch(q: Tensor, k: Tensor, v: Tensor, p: Plan, clamp) -> Tuple[dict, dict, torch.dtype]:
    """The kernels' size arguments (with the clamp bounds), compile-time settings and stats dtype."""
    block_d, block_dv = padded_dims(q.shape[2], v.shape[2], least=16)
    wide = q.dtype == torch.float64
    lo, hi = (0.0, 0.0) if clamp is None else (float(clamp[0]), float(clamp[1]))
    lay = p.layout
    sizes = dict(lo=lo, hi=hi, N_DST=q.shape[0], N_SRC=k.shape[0], H=q.shape[1], GROUP=q.shape[1] // k.shape[1])
    sizes.update(S=lay.span, C=lay.offset, D=q.shape[2], DV=v.shape[2])
    meta = dict(T=lay.rows, BLOCK_N=BLOCK_N, BLOCK_D=block_d, BLOCK_DV=block_dv, CLAMP=clamp is not None)
    meta.update(ACC=tl.float64 if wide else tl.float32, IEEE=q.dtype in (torch.float32, torch.float64))
    return sizes, meta, torch.float64 if wide else torch.float32


def forward(q: Tensor, k: Tensor, v: Tensor, p: Plan, scale: float, clamp) -> Tuple[Tensor, Tensor]:
    """out (N_dst, H, Dv) in q's dtype (0 at rows without edges) and stats (N_dst, H, 2) (m, z)."""
    rows = p.layout.rows
    if rows < 16 or rows & (rows - 1):
        raise ValueError(f"the Triton tiles need a power of two >= 16 destinations per tile, got {rows}")
    sizes, meta, acc = _launch(q, k, v, p, clamp)
    bank, index = tile_bank(p, q.device, acc)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    stats = torch.empty(q.shape[0], q.shape[1], 2, dtype=acc, device=q.device)
    with on(q.device):
        _fwd_kernel[(p.layout.tiles, q.shape[1])](
            q, k, v, bank, index, out, stats, scale, **sizes,
            s_qn=q.stride(0), s_qh=q.stride(1), s_kn=k.stride(0), s_kh=k.stride(1),
            s_vn=v.stride(0), s_vh=v.stride(1), s_on=out.stride(0), s_oh=out.stride(1), **meta,
        )  # fmt: skip
    if p.empty_rows.numel():
        out.index_fill_(0, p.empty_rows.to(q.device), 0.0)
    return out, stats


def backward(
    g: Tensor, q: Tensor, k: Tensor, v: Tensor, stats: Tensor, p: Plan, scale: float, clamp
) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (shapes of q, k, v) under the incoming gradient g (N_dst, H, Dv)."""
    sizes, meta, acc = _launch(q, k, v, p, clamp)
    bank, index = tile_bank(p, q.device, acc)
    g = g.contiguous()
    if p.empty_rows.numel():
        g = g.index_fill(0, p.empty_rows.to(g.device), 0.0)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty(q.shape[0], q.shape[1], dtype=stats.dtype, device=q.device)
    strides = dict(
        s_qn=q.stride(0), s_qh=q.stride(1), s_kn=k.stride(0), s_kh=k.stride(1),
        s_vn=v.stride(0), s_vh=v.stride(1), s_gn=g.stride(0), s_gh=g.stride(1),
    )  # fmt: skip
    with on(q.device):
        _dq_kernel[(p.layout.tiles, q.shape[1])](
            q, k, v, g, bank, index, stats, dq, delta, scale, **sizes, **strides, **meta
        )
        _dkdv_kernel[(triton.cdiv(k.shape[0], BLOCK_N), k.shape[1])](
            q, k, v, g, bank, index, stats, delta, dk, dv, scale, **sizes, TILES=p.layout.tiles,
            **strides, **meta,
        )  # fmt: skip
    return dq, dk, dv


def tile_rows(graph: Graph) -> Optional[int]:
    """The plan's tile rows for these kernels: TILE_ROWS where set and the graph's tiles take it."""
    return TILE_ROWS if TILE_ROWS is not None and takes(graph, TILE_ROWS) else None


# TRITON_INTERPRET=1 at import: the kernels then run on CPU tensors (tests)
INTERPRETED = not isinstance(_fwd_kernel, triton.runtime.jit.JITFunction)


def runs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether these kernels take the inputs: CUDA tensors (CPU ones when INTERPRETED), DTYPES, head
    dims up to MAX_HEAD_DIM, no empty axis."""
    where = q.is_cuda or (INTERPRETED and q.device.type == "cpu")
    return (
        where and q.dtype in DTYPES and max(q.shape[-1], v.shape[-1]) <= MAX_HEAD_DIM and min(q.numel(), k.numel()) > 0
    )


__all__ = ["forward", "backward", "runs", "tile_bank", "tile_rows", "DTYPES", "BLOCK_N", "TILE_ROWS", "INTERPRETED"]
