"""The local backend's call: `LocalAttention`, an autograd.Function over a `Plan`'s tiles, and
`local_attention`, the backend function.

Interior tiles run as strided views of q, k, v (no copies), one head and a chunk of tiles at a time
so that each chunk's (tiles, T, S) scores stay near CHUNK_BYTES (in cache); boundary tiles run on
gathered rows. The backward recomputes the weights, writes dq tile by tile, and adds each tile's dk
and dv into its span: ceil(S / T) strided adds per chunk and head, each over distinct rows.

Shapes: q (N_dst, H, D), k (N_src, H_kv, D), v (N_src, H_kv, Dv), H_kv dividing H (query head h
reads kv head h // (H / H_kv)); out (N_dst, H, Dv).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import memory
from ..contract import AttentionInputs, gradient_bounds
from ..reference import differentiable_grads
from . import tiles
from .plan import Plan, plan

# Scores of one chunk of tiles, in bytes: 128 KiB to 4 MiB measured within 5% of each other
# (window radius 8, 8192 nodes, H=8, D=64, 1 thread), 32 KiB 40% slower (per-op overhead).
CHUNK_BYTES = 1 << 20


def _tiles(x: Tensor, head: int, row0: int, count: int, length: int, step: int) -> Tensor:
    """Head `head` of `count` tiles of x (N, H, D) (contiguous): tile i is rows row0 + i*step ..
    + length - 1, as a (count, length, D) strided view."""
    n, h, d = x.shape
    return x.as_strided((count, length, d), (step * h * d, h * d, 1), x.storage_offset() + row0 * h * d + head * d)


def _chunks(p: Plan, elem: int):
    """(first tile, count) of each chunk of interior tiles."""
    lay = p.layout
    size = max(1, CHUNK_BYTES // (lay.rows * lay.span * elem))
    return [(t, min(size, lay.stop - t)) for t in range(lay.first, lay.stop, size)]


def _interior_bias(bias: Tensor, p: Plan, t0: int, n: int) -> Tensor:
    """The (1 or n, T, S) bias of interior tiles t0 .. t0 + n - 1."""
    return bias if p.shared else bias[t0 - p.layout.first : t0 - p.layout.first + n]


def _forward(q: Tensor, k: Tensor, v: Tensor, p: Plan, scale: float, clamp) -> Tensor:
    lay = p.layout
    t_rows, span, c = lay.rows, lay.span, lay.offset
    heads, kv_heads, dv = q.shape[1], k.shape[1], v.shape[2]
    group = heads // kv_heads  # query head h reads kv head h // group
    # zeros, not empty: the tiles' strided first writes into fresh 4 KiB pages ran ~5x slower than a
    # sequential zero fill followed by the same writes (glibc mmap'ed pages, 1 thread); `memory`'s
    # are huge pages from 32 MiB on, zeros without a fill
    out = memory.zeros((q.shape[0], heads, dv), q)
    bias, boundary_bias = p.biases(q.dtype)
    chunks = _chunks(p, q.element_size())
    nb = p.boundary.numel()
    scratch = tiles.Scratch(q, max([n for _, n in chunks] + [nb]), t_rows, span, dv, 2)
    for t0, n in chunks:
        b = _interior_bias(bias, p, t0, n)
        for h in range(heads):
            qt = _tiles(q, h, t0 * t_rows, n, t_rows, t_rows)
            kt, vt = (_tiles(x, h // group, t0 * t_rows - c, n, span, t_rows) for x in (k, v))
            _tiles(out, h, t0 * t_rows, n, t_rows, t_rows).copy_(tiles.forward(qt, kt, vt, b, scale, clamp, scratch))
    if nb:
        qb = q[p.boundary_q].view(nb, t_rows, heads, -1)
        kb, vb = (x[p.boundary_k].view(nb, span, kv_heads, -1) for x in (k, v))
        ob = q.new_empty(nb, t_rows, heads, dv)
        for h in range(heads):
            kh, vh = kb[:, :, h // group], vb[:, :, h // group]
            ob[:, :, h] = tiles.forward(qb[:, :, h], kh, vh, boundary_bias, scale, clamp, scratch)
        valid = p.boundary_valid
        out[p.boundary_q[valid]] = ob.view(nb * t_rows, heads, dv)[valid]
    return out.index_fill_(0, p.empty_rows, 0.0) if p.empty_rows.numel() else out


def _span_adder(x: Tensor, h: int, row0: int, n: int, span: int, t_rows: int):
    """A callable that adds a chunk's per-tile span gradients (n, S, width) into head h of x
    (N_src, H, width), tile i's span starting at row0 + i*T: in pieces of at most T rows (tiles
    step T, so no two rows of one piece's view coincide)."""

    def add(r: Tensor) -> None:
        for a in range(0, span, t_rows):
            length = min(t_rows, span - a)
            _tiles(x, h, row0 + a, n, length, t_rows).add_(r[:, a : a + length])

    return add


