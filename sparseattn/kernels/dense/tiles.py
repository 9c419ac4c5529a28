"""Clamp mode on one padded bucket, tile by tile: `DenseClampAttention`, an autograd.Function whose
forward and backward hold the scores of a few (batch, head) pairs and a block of query rows at a
time, so that no (B, H, lq, lk) tensor exists; the backward recomputes the weights. Per tile:
    scores (pairs, rows, keys) = scale * q k^T
    p = softmax(clamp(scores) + off-edge biases)          (= w / sum(w), w = exp(clamp(scores)))
    out = p @ v;  backward: ds = softmax's backward * [lo <= score <= hi]
`clamp_forward_differentiable` is the same output in out-of-place ops that autograd differentiates
(double backward, and traced code).

Shapes: qb (B, H, lq, D), kb (B, H, lk, D), vb (B, H, lk, Dv), any strides with unit last stride;
out (B, H, lq, Dv).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from ..contract import gradient_bounds
from .plan import Bucket, OffEdges

# Each tile's clamp, softmax and products stay in cache. Tiles of 1 MiB of scores measured fastest
# (0.25 and 4 MiB were 3-5% slower) on an AVX-512 EPYC, 1 thread, H=8, D=64, N(0, 1) inputs.
CLAMP_TILE_BYTES = 1 << 20


class _Tile(NamedTuple):
    batch: Union[int, slice]  # one batch element and a range of heads,
    heads: Union[int, slice]  # or one head and a range of batch elements
    rows: slice  # query rows
    keys: slice  # keys 0 .. n (a causal row block sees no later key)

    @property
    def shape(self) -> Tuple[int, int, int]:
        """(pairs, rows, keys) of the tile's scores."""

        def span(s: Union[int, slice]) -> int:
            return 1 if isinstance(s, int) else s.stop - s.start

        return span(self.batch) * span(self.heads), span(self.rows), span(self.keys)


