"""The dense backend's call: gather each bucket's rows, pick its path, scatter the results back.

Each bucket (plan.py) takes one of three paths, decided from the call's options and the bucket's
shape before any work (`_bucket_attention`):
    exact mode, no bias/dropout/weights, an SDPA shape   F.scaled_dot_product_attention
    clamp mode, no bias/dropout/weights                  `_plain_clamp`: traced ops, the fused
                                                         Triton kernel, or tiles + SDPA by row
    anything else                                        `_materialized`: (B, H, lq, lk) weights
                                                         with torch's own autograd
Half types run in float32, except that on CUDA the SDPA calls and the fused kernel take them as they
are (their kernels accumulate in float32; an H100 ran the float32 SDPA kernel 5-10x slower).

Shapes: q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), bias/dropout_mask (E, H); per bucket
qb (B, H, lq, D), kb (B, H, lk, D), vb (B, H, lk, Dv).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._tracing import tracing
from ..contract import AttentionInputs
from ..guard import claim_finite_inputs
from ..reference import accumulation_dtype
from .plan import Bucket, plan
from .tiles import CLAMP_TILE_BYTES, DenseClampAttention, clamp_forward_differentiable

# float32 stays on the materialized path: in IEEE float32 products the fused backward took 18-60x
# longer than it (H100, complete and causal blocks of 128-2048 tokens, H=8, D=64)
FUSED_CLAMP_DTYPES = (torch.float16, torch.bfloat16)


def _pad(x: Tensor, rows: Tensor, pos: Tensor, start: int, b: int, length: int, rows_of_x: Optional[Tensor]) -> Tensor:
    """A bucket's rows of x (N, H, D) -> (B, H, length, D), zeros in the padding. rows_of_x: x[rows]
    gathered already (`_gather_once`), or None to read them here."""
    if _all_rows(x, start, b, length):
        xb = x  # all rows in order: a view (a slice would cost a zero-filled copy in backward)
    elif start >= 0:  # contiguous and unpadded: the rows as they are
        xb = x[start : start + b * length] if rows_of_x is None else rows_of_x
    else:
        xb = x.new_zeros(b * length, *x.shape[1:]).index_put((pos,), x[rows] if rows_of_x is None else rows_of_x)
    return xb.view(b, length, *x.shape[1:]).transpose(1, 2)


def _all_rows(x: Tensor, start: int, b: int, length: int) -> bool:
    """Whether a bucket's b * length rows starting at `start` are all of x's rows, in order."""
    return start == 0 and b * length == x.shape[0]


def _gather_once(x: Tensor, row_sets: List[Optional[Tensor]]) -> List[Optional[Tensor]]:
    """x[rows] for each rows that is not None, from one gather split per bucket. For training: the
    backward of a gather or slice fills a zero tensor of x's size, so once in all, not once per
    bucket (which made zero fills and their sums a third of a batch of variable-length blocks'
    forward+backward). Without autograd the buckets read their rows one at a time instead, so that
    only one bucket's copy is alive at once."""
    wanted = [r for r in row_sets if r is not None]
    if not wanted:
        return [None] * len(row_sets)
    parts = iter(torch.split(x[torch.cat(wanted)], [r.numel() for r in wanted]))
    return [None if r is None else next(parts) for r in row_sets]


def _scatter_edges(values: Tensor, bk: Bucket) -> Tensor:
    """(E, H) per-edge values -> (B, H, lq, lk) at the bucket's dense positions, 0 elsewhere."""
    heads = values.shape[1]
    dense = values.new_zeros(bk.b * bk.lq * bk.lk, heads).index_put((bk.pos,), values[bk.eids])
    return dense.view(bk.b, bk.lq, bk.lk, heads).permute(0, 3, 1, 2)


def _clamp_cannot_bind(qb: Tensor, kb: Tensor, scale: float, clamp: Tuple[float, float], causal: bool) -> Tensor:
    """Per row, whether none of its scores can leave [lo, hi]: by Cauchy-Schwarz,
    |scale <q_i, k_j>| <= |scale| * |q_i| * max_j |k_j| over the keys row i sees (all of the
    block's, or j <= i when causal), O(N * D). Such rows' clamp-exp weights equal exact softmax.
    qb: (B, H, lq, D), kb: (B, H, lk, D). Returns (B, H, lq, 1) bool; NaN or inf gives False.
    Row by row, so a row's choice (and its bits) depends only on what it attends to."""
    limit = min(clamp[1], -clamp[0])  # |score| <= limit keeps it inside [lo, hi]
    if limit < 0:
        return torch.zeros(*qb.shape[:3], 1, dtype=torch.bool, device=qb.device)
    with torch.no_grad():
        # (B, L, H, D) is the rows' own contiguous layout: norms there, not on the transposed view
        qn, kn = (  # (B, H, L), in float32 at least for half inputs
            torch.linalg.vector_norm(x.transpose(1, 2), dim=-1, dtype=accumulation_dtype(x.dtype)).transpose(1, 2)
            for x in (qb, kb)
        )
        kmax = kn.cummax(-1).values if causal else kn.amax(-1, keepdim=True)
        return (qn.mul_(kmax).mul_(abs(scale)) <= limit)[..., None]  # NaN compares False


