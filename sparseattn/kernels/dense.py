"""The "dense" backend: batched matmuls over the dense blocks a builder recorded in `graph.blocks`.

A Transformer batch is a block-diagonal union of complete, causal or complete-bipartite blocks
(`Block`). Blocks of one kind are sorted by size and bucketed; each bucket is padded to its
largest block (only inside this kernel) and runs as one batched matmul:
    scores (B, H, Lq, Lk) = scale * q @ k^T (+ bias scattered to its dense positions)
    w = exp(clamp(scores)) or exp(scores - row max), 0 outside the block's edges
    out = (w * dropout_mask) @ v / sum(w)
with torch's own autograd. A bucket accepts a block while its padded area stays within
`MAX_WASTE` of the blocks' own areas, so padding costs at most that fraction of extra work
(`plan(graph).waste` reports it). With no bias, dropout or returned weights, uniform full/causal
buckets call `F.scaled_dot_product_attention` in exact mode (clamp=None), and in clamp mode for
the rows whose scores provably stay inside the clamp (`_clamp_cannot_bind`), where clamp-exp is
exact softmax; the other clamp-mode rows run `DenseClampAttention` (tile by tile, hand-written
backward that recomputes the weights: no (B, H, lq, lk) tensor is stored). On
CUDA, clamp mode on those buckets with half inputs runs fused instead (`triton_blocks`: no
(B, H, Lq, Lk) tensor; 3-14x faster forward and 1.7-6.6x forward+backward than the batched
matmuls on an H100).
Under torch.compile and torch.export every clamp-mode row runs the same math in out-of-place ops
that autograd differentiates (no branch on the data, so no graph break; compiled code through the
Function gave zero gradients under torch 2.11); a plan not built before is built inside the trace.
Half types run in float32, except that on CUDA the SDPA calls take them as they are (its fused
kernels accumulate in float32; an H100 ran the float32 kernel 5-10x slower). Inside a block every destination sees every
source value, so NaN/inf in one source row reaches the whole block (the sparse backends keep it
to the destinations with an edge from that row).

Shapes: q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), bias/dropout_mask (E, H).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .._tracing import tracing
from ..graphs import Block, Graph, block_edges
from .contract import AttentionInputs
from .reference import accumulation_dtype

MAX_WASTE = 0.25  # a bucket's padded area may exceed its blocks' areas by at most this fraction
MAX_BUCKET_PAIRS = 2**24  # B * Lq * Lk per bucket (times H in memory)


class _Bucket:
    """Blocks of one kind padded to (lq, lk). Rows of the padded (B * lq) query axis at `qpos`
    hold destinations `qrows` (likewise keys); `q0`/`k0` >= 0 when the rows are one contiguous
    unpadded range starting there. Built on first use (only bias, dropout, returned weights and
    masked buckets need them): `pos`, the flat (B * lq * lk) position of edge `eids[i]`, and
    `mask` (B, 1, lq, lk) bool, None when every position is an edge."""

    def __init__(self, kind: str, blocks: list, device) -> None:
        self.kind, self.blocks, self.device = kind, tuple(blocks), device
        self.b, self.lq, self.lk = len(blocks), max(b.n_dst for b in blocks), max(b.n_src for b in blocks)
        self.padded = any(b.n_dst != self.lq or b.n_src != self.lk for b in blocks)
        self.q0 = _contiguous_start([b.dst_start for b in blocks], self.lq, self.padded)
        self.k0 = _contiguous_start([b.src_start for b in blocks], self.lk, self.padded)
        self.qpos, self.qrows = self._rows(self.lq, "dst_start", "n_dst")
        self.kpos, self.krows = self._rows(self.lk, "src_start", "n_src")
        self._built: dict = {}

    def _rows(self, length: int, start: str, size: str) -> Tuple[Tensor, Tensor]:
        """Block i's rows start .. start + size: their padded positions i * length + j and node ids
        start + j, j < size, concatenated over the blocks; (n,) each. Vectorized: a bucket may hold
        thousands of blocks (one per sequence in a decoding step)."""
        sizes_list = [getattr(b, size) for b in self.blocks]
        n = sum(sizes_list)
        sizes = torch.tensor(sizes_list, device=self.device)
        first = torch.cumsum(sizes, 0) - sizes  # (B,) position of each block's first row in the result
        local = torch.arange(n, device=self.device) - first.repeat_interleave(sizes, output_size=n)  # (n,) j
        starts = torch.tensor([getattr(b, start) for b in self.blocks], device=self.device)
        pos = (torch.arange(self.b, device=self.device) * length).repeat_interleave(sizes, output_size=n) + local
        return pos, starts.repeat_interleave(sizes, output_size=n) + local

    @property
    def pos(self) -> Tensor:
        return self._lazy("pos", self._pos)

    @property
    def eids(self) -> Tensor:
        return self._lazy("eids", self._eids)

    @property
    def mask(self) -> Optional[Tensor]:
        return self._lazy("mask", self._mask)

    def _lazy(self, name: str, build):
        """build() once (not functools.cached_property: its lock is a context manager torch.compile
        cannot trace, and a plan built inside a trace builds its parts there)."""
        if name not in self._built:
            self._built[name] = build()
        return self._built[name]

    def _pos(self) -> Tensor:
        local, pos = {}, []
        for i, blk in enumerate(self.blocks):
            if (blk.n_src, blk.n_dst) not in local:
                src, dst = block_edges(self.kind, blk.n_src, blk.n_dst, self.device)
                local[blk.n_src, blk.n_dst] = dst * self.lk + src  # (e,) position inside one (lq, lk) tile
            pos.append(local[blk.n_src, blk.n_dst] + i * self.lq * self.lk)
        return torch.cat(pos)

    def _eids(self) -> Tensor:
        return torch.cat(
            [torch.arange(b.edge_start, b.edge_start + b.num_edges, device=self.device) for b in self.blocks]
        )

    def _mask(self) -> Optional[Tensor]:
        if not self.padded and self.kind == "full":
            return None
        mask = torch.zeros(self.b * self.lq * self.lk, dtype=torch.bool, device=self.device)
        mask[self.pos] = True
        return mask.view(self.b, 1, self.lq, self.lk)


class Plan(NamedTuple):
    buckets: Tuple[_Bucket, ...]
    waste: float  # padded block area / block area - 1
    contiguous_out: bool  # one bucket covering destinations 0..N_dst in order


def _contiguous_start(starts: List[int], step: int, padded: bool) -> int:
    ok = not padded and all(s == starts[0] + i * step for i, s in enumerate(starts))
    return starts[0] if ok else -1


def _group(blocks: List[Block]) -> List[List[Block]]:
    """Split blocks (sorted by area, largest first) into consecutive buckets: a bucket takes the
    next block while its padded area (blocks * largest n_dst * largest n_src) stays within
    1 + MAX_WASTE times its blocks' own areas and within MAX_BUCKET_PAIRS. One pass, O(blocks)."""
    groups: List[List[Block]] = []
    current: List[Block] = []
    lq = lk = own = 0
    for blk in blocks:
        glq, glk, gown = max(lq, blk.n_dst), max(lk, blk.n_src), own + blk.n_dst * blk.n_src
        padded = (len(current) + 1) * glq * glk
        if current and (padded > (1 + MAX_WASTE) * gown or padded > MAX_BUCKET_PAIRS):
            groups.append(current)
            current, glq, glk, gown = [], blk.n_dst, blk.n_src, blk.n_dst * blk.n_src
        current.append(blk)
        lq, lk, own = glq, glk, gown
    if current:
        groups.append(current)
    return groups