def _clamp_tiles(shape: Tuple[int, int, int, int], elem: int, causal: bool, tile_bytes: int) -> List[_Tile]:
    """Tiles covering the (B, H, lq, lk) scores, each at most tile_bytes of them (or one
    (batch, head) pair): some heads of one batch element, or, when all of a batch element's heads
    fit in a quarter of a tile (small blocks), one head of several batch elements. Either is a 3-D strided
    view of q, k, v in any layout, so nothing is copied. Causal buckets split their query rows in
    blocks (up to 128 rows), each seeing the keys up to its last row; other buckets split them
    where one pair's scores would not fit in a tile (long blocks: 2048 keys, 128 rows)."""
    b, h, lq, lk = shape
    if causal:
        row_block = lq if lq < 64 else min(128, lq // 2)
    else:
        row_block = min(lq, max(1, tile_bytes // (lk * elem)))
    tiles = []
    for r0 in range(0, lq, row_block):
        rows = slice(r0, min(lq, r0 + row_block))
        keys = slice(0, min(lk, rows.stop) if causal else lk)
        pairs = max(1, tile_bytes // ((rows.stop - r0) * keys.stop * elem))  # (batch, head) pairs per tile
        if pairs >= 4 * h:  # small blocks: one head, several batch elements
            tiles += [_Tile(slice(i, min(b, i + pairs)), j, rows, keys) for j in range(h) for i in range(0, b, pairs)]
        else:
            step = min(h, pairs)
            heads = [slice(j, min(h, j + step)) for j in range(0, h, step)]
            tiles += [_Tile(i, hs, rows, keys) for i in range(b) for hs in heads]
    return tiles


def _mats(x: Tensor, t: _Tile, part: slice) -> Tensor:
    """The tile's (pairs, part rows, D) matrices of x: (B, H, L, D), a strided view."""
    return x[t.batch, t.heads, part]


class _Scratch:
    """Buffers the tiles write into (out= ops), made once per call and each as large as the
    largest tile needs: a fresh tensor per tile op made glibc return its pages and fault them in
    again, which slowed the elementwise ops 4-5x on blocks of 2048 keys. `scores(i, t)` is buffer
    i as tile t's (pairs, rows, keys); `result(shape)` the one buffer for (pairs, n, d) products."""

    def __init__(self, like: Tensor, tiles: List[_Tile], d: int, count: int) -> None:
        shapes = [t.shape for t in tiles]
        size = max(p * r * k for p, r, k in shapes)
        self.buffers = [like.new_empty(size) for _ in range(count)]
        self.results = like.new_empty(max(p * max(r, k) for p, r, k in shapes) * d)

    def scores(self, i: int, t: _Tile) -> Tensor:
        p, r, k = t.shape
        return self.buffers[i][: p * r * k].view(p, r, k)

    def result(self, *shape: int) -> Tensor:
        return self.results[: shape[0] * shape[1] * shape[2]].view(shape)


def _tile_scores(qb: Tensor, kb: Tensor, t: _Tile, scale: float, into: Tensor) -> Tensor:
    """scale * q k^T of one tile, written into `into`: (pairs, rows, keys)."""
    q, k = _mats(qb, t, t.rows), _mats(kb, t, t.keys)
    return torch.baddbmm(into, q, k.transpose(1, 2), beta=0.0, alpha=scale, out=into)


def _tile_probs(scores: Tensor, t: _Tile, off: OffEdges, clamp, clamped: Tensor, into: Tensor) -> Tensor:
    """The tile's normalized weights p = w / sum(w) with w = exp(clamp(scores)), 0 off the edges,
    written into `into`: softmax of the clamped scores plus the off-edge biases (written into
    `clamped`, which may be `scores`). Softmax subtracts the row's largest score, which changes no
    weight, and its vectorized exp ran faster here than torch.exp alone. A row without edges gets
    finite weights that the caller discards."""
    c = torch.clamp(scores, *clamp, out=clamped)
    if off.shape is not None:
        c.add_(off.shape[t.rows, t.keys])
    if off.keys is not None:
        c.add_(off.keys[t.batch, :, t.keys])  # (1, keys) or (batch elements, 1, keys)
    return torch.ops.aten._softmax.out(c, -1, False, out=into)


def _rows_layout(x: Tensor, rows: int, cols: int) -> Tensor:
    """An empty (B, H, rows, cols) tensor laid out as x is when x is a (B, L, H, D) tensor seen
    as (B, H, L, D) (the caller's rows), else contiguous: results then need no transposing copy."""
    b, h = x.shape[:2]
    if x.stride(1) < x.stride(2):
        return x.new_empty(b, rows, h, cols).transpose(1, 2)
    return x.new_empty(b, h, rows, cols)


def _without_empty_rows(qb: Tensor, kind: str) -> Tensor:
    """qb with zeros at the rows that have no edges yet hold a caller's query (row 0 of causal
    blocks without self-loops; padding rows are zeros already), so a NaN there reaches no score."""
    return qb.index_fill(2, torch.zeros(1, dtype=torch.long, device=qb.device), 0.0) if kind == "causal_no_self" else qb


def _clamp_forward(qb, kb, vb, off: OffEdges, scale, clamp, causal, tile_bytes: int):
    """qb: (B, H, lq, D), kb: (B, H, lk, D), vb: (B, H, lk, Dv), any strides with unit last stride.
    Returns out (B, H, lq, Dv), 0 at rows without edges."""
    b, h, lq, lk, dv = qb.shape[0], qb.shape[1], qb.shape[2], kb.shape[2], vb.shape[-1]
    out = _rows_layout(qb, lq, dv)
    tiles = _clamp_tiles((b, h, lq, lk), qb.element_size(), causal, tile_bytes)
    scratch = _Scratch(qb, tiles, dv, 2)
    for t in tiles:
        scores = _tile_scores(qb, kb, t, scale, scratch.scores(0, t))
        p = _tile_probs(scores, t, off, clamp, scores, scratch.scores(1, t))
        vt = _mats(vb, t, t.keys)
        _mats(out, t, t.rows).copy_(torch.bmm(p, vt, out=scratch.result(p.shape[0], p.shape[1], dv)))
    return out if off.rows is None else out.masked_fill_(~off.rows, 0.0)


def _clamp_backward(grad_out, qb, kb, vb, off: OffEdges, scale, clamp, causal, tile_bytes: int):
    """Tile by tile, with the weights recomputed: with p = w / sum(w) and dp = grad_out v^T,
    ds = softmax's backward (p * (dp - sum(p * dp))) * [lo <= score <= hi], dq = scale ds k,
    dk = scale ds^T q, dv = p^T grad_out. Shapes as in _clamp_forward; grad_out (B, H, lq, Dv)."""
    b, h, lq, lk, d, dv_cols = qb.shape[0], qb.shape[1], qb.shape[2], kb.shape[2], qb.shape[-1], vb.shape[-1]
    tiles = _clamp_tiles((b, h, lq, lk), qb.element_size(), causal, tile_bytes)
    g = grad_out if off.rows is None else grad_out.masked_fill(~off.rows, 0.0)
    accumulate = any(t.rows.start > 0 for t in tiles)  # row blocks share keys: dk and dv add up
    dq = _rows_layout(qb, lq, d)
    dk, dv = (_rows_layout(x, lk, x.shape[-1]) for x in (kb, vb))
    if accumulate:
        dk.zero_()
        dv.zero_()
    lo, hi = gradient_bounds(clamp, qb.dtype)
    scratch = _Scratch(qb, tiles, max(d, dv_cols), 4)
    for t in tiles:
        scores, work, p, ds = (scratch.scores(i, t) for i in range(4))
        _tile_scores(qb, kb, t, scale, scores)
        _tile_probs(scores, t, off, clamp, work, p)
        gt, qt, kt, vt = _mats(g, t, t.rows), _mats(qb, t, t.rows), _mats(kb, t, t.keys), _mats(vb, t, t.keys)
        dp = torch.bmm(gt, vt.transpose(1, 2), out=work)
        torch.ops.aten._softmax_backward_data.out(dp, p, -1, p.dtype, grad_input=ds)  # one vectorized pass
        ds = torch.ops.aten.hardtanh_backward.grad_input(ds, scores, lo, hi, grad_input=work)  # 0 where clamped
        pairs, rows, keys = scores.shape
        _mats(dq, t, t.rows).copy_(torch.bmm(ds, kt, out=scratch.result(pairs, rows, d)))
        for into, a, bm, cols in ((dv, p, gt, dv_cols), (dk, ds, qt, d)):
            r = torch.bmm(a.transpose(1, 2), bm, out=scratch.result(pairs, keys, cols))
            dst = _mats(into, t, t.keys)
            if accumulate:
                dst.add_(r)
            else:
                dst.copy_(r)
    return dq.mul_(scale), dk.mul_(scale), dv


class DenseClampAttention(torch.autograd.Function):
    """Clamp-mode attention on one padded bucket, without bias, dropout or returned weights:
    out = (w @ v) / sum(w) with w = exp(clamp(scale q k^T)), 0 off the edges. forward(qb, kb, vb,
    bk, scale, clamp, tile_bytes): qb (B, H, lq, D), kb (B, H, lk, D), vb (B, H, lk, Dv), bk the Bucket;
    returns (B, H, lq, Dv), 0 at rows without edges. Forward and backward run in tiles of at most
    tile_bytes scores (`KernelOptions.dense_tile_bytes`, default CLAMP_TILE_BYTES), the backward
    recomputing the weights: memory beyond inputs and outputs is
    O(B * H * lq) plus one tile. The backward is softmax's, through the clamp (zero gradient where
    the score is outside [lo, hi])."""

    @staticmethod
    def forward(ctx, qb, kb, vb, bk: Bucket, scale: float, clamp, tile_bytes: int):
        causal = bk.kind.startswith("causal")
        qz = _without_empty_rows(qb, bk.kind)
        out = _clamp_forward(qz, kb, vb, bk.off_edges, scale, clamp, causal, tile_bytes)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(qb, kb, vb, qz)  # qz is qb unless a row without edges was zeroed
        ctx.bucket, ctx.scale, ctx.clamp, ctx.causal, ctx.tile_bytes = bk, scale, clamp, causal, tile_bytes
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qb, kb, vb, qz = ctx.saved_tensors
        bk = ctx.bucket
        if torch.is_grad_enabled():  # create_graph=True: recompute with differentiable ops
            again = clamp_forward_differentiable(qb, kb, vb, bk.mask, ctx.scale, ctx.clamp)
            wanted = [t for t, need in zip((qb, kb, vb), ctx.needs_input_grad[:3]) if need]
            grads = iter(torch.autograd.grad(again, wanted, grad_out, create_graph=True))
            return (*(next(grads) if need else None for need in ctx.needs_input_grad[:3]), None, None, None, None)
        off = bk.off_edges
        dq, dk, dv = _clamp_backward(grad_out, qz, kb, vb, off, ctx.scale, ctx.clamp, ctx.causal, ctx.tile_bytes)
        return dq, dk, dv, None, None, None, None


def clamp_forward_differentiable(
    qb: Tensor, kb: Tensor, vb: Tensor, mask: Optional[Tensor], scale: float, clamp: Tuple[float, float]
) -> Tensor:
    """DenseClampAttention's output (B, H, lq, Dv) in out-of-place ops that autograd differentiates
    (twice, too): one (B, H, lq, lk) weight tensor, 0 where `mask` (B, 1, lq, lk) is False."""
    w = torch.exp((torch.matmul(qb, kb.transpose(-1, -2)) * scale).clamp(clamp[0], clamp[1]))
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    z = w.sum(-1, keepdim=True)
    return torch.matmul(w, vb) / torch.where(z == 0, torch.ones_like(z), z)


__all__ = ["DenseClampAttention", "clamp_forward_differentiable", "CLAMP_TILE_BYTES"]