def _tensor_cores_take(dtype: torch.dtype, capability: Tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability multiplies dtype on tensor cores in Triton:
    float16 from Turing (7.5) on, bfloat16 from Ampere (8.0) on."""
    return capability >= ((8, 0) if dtype == torch.bfloat16 else (7, 5))


def _fused_clamp_kernel(qb: Tensor, kb: Tensor, vb: Tensor) -> Optional[Callable[..., Tensor]]:
    """`triton_blocks.block_clamp_attention` when it takes clamp mode on this unpadded full/causal
    bucket: CUDA inputs of FUSED_CLAMP_DTYPES on a GPU whose tensor cores take them, triton
    importable, shapes it runs (`triton_blocks.runs`); else None."""
    if not qb.is_cuda or qb.dtype not in FUSED_CLAMP_DTYPES:
        return None
    if not _tensor_cores_take(qb.dtype, torch.cuda.get_device_capability(qb.device)):
        return None
    try:
        from . import triton_blocks as blocks
    except ImportError:
        return None
    return blocks.block_clamp_attention if blocks.runs(qb, kb, vb) else None


def _sdpa(qb: Tensor, kb: Tensor, vb: Tensor, bk: Bucket, scale: float) -> Tensor:
    """Exact softmax on an SDPA-shaped bucket (`bk.sdpa_shape`) -> (B, H, lq, Dv): the inputs as they
    are on CUDA, elsewhere in the accumulation dtype."""
    if not qb.is_cuda:
        qb, kb, vb = (t.to(accumulation_dtype(t.dtype)) for t in (qb, kb, vb))
    return F.scaled_dot_product_attention(qb, kb, vb, is_causal=bk.kind == "causal", scale=scale)


def _plain_clamp(
    qb: Tensor, kb: Tensor, vb: Tensor, bk: Bucket, scale: float, clamp: Tuple[float, float], tile_bytes: int
) -> Tuple[Tensor, bool]:
    """Clamp mode without bias, dropout or returned weights on one bucket (inputs in the caller's
    dtype) -> (B, H, lq, Dv), and whether q and k were shown finite. Traced code:
    `clamp_forward_differentiable` for every row. Eager: the fused kernel where it runs;
    DenseClampAttention's tiles on other shapes; on SDPA shapes, exact softmax (SDPA) for the rows
    the clamp provably cannot reach and the tiles for the others. All rows on SDPA shows q and k
    finite (`_clamp_cannot_bind` is False on NaN and inf), and every weight at least
    exp(-2 * limit) / lk: each key is read with a positive weight (by itself when causal)."""
    causal = bk.kind == "causal"
    acc = accumulation_dtype(qb.dtype)
    if tracing():
        # One differentiable expression, no branch on the data: the eager route looks at the rows
        # (`_clamp_cannot_bind`, a graph break); through DenseClampAttention torch 2.13 breaks the
        # graph too (its backward reads the clamp bounds with .item()) and torch 2.11 compiled it to
        # zero gradients (H100 run, tests/kernels/test_compile.py).
        qa, ka, va = (t.to(acc) for t in (qb, kb, vb))
        return clamp_forward_differentiable(qa, ka, va, bk.mask, scale, clamp), False
    fused = _fused_clamp_kernel(qb, kb, vb) if bk.sdpa_shape else None
    if fused is not None:
        return fused(qb, kb, vb, scale=scale, clamp=clamp, causal=causal), False
    qa, ka, va = (t.to(acc) for t in (qb, kb, vb))
    if not bk.sdpa_shape:
        return DenseClampAttention.apply(qa, ka, va, bk, scale, clamp, tile_bytes), False
    exact = _clamp_cannot_bind(qa, ka, scale, clamp, causal)  # (B, H, lq, 1)
    if bool(exact.all()):
        return _sdpa(qb, kb, vb, bk, scale), True
    out = DenseClampAttention.apply(qa, ka, va, bk, scale, clamp, tile_bytes)
    if bool(exact.any()):
        out = torch.where(exact, _sdpa(qb, kb, vb, bk, scale).to(out.dtype), out)
    return out, False


def _materialized(
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    bk: Bucket,
    scale: float,
    clamp: Optional[Tuple[float, float]],
    bias: Optional[Tensor],
    dropout_mask: Optional[Tensor],
    return_weights: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Any mode and options, with the (B, H, lq, lk) weights in memory and torch's autograd: out
    (B, H, lq, Dv) and, if asked, the normalized weights (B, H, lq, lk), in the accumulation dtype;
    bias/dropout_mask (E, H) in that dtype already."""
    qb, kb, vb = (t.to(accumulation_dtype(t.dtype)) for t in (qb, kb, vb))
    scores = torch.matmul(qb, kb.transpose(-1, -2)) * scale  # (B, H, lq, lk)
    if bias is not None:
        scores = scores + _scatter_edges(bias, bk)
    if clamp is not None:
        w = torch.exp(scores.clamp(clamp[0], clamp[1]))
        if bk.mask is not None:
            w = w.masked_fill(~bk.mask, 0.0)
    else:
        if bk.mask is not None:
            scores = scores.masked_fill(~bk.mask, float("-inf"))
        m = scores.detach().amax(-1, keepdim=True)
        m = m.masked_fill(torch.isneginf(m), 0.0)  # a row without edges (or all -inf) gets w = 0
        w = torch.exp(scores - m)
    z = w.sum(-1, keepdim=True)
    z = torch.where(z == 0, torch.ones_like(z), z)  # no edges: out = 0; a NaN sum stays NaN
    wm = w if dropout_mask is None else w * _scatter_edges(dropout_mask, bk)
    return torch.matmul(wm, vb) / z, (w / z if return_weights else None)


def _bucket_attention(q, k, v, bk: Bucket, gathered, scale, clamp, bias, dropout_mask, return_weights, tile_bytes):
    """One bucket, q/k/v in the caller's dtype, `gathered` its rows of them or Nones (`_pad`);
    bias/dropout_mask in the accumulation dtype; tile_bytes: the clamp tiles' budget. Returns out
    (B * lq, H, Dv) in q's dtype, normalized weights (B, H, lq, lk) or None, and whether the
    bucket's inputs were shown finite (`_plain_clamp`)."""
    qb = _pad(q, bk.qrows, bk.qpos, bk.q0, bk.b, bk.lq, gathered[0])  # (B, H, lq, D)
    kb = _pad(k, bk.krows, bk.kpos, bk.k0, bk.b, bk.lk, gathered[1])  # (B, H, lk, D)
    vb = _pad(v, bk.krows, bk.kpos, bk.k0, bk.b, bk.lk, gathered[2])  # (B, H, lk, Dv)
    plain = bias is None and dropout_mask is None and not return_weights
    weights, finite = None, False
    if plain and clamp is None and bk.sdpa_shape:
        out = _sdpa(qb, kb, vb, bk, scale)
    elif plain and clamp is not None:
        out, finite = _plain_clamp(qb, kb, vb, bk, scale, clamp, tile_bytes)
    else:
        out, weights = _materialized(qb, kb, vb, bk, scale, clamp, bias, dropout_mask, return_weights)
    out = out.transpose(1, 2).reshape(bk.b * bk.lq, out.shape[1], out.shape[3])  # (B * lq, H, Dv)
    return out.to(q.dtype), weights, finite


def dense_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "dense" backend (the contract in contract.py; graphs with recorded blocks only,
    ValueError otherwise): out (N_dst, H, Dv) in q's dtype and, if asked, weights (E, H) in the
    graph's edge order. Half types arrive only on CUDA (its SDPA and fused kernels take them)."""
    q, k, v, graph, scale, clamp = inputs.q, inputs.k, inputs.v, inputs.graph, inputs.scale, inputs.clamp
    bias, dropout_mask, return_weights = inputs.bias, inputs.dropout_mask, inputs.return_weights
    p = plan(graph)
    heads, dtype, acc = q.shape[1], q.dtype, accumulation_dtype(q.dtype)
    bias = None if bias is None else bias.to(acc)
    dropout_mask = None if dropout_mask is None else dropout_mask.to(acc)
    rows, outs, eids, ws = [], [], [], []
    once = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    qrows = [bk.qrows if once and not _all_rows(q, bk.q0, bk.b, bk.lq) else None for bk in p.buckets]
    krows = [bk.krows if once and not _all_rows(k, bk.k0, bk.b, bk.lk) else None for bk in p.buckets]
    gathered = zip(_gather_once(q, qrows), _gather_once(k, krows), _gather_once(v, krows))
    tile_bytes = inputs.options.dense_tile_bytes or CLAMP_TILE_BYTES
    finite = bool(p.buckets)  # every bucket showed its inputs finite
    for bk, rows_of in zip(p.buckets, gathered):
        out, w, shown = _bucket_attention(
            q, k, v, bk, rows_of, scale, clamp, bias, dropout_mask, return_weights, tile_bytes
        )
        finite = finite and shown
        rows.append(bk.qrows)
        outs.append(out if bk.q0 >= 0 else out[bk.qpos])
        if return_weights:
            eids.append(bk.eids)
            ws.append(w.permute(0, 2, 3, 1).reshape(bk.b * bk.lq * bk.lk, heads)[bk.pos])  # (E_bucket, H)
    if p.contiguous_out:
        result = outs[0]
    else:
        linked = q[:0].sum() + k[:0].sum() + v[:0].sum()  # keeps q, k, v in the graph when there are no blocks
        result = q.new_zeros(graph.num_dst, heads, v.shape[2]) + linked
        if outs:
            result = result.index_put((torch.cat(rows),), torch.cat(outs))
    if finite:
        claim_finite_inputs()
    weights = None
    if return_weights:
        weights = q.new_zeros(graph.num_edges, heads, dtype=acc)
        if ws:
            weights = weights.index_put((torch.cat(eids),), torch.cat(ws))
        weights = weights.to(dtype)
    return result, weights


__all__ = ["dense_attention", "FUSED_CLAMP_DTYPES"]