def plan(graph: Graph) -> Plan:
    """Buckets of the graph's blocks (cached on the graph). Raises ValueError without blocks."""
    if graph.blocks is None:
        raise ValueError(
            "the dense backend needs a graph built from dense blocks (graphs.complete, causal, "
            "bipartite, from_blocks or a batch of them); this graph has no recorded blocks, "
            "use backend='csr' or 'auto'"
        )

    def build() -> Plan:
        all_blocks = graph.blocks or ()
        buckets: List[_Bucket] = []
        for kind in sorted({b.kind for b in all_blocks}):
            blocks = sorted(
                (b for b in all_blocks if b.kind == kind and b.num_edges > 0),
                key=lambda b: (b.n_dst * b.n_src, b.n_dst),
                reverse=True,
            )
            buckets.extend(_Bucket(kind, group, graph.device) for group in _group(blocks))
        padded_area = sum(bk.b * bk.lq * bk.lk for bk in buckets)
        area = sum(b.n_dst * b.n_src for b in all_blocks if b.num_edges > 0)
        contiguous = len(buckets) == 1 and buckets[0].q0 == 0 and buckets[0].b * buckets[0].lq == graph.num_dst
        return Plan(tuple(buckets), padded_area / area - 1.0 if area else 0.0, contiguous)

    return graph.cached("dense_plan", build)


