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

import math
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

    @property
    def off_edges(self) -> "_OffEdges":
        return self._lazy("off_edges", lambda: _off_edges(self))

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
    and each bucket's edge positions, edge ids, mask and off-edge biases); compiled code builds what
    it lacks inside the trace. Does nothing for a graph without blocks (the dense backend does not
    take it)."""
    if graph.blocks is None:
        return
    for bk in plan(graph).buckets:
        bk.pos, bk.eids, bk.mask, bk.off_edges  # noqa: B018 (touching them builds them)


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
# a time, so that no (B, H, lq, lk) tensor exists and each tile's clamp, softmax and products stay in
# cache. Tiles of 1 MiB measured fastest (0.25 and 4 MiB were 3-5% slower) on an AVX-512 EPYC, 1
# thread, H=8, D=64, N(0, 1) inputs.
CLAMP_TILE_BYTES = 1 << 20

# Added to the clamped scores off the edges, so that softmax gives them weight exactly 0: clamped
# scores lie in [lo, hi] with |lo|, |hi| <= 686 (_checks.max_clamp_bound), so an off-edge score sits
# at least 2700 below every edge's, and exp(-2700) is 0 in float32 and float64.
OFF_EDGE = -4096.0


class _OffEdges(NamedTuple):
    """Where a bucket's (B, H, lq, lk) scores hold no edge, in the forms the tiles add cheaply (on
    this CPU, boolean masked_fill over a tile costs as much as its exp): `shape` (lq, lk), OFF_EDGE
    where the block kind has no edge (the diagonal without self-loops, above it when causal), else 0,
    or None for "full"; `keys` (B, 1, lk), OFF_EDGE at the padding keys of each block, or None when
    unpadded; `rows` (B, 1, lq, 1) bool, False at rows without edges (padding, a causal block's first
    row without self-loops), or None when every row has one."""

    shape: Optional[Tensor]
    keys: Optional[Tensor]
    rows: Optional[Tensor]


def _off_edges(bk: "_Bucket") -> _OffEdges:
    i = torch.arange(bk.lq, device=bk.device)[:, None]
    j = torch.arange(bk.lk, device=bk.device)
    off = {"full_no_self": j == i, "causal": j > i, "causal_no_self": j >= i}.get(bk.kind)
    shape = None if off is None else torch.zeros(bk.lq, bk.lk, device=bk.device).masked_fill_(off, OFF_EDGE)
    keys = None
    if bk.padded:
        n_src = torch.tensor([b.n_src for b in bk.blocks], device=bk.device)
        keys = torch.zeros(bk.b, 1, bk.lk, device=bk.device).masked_fill_(j >= n_src[:, None, None], OFF_EDGE)
    rows = None if bk.mask is None else bk.mask.any(-1, keepdim=True)
    return _OffEdges(shape, keys, None if rows is None or bool(rows.all()) else rows)


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


def _clamp_tiles(shape: Tuple[int, int, int, int], elem: int, causal: bool) -> List[_Tile]:
    """Tiles covering the (B, H, lq, lk) scores, each at most CLAMP_TILE_BYTES of them (or one
    (batch, head) pair): some heads of one batch element, or, when all of a batch element's heads
    fit in a quarter of a tile (small blocks), one head of several batch elements. Either is a 3-D strided
    view of q, k, v in any layout, so nothing is copied. Causal buckets split their query rows in
    blocks (up to 128 rows), each seeing the keys up to its last row; other buckets split them
    where one pair's scores would not fit in a tile (long blocks: 2048 keys, 128 rows)."""
    b, h, lq, lk = shape
    if causal:
        row_block = lq if lq < 64 else min(128, lq // 2)
    else:
        row_block = min(lq, max(1, CLAMP_TILE_BYTES // (lk * elem)))
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


def _tile_probs(scores: Tensor, t: _Tile, off: _OffEdges, clamp, clamped: Tensor, into: Tensor) -> Tensor:
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


def _clamp_forward(qb, kb, vb, off: _OffEdges, scale, clamp, causal):
    """qb: (B, H, lq, D), kb: (B, H, lk, D), vb: (B, H, lk, Dv), any strides with unit last stride.
    Returns out (B, H, lq, Dv), 0 at rows without edges."""
    b, h, lq, lk, dv = qb.shape[0], qb.shape[1], qb.shape[2], kb.shape[2], vb.shape[-1]
    out = _rows_layout(qb, lq, dv)
    tiles = _clamp_tiles((b, h, lq, lk), qb.element_size(), causal)
    scratch = _Scratch(qb, tiles, dv, 2)
    for t in tiles:
        scores = _tile_scores(qb, kb, t, scale, scratch.scores(0, t))
        p = _tile_probs(scores, t, off, clamp, scores, scratch.scores(1, t))
        vt = _mats(vb, t, t.keys)
        _mats(out, t, t.rows).copy_(torch.bmm(p, vt, out=scratch.result(p.shape[0], p.shape[1], dv)))
    return out if off.rows is None else out.masked_fill_(~off.rows, 0.0)


def _inclusive(clamp: Tuple[float, float], dtype: torch.dtype) -> Tuple[float, float]:
    """Bounds just outside [lo, hi] in dtype: hardtanh_backward passes the gradient strictly
    inside its bounds, torch.clamp's backward at lo and hi too."""
    lo, hi, inf = (torch.tensor(x, dtype=dtype) for x in (clamp[0], clamp[1], math.inf))
    return torch.nextafter(lo, -inf).item(), torch.nextafter(hi, inf).item()


def _clamp_backward(grad_out, qb, kb, vb, off: _OffEdges, scale, clamp, causal):
    """Tile by tile, with the weights recomputed: with p = w / sum(w) and dp = grad_out v^T,
    ds = softmax's backward (p * (dp - sum(p * dp))) * [lo <= score <= hi], dq = scale ds k,
    dk = scale ds^T q, dv = p^T grad_out. Shapes as in _clamp_forward; grad_out (B, H, lq, Dv)."""
    b, h, lq, lk, d, dv_cols = qb.shape[0], qb.shape[1], qb.shape[2], kb.shape[2], qb.shape[-1], vb.shape[-1]
    tiles = _clamp_tiles((b, h, lq, lk), qb.element_size(), causal)
    g = grad_out if off.rows is None else grad_out.masked_fill(~off.rows, 0.0)
    accumulate = any(t.rows.start > 0 for t in tiles)  # row blocks share keys: dk and dv add up
    dq = _rows_layout(qb, lq, d)
    dk, dv = (_rows_layout(x, lk, x.shape[-1]) for x in (kb, vb))
    if accumulate:
        dk.zero_()
        dv.zero_()
    lo, hi = _inclusive(clamp, qb.dtype)
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
    bk, scale, clamp): qb (B, H, lq, D), kb (B, H, lk, D), vb (B, H, lk, Dv), bk the _Bucket;
    returns (B, H, lq, Dv), 0 at rows without edges. Forward and backward run in tiles
    (CLAMP_TILE_BYTES), the backward recomputing the weights: memory beyond inputs and outputs is
    O(B * H * lq) plus one tile. The backward is softmax's, through the clamp (zero gradient where
    the score is outside [lo, hi])."""

    @staticmethod
    def forward(ctx, qb, kb, vb, bk: _Bucket, scale: float, clamp):
        causal = bk.kind.startswith("causal")
        qz = _without_empty_rows(qb, bk.kind)
        out = _clamp_forward(qz, kb, vb, bk.off_edges, scale, clamp, causal)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(qb, kb, vb, qz)  # qz is qb unless a row without edges was zeroed
        ctx.bucket, ctx.scale, ctx.clamp, ctx.causal = bk, scale, clamp, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qb, kb, vb, qz = ctx.saved_tensors
        bk = ctx.bucket
        if torch.is_grad_enabled():  # create_graph=True: recompute with differentiable ops
            again = _clamp_forward_differentiable(qb, kb, vb, bk.mask, ctx.scale, ctx.clamp)
            wanted = [t for t, need in zip((qb, kb, vb), ctx.needs_input_grad[:3]) if need]
            grads = iter(torch.autograd.grad(again, wanted, grad_out, create_graph=True))
            return (*(next(grads) if need else None for need in ctx.needs_input_grad[:3]), None, None, None)
        dq, dk, dv = _clamp_backward(grad_out, qz, kb, vb, bk.off_edges, ctx.scale, ctx.clamp, ctx.causal)
        return dq, dk, dv, None, None, None


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
    if sdpa is None:
        return DenseClampAttention.apply(qb, kb, vb, bk, scale, clamp)
    exact = _clamp_cannot_bind(qb, kb, scale, clamp, bk.kind == "causal")  # (B, H, lq, 1)
    if bool(exact.all()):
        return sdpa()
    out = DenseClampAttention.apply(qb, kb, vb, bk, scale, clamp)
    return torch.where(exact, sdpa().to(out.dtype), out) if bool(exact.any()) else out


def _bucket_attention(q, k, v, bk: _Bucket, gathered, scale, clamp, bias, dropout_mask, return_weights):
    """One bucket, q/k/v in the caller's dtype, `gathered` its rows of them or Nones (`_pad`);
    bias/dropout_mask in the accumulation dtype. Returns out (B * lq, H, Dv) in q's dtype and
    normalized weights (B, H, lq, lk) or None."""
    dtype, acc = q.dtype, accumulation_dtype(q.dtype)
    qb = _pad(q, bk.qrows, bk.qpos, bk.q0, bk.b, bk.lq, gathered[0])  # (B, H, lq, D)
    kb = _pad(k, bk.krows, bk.kpos, bk.k0, bk.b, bk.lk, gathered[1])  # (B, H, lk, D)
    vb = _pad(v, bk.krows, bk.kpos, bk.k0, bk.b, bk.lk, gathered[2])  # (B, H, lk, Dv)
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
    once = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    qrows = [bk.qrows if once and not _all_rows(q, bk.q0, bk.b, bk.lq) else None for bk in p.buckets]
    krows = [bk.krows if once and not _all_rows(k, bk.k0, bk.b, bk.lk) else None for bk in p.buckets]
    gathered = zip(_gather_once(q, qrows), _gather_once(k, krows), _gather_once(v, krows))
    for bk, rows_of in zip(p.buckets, gathered):
        out, w = _bucket_attention(q, k, v, bk, rows_of, scale, clamp, bias, dropout_mask, return_weights)
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