def _backward(g: Tensor, q: Tensor, k: Tensor, v: Tensor, p: Plan, scale: float, clamp):
    lay = p.layout
    t_rows, span, c = lay.rows, lay.span, lay.offset
    heads, kv_heads, d, dv_cols = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    group = heads // kv_heads  # query head h reads kv head h // group; its dk, dv add up there
    g = g.contiguous()
    if p.empty_rows.numel():
        g = g.index_fill(0, p.empty_rows, 0.0)
    dq, dk, dv = (memory.zeros(x.shape, x) for x in (q, k, v))  # zeros: see _forward
    bias, boundary_bias = p.biases(q.dtype)
    bounds = None if clamp is None else gradient_bounds(clamp, q.dtype)
    chunks = _chunks(p, q.element_size())
    nb = p.boundary.numel()
    scratch = tiles.Scratch(q, max([n for _, n in chunks] + [nb]), t_rows, span, max(d, dv_cols), 4)
    for t0, n in chunks:
        b = _interior_bias(bias, p, t0, n)
        row0, span0 = t0 * t_rows, t0 * t_rows - c
        for h in range(heads):
            qt, gt = _tiles(q, h, row0, n, t_rows, t_rows), _tiles(g, h, row0, n, t_rows, t_rows)
            kt, vt = (_tiles(x, h // group, span0, n, span, t_rows) for x in (k, v))
            into = (
                _tiles(dq, h, row0, n, t_rows, t_rows),
                _span_adder(dk, h // group, span0, n, span, t_rows),
                _span_adder(dv, h // group, span0, n, span, t_rows),
            )
            tiles.backward(gt, qt, kt, vt, b, scale, clamp, bounds, scratch, into)
    if nb:
        valid = p.boundary_valid
        qb = q[p.boundary_q].view(nb, t_rows, heads, d)
        gb = (g[p.boundary_q] * valid[:, None, None]).view(nb, t_rows, heads, dv_cols)
        kb, vb = (x[p.boundary_k].view(nb, span, kv_heads, -1) for x in (k, v))
        dqb = q.new_empty(nb, t_rows, heads, d)
        dkb, dvb = k.new_empty(nb, span, heads, d), v.new_empty(nb, span, heads, dv_cols)  # per query head
        for h in range(heads):
            into = (dqb[:, :, h], dkb[:, :, h].copy_, dvb[:, :, h].copy_)
            kh, vh = kb[:, :, h // group], vb[:, :, h // group]
            tiles.backward(gb[:, :, h], qb[:, :, h], kh, vh, boundary_bias, scale, clamp, bounds, scratch, into)
        dq[p.boundary_q[valid]] = dqb.view(nb * t_rows, heads, d)[valid]
        dk.index_add_(0, p.boundary_k, dkb.view(nb * span, kv_heads, group, d).sum(2))
        dv.index_add_(0, p.boundary_k, dvb.view(nb * span, kv_heads, group, dv_cols).sum(2))
    return dq, dk, dv


class LocalAttention(torch.autograd.Function):
    """forward(q, k, v, plan, graph, scale, clamp) -> out (N_dst, H, Dv): attention over `graph`
    along its `plan`, clamp (lo, hi) or None (exact softmax); q, k, v contiguous. Saves q, k, v; the backward
    recomputes the weights (hand-written; under create_graph=True the reference's differentiable
    gradients)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, p: Plan, graph, scale: float, clamp):
        ctx.save_for_backward(q, k, v)
        ctx.plan, ctx.graph, ctx.scale, ctx.clamp = p, graph, scale, clamp
        return _forward(q, k, v, p, scale, clamp)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:3])
        if torch.is_grad_enabled():  # create_graph=True: gradients torch can differentiate again
            grads = differentiable_grads(
                ctx.graph.edge_index, q, k, v, None, None, (*needs, False), ctx.scale, ctx.clamp, grad_out, None
            )
            return (*grads[:3], None, None, None, None)
        dq, dk, dv = _backward(grad_out, q, k, v, ctx.plan, ctx.scale, ctx.clamp)
        return dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None, None, None, None, None


class TritonLocalAttention(torch.autograd.Function):
    """`LocalAttention` computed by the Triton tiles (`triton_tiles.py`): same arguments and result;
    saves q, k, v and the forward's (m, z) per row and head."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, p: Plan, graph, scale: float, clamp):
        from . import triton_tiles

        out, stats = triton_tiles.forward(q, k, v, p, scale, clamp)
        ctx.save_for_backward(q, k, v, stats)
        ctx.plan, ctx.graph, ctx.scale, ctx.clamp = p, graph, scale, clamp
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from . import triton_tiles

        q, k, v, stats = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:3])
        if torch.is_grad_enabled():
            grads = differentiable_grads(
                ctx.graph.edge_index, q, k, v, None, None, (*needs, False), ctx.scale, ctx.clamp, grad_out, None
            )
            return (*grads[:3], None, None, None, None)
        dq, dk, dv = triton_tiles.backward(grad_out, q, k, v, stats, ctx.plan, ctx.scale, ctx.clamp)
        return dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None, None, None, None, None


def _triton_tiles(inputs: AttentionInputs, q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether this call runs the Triton tiles: kernel_options local_tiles="triton" (not yet the
    default: no device has measured them), triton importable, inputs it takes (`triton_tiles.runs`:
    CUDA tensors, or CPU ones in Triton's interpreter)."""
    if inputs.options.local_tiles != "triton":
        return False
    try:
        from . import triton_tiles
    except ImportError:
        return False
    return triton_tiles.runs(q, k, v)


def local_takes(inputs: AttentionInputs) -> bool:
    """Whether "local" computes this call: not with a bias, dropout or returned weights (its
    registration sends those to the sparse backend, `guard.checked`)."""
    return inputs.bias is None and inputs.dropout_mask is None and not inputs.return_weights


def local_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "local" backend's tiles (the contract in contract.py): out (N_dst, H, Dv), for calls it
    takes (`local_takes`); registered checked, `guard.checked`."""
    if not local_takes(inputs):
        raise ValueError("local_attention computes no bias, dropout or returned weights (see local_takes)")
    q, k, v = (x.contiguous() for x in (inputs.q, inputs.k, inputs.v))
    if _triton_tiles(inputs, q, k, v):
        from . import triton_tiles

        p = plan(inputs.graph, triton_tiles.tile_rows(inputs.graph))
        return TritonLocalAttention.apply(q, k, v, p, inputs.graph, inputs.scale, inputs.clamp), None
    return LocalAttention.apply(q, k, v, plan(inputs.graph), inputs.graph, inputs.scale, inputs.clamp), None


__all__ = ["LocalAttention", "TritonLocalAttention", "local_attention", "local_takes", "CHUNK_BYTES"]