def prepare(graph: Graph) -> None:
    """Build and cache, eagerly, everything the dense backend reads for this graph (its blocks, plan
    and each bucket's edge positions, edge ids and mask); compiled code builds what it lacks inside
    the trace. Does nothing for a graph without blocks (the dense backend does not take it)."""
    if graph.blocks is None:
        return
    for bk in plan(graph).buckets:
        bk.pos, bk.eids, bk.mask  # noqa: B018 (touching them builds them)


def _pad(x: Tensor, rows: Tensor, pos: Tensor, start: int, b: int, length: int) -> Tensor:
    """Rows of x (N, H, D) -> (B, H, length, D), zeros in the padding."""
    if start == 0 and b * length == x.shape[0]:
        xb = x  # all rows in order: a view (a slice would cost a zero-filled copy in backward)
    elif start >= 0:
        xb = x[start : start + b * length]
    else:
        xb = x.new_zeros(b * length, *x.shape[1:]).index_put((pos,), x[rows])
    return xb.view(b, length, *x.shape[1:]).transpose(1, 2)


def _scatter_edges(values: Tensor, bk: _Bucket) -> Tensor:
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


# Clamp mode runs tile by tile: the scores of a few (batch, head) pairs and a block of query rows at
# a time, so that no (B, H, lq, lk) tensor exists and each tile's clamp, exp and products stay in
# cache. Tiles of 1 MiB measured fastest (0.25 and 4 MiB were 3-5% slower) on an AVX-512 EPYC, 1
# thread, H=8, D=64, N(0, 1) inputs: forward 1.1-1.3x SDPA and forward+backward 1.1-1.3x on
# complete and causal 32x128 and 8x512 blocks, where the whole-bucket matmuls took 1.9-2.0x and 1.4-1.6x.
CLAMP_TILE_BYTES = 1 << 20


class _Tile(NamedTuple):
    batch: Union[int, slice]  # one batch element and a range of heads,
    heads: Union[int, slice]  # or one head and a range of batch elements
    rows: slice  # query rows
    keys: slice  # keys 0 .. n (a causal row block sees no later key)


