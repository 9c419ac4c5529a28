"""What every Triton kernel of the package shares, the `triton` backend's and `dense`'s fused block
kernel (`dense/triton_blocks.py`) alike, in a module of its own so that neither backend imports the
other: the jit helpers that gather rows and compute scores and weights (each defined once, so every
kernel computes a score in one association), the padded tile dims, the strides passed to the kernels,
and the launch device."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_HEAD_DIM = 256
TL_DTYPE = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def logit(s, lo, hi, CLAMP: tl.constexpr):
    """clamp(s, lo, hi) with NaN kept NaN (like torch.clamp); s itself in exact mode."""
    if CLAMP:
        s = tl.where(s < lo, lo, tl.where(s > hi, hi, s))
    return s


@triton.jit
def fold(x, LANES: tl.constexpr):
    """Sum a (BLOCK_E, ...) tile over its edges, keeping the axis; with per-lane accumulators
    (LANES) each edge slot keeps its own partial sum and nothing is reduced in the loop."""
    if not LANES:
        x = tl.sum(x, 0, keep_dims=True)
    return x


@triton.jit
def fold_max(x, LANES: tl.constexpr):
    if not LANES:
        x = tl.max(x, 0, keep_dims=True)
    return x


@triton.jit
def gather(P, rows, heads, offs, s_n, s_h, live_h, width):
    """P[rows, heads, :width] as a (BLOCK_E, BLOCK_H, BLOCK_X) tile, 0 where live_h (BLOCK_E, BLOCK_H) is False."""
    mask = live_h[:, :, None] & (offs < width)[None, None, :]
    return tl.load(
        P + rows[:, None, None] * s_n + heads[None, :, None] * s_h + offs[None, None, :], mask=mask, other=0.0
    )


@triton.jit
def edge_keys(
    kt, EK, ES, pos, heads, offs_d, sek_e, sek_h, ses_e, ses_h, live_h, D,
    HAS_EDGE_KEY: tl.constexpr, HAS_EDGE_SCALE: tl.constexpr,
):  # fmt: skip
    """Gathered keys kt (BLOCK_E, BLOCK_H, BLOCK_D) -> (kt + edge_key[pos]) * edge_scale[pos]."""
    if HAS_EDGE_KEY:
        kt += gather(EK, pos, heads, offs_d, sek_e, sek_h, live_h, D).to(kt.dtype)
    if HAS_EDGE_SCALE:
        kt *= gather(ES, pos, heads, offs_d, ses_e, ses_h, live_h, D).to(kt.dtype)
    return kt


@triton.jit
def score(kt, q, sc, WIDE: tl.constexpr):
    """The scores of a tile, sum_d kt * q times the scale, (BLOCK_E, BLOCK_H): kt the keys with their
    edge terms (`edge_keys`), q the queries, both broadcast to (BLOCK_E, BLOCK_H, BLOCK_D). A peaked
    softmax turns the last bit of a large score into a relative error of its weight, which
    dscore = p (dp - delta) then cancels into, so the backward must use the forward's scores bit for
    bit; on a GPU each kernel sums its tile in its own tree and fuses multiply-adds its own way (dq
    1e-3 off on an H100 in float32). So float32 calls that will be differentiated keep the forward's
    scores (`SAVE_SCORES`, (E, H) float32, 4 bytes per edge and head) and the backward kernels read
    them; half types recompute (their rounding is far coarser than a float32 ulp) and float64 too
    (its ulp is far below any tolerance). WIDE (`launch.wide_scores`, the other way, off by default):
    each float32 product rounded on its own and summed in float64, rounded once, so every kernel
    finds the same float32 score in any order."""
    if WIDE:
        return (tl.sum((kt * q).to(tl.float64), 2) * sc).to(tl.float32)
    return tl.sum(kt * q, 2) * sc


@triton.jit
def weight(s, m, z, lo, hi, CLAMP: tl.constexpr):
    """p = exp(logit - m) / z from the forward's statistics m (the max score; 0 in clamp mode) and
    z (+ eps), as the forward normalizes: a log-sum-exp m + log z in one float would round off
    log z's low bits (1e-4 relative at m = 2e3 in float32), and exp(-log z) is a bit off 1 / z."""
    return tl.exp(logit(s, lo, hi, CLAMP) - m) / z


def padded_dims(d: int, dv: int, least: int = 1) -> Tuple[int, int]:
    """BLOCK_D, BLOCK_DV: D and Dv padded to powers of two, at least `least` (tl.dot needs 16)."""
    return max(least, triton.next_power_of_2(max(d, 1))), max(least, triton.next_power_of_2(max(dv, 1)))


def strides(t: Optional[Tensor], ndim: int = 2) -> Tuple[int, ...]:
    """t's first ndim strides, as a kernel takes them (zeros for an absent tensor, never read)."""
    return tuple(t.stride(i) for i in range(ndim)) if t is not None else (0,) * ndim


def on(device: torch.device) -> ContextManager:
    """Launch on the tensors' GPU (Triton launches on the current CUDA device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
