"""The dense backend's plan for one graph: its blocks bucketed by kind and size, built once and
cached on the graph.

Blocks of one kind are sorted by area and grouped into buckets; a bucket is padded to its largest
block (only inside this backend) and runs as one batched matmul. A bucket accepts a block while its
padded area stays within `MAX_WASTE` of the blocks' own areas (`plan(graph).waste` reports the
whole plan's). Besides row positions, a bucket builds on first use what only some calls read: the
edges' dense positions, a mask, and the off-edge biases of clamp mode's tiles (`OffEdges`);
`prepare(graph)` builds them all eagerly.

Shapes: a bucket of B blocks padded to (lq, lk); its query rows lie at positions of the padded
(B * lq) axis (keys likewise), its edges at positions of the flat (B * lq * lk) scores.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ...graphs import Block, Graph, block_edges

MAX_WASTE = 0.25  # a bucket's padded area may exceed its blocks' areas by at most this fraction
MAX_BUCKET_PAIRS = 2**24  # B * Lq * Lk per bucket (times H in memory)
# "auto" (kernels/auto.py) picks "dense" for block graphs whose blocks average at least this many edges (a 128 x 128
# complete block; measured: below it, padded variable-length batches such as 5..50-token blocks
# are faster with csr on CPU) and come in at most DENSE_MAX_SHAPES distinct shapes (each shape is
# one more padded batch to gather); smaller blocks too when every bucket is an unpadded batch of
# complete or causal blocks (F.scaled_dot_product_attention shapes: measured faster than csr from
# 32 x 32 complete and 64-token causal blocks up, in clamp mode whether or not the clamp binds)
DENSE_MIN_EDGES_PER_BLOCK = 16384
DENSE_MAX_SHAPES = 4

# Added to the clamped scores off the edges, so that softmax gives them weight exactly 0: clamped
# scores lie in [lo, hi] with |lo|, |hi| <= 686 (_checks.max_clamp_bound), so an off-edge score sits
# at least 2700 below every edge's, and exp(-2700) is 0 in float32 and float64.
OFF_EDGE = -4096.0


class OffEdges(NamedTuple):
    """Where a bucket's (B, H, lq, lk) scores hold no edge, in the forms the tiles add cheaply (on
    this CPU, boolean masked_fill over a tile costs as much as its exp): `shape` (lq, lk), OFF_EDGE
    where the block kind has no edge (the diagonal without self-loops, above it when causal), else 0,
    or None for "full"; `keys` (B, 1, lk), OFF_EDGE at the padding keys of each block, or None when
    unpadded; `rows` (B, 1, lq, 1) bool, False at rows without edges (padding, a causal block's first
    row without self-loops), or None when every row has one."""

    shape: Optional[Tensor]
    keys: Optional[Tensor]
    rows: Optional[Tensor]


class Bucket:
    """Blocks of one kind padded to (lq, lk). Rows of the padded (B * lq) query axis at `qpos`
    hold destinations `qrows` (likewise keys); `q0`/`k0` >= 0 when the rows are one contiguous
    unpadded range starting there. `sdpa_shape`: unpadded complete blocks or square causal ones,
    which `F.scaled_dot_product_attention` computes as they are. Built on first use (only bias,
    dropout, returned weights, masked buckets and clamp mode's tiles need them): `pos`, the flat
    (B * lq * lk) position of edge `eids[i]`, `mask` (B, 1, lq, lk) bool, None when every position
    is an edge, and `off_edges`."""

    def __init__(self, kind: str, blocks: list, device) -> None:
        self.kind, self.blocks, self.device = kind, tuple(blocks), device
        self.b, self.lq, self.lk = len(blocks), max(b.n_dst for b in blocks), max(b.n_src for b in blocks)
        self.padded = any(b.n_dst != self.lq or b.n_src != self.lk for b in blocks)
        self.sdpa_shape = not self.padded and (kind == "full" or kind == "causal" and self.lq == self.lk)
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
    def off_edges(self) -> OffEdges:
        return self._lazy("off_edges", self._off_edges)

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

    def _off_edges(self) -> OffEdges:
        i = torch.arange(self.lq, device=self.device)[:, None]
        j = torch.arange(self.lk, device=self.device)
        off = {"full_no_self": j == i, "causal": j > i, "causal_no_self": j >= i}.get(self.kind)
        shape = None if off is None else torch.zeros(self.lq, self.lk, device=self.device).masked_fill_(off, OFF_EDGE)
        keys = None
        if self.padded:
            n_src = torch.tensor([b.n_src for b in self.blocks], device=self.device)
            keys = torch.zeros(self.b, 1, self.lk, device=self.device).masked_fill_(j >= n_src[:, None, None], OFF_EDGE)
        rows = None if self.mask is None else self.mask.any(-1, keepdim=True)
        return OffEdges(shape, keys, None if rows is None or bool(rows.all()) else rows)


class Plan(NamedTuple):
    buckets: Tuple[Bucket, ...]
    waste: float  # padded block area / block area - 1
    contiguous_out: bool  # one bucket covering destinations 0..N_dst in order

    @property
    def reaches_non_edges(self) -> bool:
        """Whether some bucket multiplies pairs that are not edges (causal or no-self blocks): there a
        NaN in one row could reach a destination without an edge from it. Complete and bipartite
        blocks are all edges, and their padding is zeros, so their products are the edges' own."""
        return any(bk.kind != "full" for bk in self.buckets)


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
        buckets: List[Bucket] = []
        for kind in sorted({b.kind for b in all_blocks}):
            blocks = sorted(
                (b for b in all_blocks if b.kind == kind and b.num_edges > 0),
                key=lambda b: (b.n_dst * b.n_src, b.n_dst),
                reverse=True,
            )
            buckets.extend(Bucket(kind, group, graph.device) for group in _group(blocks))
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


__all__ = ["Bucket", "OffEdges", "Plan", "plan", "prepare", "MAX_WASTE", "MAX_BUCKET_PAIRS", "OFF_EDGE"]