def _clamp_tiles(shape: Tuple[int, int, int, int], elem: int, causal: bool) -> List[_Tile]:
    """Tiles covering the (B, H, lq, lk) scores, each at most CLAMP_TILE_BYTES of them (or one
    (batch, head) pair): some heads of one batch element, or, when all of a batch element's heads
    fit in a quarter of a tile (small blocks), one head of several batch elements. Either is a 3-D strided
    view of q, k, v in any layout, so nothing is copied. Causal buckets split their query rows in
    blocks (up to 128 rows), each seeing the keys up to its last row."""
    b, h, lq, lk = shape
    row_block = lq if not causal or lq < 64 else min(128, lq // 2)
    tiles = []
    for r0 in range(0, lq, row_block):
        rows = slice(r0, min(lq, r0 + row_block))
        keys = slice(0, min(lk, rows.stop) if causal else lk)
        pairs = max(1, CLAMP_TILE_BYTES // ((rows.stop - r0) * keys.stop * elem))  # (batch, head) pairs per tile
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


def _tile_weights(qb: Tensor, kb: Tensor, off_edges: Optional[Tensor], t: _Tile, scale, clamp, need_outside: bool):
    """w = exp(clamp(scale * q k^T)), 0 off the edges, for one tile: (pairs, rows, keys); with
    need_outside also where the score left [lo, hi] (there the gradient is 0; NaN counts as outside).
    off_edges: (B, lq, lk) bool or None."""
    q, k = _mats(qb, t, t.rows), _mats(kb, t, t.keys)
    s = torch.baddbmm(q.new_empty(()), q, k.transpose(1, 2), beta=0.0, alpha=scale)
    c = torch.clamp(s, clamp[0], clamp[1])
    outside = torch.ne(c, s) if need_outside else None
    w = c.exp_()
    if off_edges is not None:  # (rows, keys) shared by the heads, or (batch elements, rows, keys)
        w.masked_fill_(off_edges[t.batch, t.rows, t.keys], 0.0)
    return w, outside


def _rows_layout(x: Tensor, rows: int, cols: int) -> Tensor:
    """An empty (B, H, rows, cols) tensor laid out as x is when x is a (B, L, H, D) tensor seen
    as (B, H, L, D) (the caller's rows), else contiguous: results then need no transposing copy."""
    b, h = x.shape[:2]
    if x.stride(1) < x.stride(2):
        return x.new_empty(b, rows, h, cols).transpose(1, 2)
    return x.new_empty(b, h, rows, cols)


def _clamp_forward(qb, kb, vb, mask, scale, clamp, causal):
    """qb: (B, H, lq, D), kb: (B, H, lk, D), vb: (B, H, lk, Dv), mask (B, 1, lq, lk) bool or None;
    any strides with unit last stride. Returns out (B, H, lq, Dv) and z (B, H, lq, 1) = sum of the
    weights (1 for a row without edges)."""
    b, h, lq, lk = qb.shape[0], qb.shape[1], qb.shape[2], kb.shape[2]
    tiles = _clamp_tiles((b, h, lq, lk), qb.element_size(), causal)
    out, z = _rows_layout(qb, lq, vb.shape[-1]), qb.new_empty(b, h, lq, 1)
    off_edges = None if mask is None else ~mask[:, 0]
    for t in tiles:
        w, _ = _tile_weights(qb, kb, off_edges, t, scale, clamp, False)
        torch.sum(w, -1, keepdim=True, out=_mats(z, t, t.rows))
        _mats(out, t, t.rows).copy_(torch.bmm(w, _mats(vb, t, t.keys)))
    z.masked_fill_(z == 0, 1.0)  # a row without edges: out = 0
    return out.div_(z), z


def _clamp_backward(grad_out, qb, kb, vb, mask, out, z, scale, clamp, causal):
    """Tile by tile, with the weights recomputed: g = grad_out / z, ds = (g v^T - <g, out>) * w *
    [lo <= score <= hi] (w = 0 off the edges), dq = scale ds k, dk = scale ds^T q, dv = w^T g.
    Shapes as in _clamp_forward; grad_out (B, H, lq, Dv)."""
    b, h, lq, lk = qb.shape[0], qb.shape[1], qb.shape[2], kb.shape[2]
    tiles = _clamp_tiles((b, h, lq, lk), qb.element_size(), causal)
    g = grad_out / z
    accumulate = any(t.rows.start > 0 for t in tiles)  # causal row blocks share keys: dk and dv add up
    dq = _rows_layout(qb, lq, qb.shape[-1])
    dk, dv = (_rows_layout(x, lk, x.shape[-1]) for x in (kb, vb))
    if accumulate:
        dk.zero_()
        dv.zero_()
    delta = torch.linalg.vecdot(g, out).unsqueeze(-1)  # (B, H, lq, 1)
    off_edges = None if mask is None else ~mask[:, 0]
    for t in tiles:
        w, outside = _tile_weights(qb, kb, off_edges, t, scale, clamp, True)
        gt, qt, kt = _mats(g, t, t.rows), _mats(qb, t, t.rows), _mats(kb, t, t.keys)
        ds = torch.bmm(gt, _mats(vb, t, t.keys).transpose(1, 2)).sub_(_mats(delta, t, t.rows))
        ds.mul_(w).masked_fill_(outside, 0.0)
        # results into fresh tensors, then copied: in-place baddbmm_ on strided views goes matrix by matrix
        _mats(dq, t, t.rows).copy_(torch.bmm(ds, kt))
        for into, r in ((dv, torch.bmm(w.transpose(1, 2), gt)), (dk, torch.bmm(ds.transpose(1, 2), qt))):
            dst = _mats(into, t, t.keys)
            if accumulate:
                dst.add_(r)
            else:
                dst.copy_(r)
    return dq.mul_(scale), dk.mul_(scale), dv


class DenseClampAttention(torch.autograd.Function):
    """Clamp-mode attention on one padded bucket, without bias, dropout or returned weights:
    out = (w @ v) / sum(w) with w = exp(clamp(scale q k^T)) masked. forward(qb, kb, vb, mask,
    scale, clamp, causal): qb (B, H, lq, D), kb (B, H, lk, D), vb (B, H, lk, Dv), mask
    (B, 1, lq, lk) bool or None, causal: the bucket's blocks are causal (rows see no later key);
    returns (B, H, lq, Dv). Forward and backward run in tiles (CLAMP_TILE_BYTES), the backward
    recomputing the weights: memory beyond inputs and outputs is O(B * H * lq) plus one tile. The
    backward is softmax's, through the clamp (zero gradient where the score is outside [lo, hi])."""

    @staticmethod
    def forward(ctx, qb, kb, vb, mask, scale: float, clamp, causal: bool = False):
        out, z = _clamp_forward(qb, kb, vb, mask, scale, clamp, causal)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(qb, kb, vb, mask, out, z)
        ctx.scale, ctx.clamp, ctx.causal = scale, clamp, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qb, kb, vb, mask, out, z = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: recompute with differentiable ops
            again = _clamp_forward_differentiable(qb, kb, vb, mask, ctx.scale, ctx.clamp)
            wanted = [t for t, need in zip((qb, kb, vb), ctx.needs_input_grad[:3]) if need]
            grads = iter(torch.autograd.grad(again, wanted, grad_out, create_graph=True))
            return (*(next(grads) if need else None for need in ctx.needs_input_grad[:3]), None, None, None, None)
        dq, dk, dv = _clamp_backward(grad_out, qb, kb, vb, mask, out, z, ctx.scale, ctx.clamp, ctx.causal)
        return dq, dk, dv, None, None, None, None


def _clamp_forward_differentiable(qb, kb, vb, mask, scale, clamp):
    """_clamp_forward's output (B, H, lq, Dv) with out-of-place ops that autograd can differentiate."""
    w = torch.exp((torch.matmul(qb, kb.transpose(-1, -2)) * scale).clamp(clamp[0], clamp[1]))
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    z = w.sum(-1, keepdim=True)
    return torch.matmul(w, vb) / torch.where(z == 0, torch.ones_like(z), z)


# float32 stays on the materialized path: in IEEE float32 products the fused backward took 18-60x
# longer than it (H100, complete and causal blocks of 128-2048 tokens, H=8, D=64)
FUSED_CLAMP_DTYPES = (torch.float16, torch.bfloat16)


def _tensor_cores_take(dtype: torch.dtype, capability: Tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability multiplies dtype on tensor cores in Triton:
    float16 from Turing (7.5) on, bfloat16 from Ampere (8.0) on."""
    return capability >= ((8, 0) if dtype == torch.bfloat16 else (7, 5))


def _fused_clamp_runs(qb: Tensor, kb: Tensor, vb: Tensor) -> bool:
    """Whether clamp mode on an unpadded full/causal bucket goes to the fused Triton kernel
    (`triton_blocks`): CUDA inputs of FUSED_CLAMP_DTYPES on a GPU whose tensor cores take them,
    triton importable, not while tracing."""
    if not qb.is_cuda or qb.dtype not in FUSED_CLAMP_DTYPES or tracing():
        return False
    if not _tensor_cores_take(qb.dtype, torch.cuda.get_device_capability(qb.device)):
        return False
    try:
        from . import triton_blocks
    except ImportError:
        return False
    return triton_blocks.runs(qb, kb, vb)


def _plain_clamp_attention(qb, kb, vb, bk: _Bucket, scale, clamp, sdpa) -> Tensor:
    """Clamp mode without bias, dropout or returned weights on one bucket: qb (B, H, lq, D),
    kb (B, H, lk, D), vb (B, H, lk, Dv) in the accumulation dtype -> (B, H, lq, Dv). `sdpa()` (None
    unless the bucket has an SDPA shape) computes exact softmax, which eager mode takes for the rows
    that the clamp provably cannot reach; compiled code runs every row through
    `_clamp_forward_differentiable` (equal up to rounding) instead of branching on the data."""
    if tracing():  # out-of-place ops, differentiated by autograd: under torch 2.11, compiled
        # code through DenseClampAttention gave zero gradients (H100 run, tests/kernels/test_compile.py)
        return _clamp_forward_differentiable(qb, kb, vb, bk.mask, scale, clamp)
    causal = bk.kind.startswith("causal")
    if sdpa is None:
        return DenseClampAttention.apply(qb, kb, vb, bk.mask, scale, clamp, causal)
    exact = _clamp_cannot_bind(qb, kb, scale, clamp, bk.kind == "causal")  # (B, H, lq, 1)
    if bool(exact.all()):
        return sdpa()
    out = DenseClampAttention.apply(qb, kb, vb, bk.mask, scale, clamp, causal)
    return torch.where(exact, sdpa().to(out.dtype), out) if bool(exact.any()) else out


def _bucket_attention(q, k, v, bk: _Bucket, scale, clamp, bias, dropout_mask, return_weights):
    """One bucket, q/k/v in the caller's dtype; bias/dropout_mask in the accumulation dtype.
    Returns out (B * lq, H, Dv) in q's dtype and normalized weights (B, H, lq, lk) or None."""
    dtype, acc = q.dtype, accumulation_dtype(q.dtype)
    qb = _pad(q, bk.qrows, bk.qpos, bk.q0, bk.b, bk.lq)  # (B, H, lq, D)
    kb = _pad(k, bk.krows, bk.kpos, bk.k0, bk.b, bk.lk)  # (B, H, lk, D)
    vb = _pad(v, bk.krows, bk.kpos, bk.k0, bk.b, bk.lk)  # (B, H, lk, Dv)
    plain = bias is None and dropout_mask is None and not return_weights
    sdpa_shape = not bk.padded and (bk.kind == "full" or bk.kind == "causal" and bk.lq == bk.lk)
    causal = bk.kind == "causal"

    def as_rows(out: Tensor) -> Tuple[Tensor, None]:  # (B, H, lq, Dv) -> (B * lq, H, Dv)
        return out.transpose(1, 2).reshape(bk.b * bk.lq, *out.shape[1::2]).to(dtype), None

    if plain and sdpa_shape and q.is_cuda:  # CUDA's fused kernels take half types as they are
        if clamp is None:
            return as_rows(F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale))
        if _fused_clamp_runs(qb, kb, vb):
            from .triton_blocks import block_clamp_attention

            return as_rows(block_clamp_attention(qb, kb, vb, scale=scale, clamp=clamp, causal=causal))
    sdpa_inputs = (qb, kb, vb) if q.is_cuda else None
    qb, kb, vb = (t.to(acc) for t in (qb, kb, vb))

    def sdpa():
        return F.scaled_dot_product_attention(*(sdpa_inputs or (qb, kb, vb)), is_causal=causal, scale=scale)

    if plain and clamp is None and sdpa_shape:
        return as_rows(sdpa())
    if plain and clamp is not None:
        return as_rows(_plain_clamp_attention(qb, kb, vb, bk, scale, clamp, sdpa if sdpa_shape else None))
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
    z = torch.where(z > 0, z, torch.ones_like(z))
    wm = w if dropout_mask is None else w * _scatter_edges(dropout_mask, bk)
    out = torch.matmul(wm, vb) / z  # (B, H, lq, Dv)
    out = out.transpose(1, 2).reshape(bk.b * bk.lq, out.shape[1], out.shape[3])
    return out.to(dtype), (w / z if return_weights else None)


def dense_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "dense" backend (the contract in contract.py; graphs with recorded blocks only,
    ValueError otherwise): out (N_dst, H, Dv) in q's dtype and, if asked, weights (E, H) in the
    graph's edge order. Half types arrive only on CUDA (its SDPA and fused kernels take them)."""
    q, k, v, graph, scale, clamp, bias, dropout_mask, return_weights = inputs[:9]
    p = plan(graph)
    heads, dtype, acc = q.shape[1], q.dtype, accumulation_dtype(q.dtype)
    bias = None if bias is None else bias.to(acc)
    dropout_mask = None if dropout_mask is None else dropout_mask.to(acc)
    rows, outs, eids, ws = [], [], [], []
    for bk in p.buckets:
        out, w = _bucket_attention(q, k, v, bk, scale, clamp, bias, dropout_mask, return_weights)
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
    weights = None
    if return_weights:
        weights = q.new_zeros(graph.num_edges, heads, dtype=acc)
        if ws:
            weights = weights.index_put((torch.cat(eids),), torch.cat(ws))
        weights = weights.to(dtype)
    return result, weights


__all__ = ["dense_attention", "plan", "prepare", "Plan", "MAX_WASTE"]
