"""The local backend's plan of a graph: tiles of T consecutive destination rows, each over one
span of S consecutive source rows, built once per graph and cached on it.

Tile t holds destinations t*T .. t*T + T - 1 and reads sources s0(t) .. s0(t) + S - 1 with
s0(t) = t*T - c: one offset c and one span length S for every tile, the least that cover each
tile's edges. So the tiles whose rows and span lie inside the node ranges ("interior" tiles, a
run a .. b - 1) are strided views of q, k, v: q rows (n, T, D) with row stride H*D and tile stride
T*H*D, k rows (n, S, D) likewise; the few others ("boundary" tiles: the ends of a window, a last
partial tile) are gathered. `Layout` holds the sizes and the density E / (tiles * T * S), which the
"auto" rule reads; it costs O(E). `Plan` adds, per tile position, whether it is an edge, as the
additive off-edge term the tiles add to their scores; it costs O(N_dst * S) and is built only when
the backend runs.

Shapes: `bias` (1 or n_interior, T, S) over interior tiles (one shared (1, T, S) when every interior
tile has the same edges, as in windows), `boundary_bias` (n_boundary, T, S), 0 at edges and -inf
elsewhere (log m at an edge that occurs m times: each occurrence counts, as everywhere); a row
without edges gets 0 everywhere (finite weights that the kernel discards, since
its output is 0 and its gradient zeroed); `empty_rows` (n,) destinations without edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from torch import Tensor

from ...graphs import Graph

# The tile rows `choose_tile_rows` picks from.
TILE_ROWS = (16, 32)
# `plan` refuses layouts of more than this many tile positions per edge (+ a small allowance):
# their plan (a byte per position) and work would grow with N_dst * N_src on graphs that are not
# locally dense, such as random ones.
MAX_POSITIONS_PER_EDGE = 32

# "auto" (kernels/auto.py) picks "local" on CPU for graphs with at least LOCAL_MIN_DEGREE edges per destination whose
# tiles (local/plan.py) are at least LOCAL_MIN_DENSITY edges: measured (windows of 8192 nodes, H=8,
# D=64, 1 thread) level with csr in fwd+bwd at radius 16 (33 edges a row, tiles 52% edges) and
# faster from there on (1.6x at radius 32, 2.7x at 64); slower at radius 8 and 12 whatever the tile
LOCAL_MIN_DEGREE = 32
LOCAL_MIN_DENSITY = 0.5


@dataclass(frozen=True)
class Layout:
    """Tile sizes of a graph: `rows` T, `span` S, `offset` c (tile t reads sources from t*T - c),
    `tiles` ceil(N_dst / T), interior tiles `first` .. `stop` - 1, `density` E / (tiles * T * S)."""

    rows: int
    span: int
    offset: int
    tiles: int
    first: int
    stop: int
    density: float

    @property
    def interior(self) -> int:
        """The number of interior tiles (strided views, no gather)."""
        return max(0, self.stop - self.first)


def layout(graph: Graph, rows: int) -> Layout:
    """The `Layout` of graph for tiles of `rows` destinations (E >= 1). O(E); not cached (see
    `cached_layout`)."""
    src, dst = graph.src, graph.dst
    tiles = -(-graph.num_dst // rows)
    tile = dst // rows
    big = graph.num_src + graph.num_dst * rows + 1
    lo = torch.full((tiles,), big, dtype=torch.long, device=src.device).scatter_reduce(0, tile, src, "amin")
    hi = torch.full((tiles,), -big, dtype=torch.long, device=src.device).scatter_reduce(0, tile, src, "amax")
    used = lo < big
    starts = torch.arange(tiles, device=src.device) * rows
    offset = max(0, int((starts - lo)[used].max()))
    span = int((hi + 1 - starts)[used].max()) + offset
    first = -(-offset // rows)
    stop = min((graph.num_src - span + offset) // rows + 1, graph.num_dst // rows)
    density = graph.num_edges / (tiles * rows * span)
    return Layout(rows, span, offset, tiles, first, max(first, stop), density)


def choose_tile_rows(graph: Graph) -> int:
    """T for this graph: 16 while a tile's span reaches fewer than 32 sources beyond its own rows,
    else 32 (measured on windows of 8192 nodes, H=8, D=64, 1 thread: radius 8, 12 fastest at 16;
    16, 32, 64 at 32, with 64 and 128 rows 5-30% slower).
    """
    reach = cached_layout(graph, TILE_ROWS[0]).span - TILE_ROWS[0]  # sources a tile sees beyond its T
    return TILE_ROWS[0] if reach < 32 else TILE_ROWS[1]


def cached_layout(graph: Graph, rows: Optional[int] = None) -> Layout:
    """`layout(graph, rows)`, rows defaulting to `choose_tile_rows`, cached on the graph."""
    if rows is None:
        rows = graph.cached("local_rows", lambda: choose_tile_rows(graph))
    return graph.cached(f"local_layout_{rows}", lambda: layout(graph, rows))


@dataclass
class Plan:
    """A graph's tiles with their edge positions (module docstring). Built by `plan`."""

    layout: Layout
    edges: Tensor  # (tiles, T, S) bool: tile position is an edge
    counts: Optional[Tensor]  # (tiles, T, S) int32 edges at each position, when some edge repeats; else None
    empty_rows: Tensor  # (n,) destinations without edges
    boundary: Tensor  # (n_boundary,) tile ids
    boundary_q: Tensor  # (n_boundary * T,) q row of each boundary tile row (clamped; invalid rows are empty)
    boundary_k: Tensor  # (n_boundary * S,) k row of each boundary span position (clamped; invalid are off-edge)
    boundary_valid: Tensor  # (n_boundary * T,) bool: the row is a real destination
    shared: bool  # every interior tile has the same edges
    _bias: Dict[torch.dtype, tuple] = field(default_factory=dict)

    def biases(self, dtype: torch.dtype):
        """(interior bias, boundary bias) in dtype: 0 at edges (log m at an edge counted m times;
        0 on rows without edges), -inf elsewhere. Cached per dtype."""
        if dtype not in self._bias:
            lay = self.layout
            has_edge = self.edges.any(-1, keepdim=True)  # (tiles, T, 1)
            bias = torch.zeros(self.edges.shape, dtype=dtype, device=self.edges.device)
            bias.masked_fill_(~self.edges & has_edge, -math.inf)
            if self.counts is not None:  # an edge counted m times has m times the weight: + log m
                bias.add_(torch.log(self.counts.clamp(min=1).to(dtype)))
            interior = bias[lay.first : lay.first + 1] if self.shared else bias[lay.first : lay.stop]
            self._bias[dtype] = (interior.contiguous(), bias[self.boundary].contiguous())
        return self._bias[dtype]


def _positions_fit(graph: Graph, lay: Layout) -> bool:
    """Whether the tiles of `lay` hold at most MAX_POSITIONS_PER_EDGE positions per edge (plus 2^16)."""
    return lay.tiles * lay.rows * lay.span <= MAX_POSITIONS_PER_EDGE * graph.num_edges + (1 << 16)


def takes(graph: Graph, rows: Optional[int] = None) -> bool:
    """Whether `plan(graph, rows)` accepts the graph (the rule it raises ValueError by)."""
    return _positions_fit(graph, cached_layout(graph, rows))


def plan(graph: Graph, rows: Optional[int] = None) -> Plan:
    """The graph's `Plan` for tiles of `rows` destinations (default `choose_tile_rows`), cached on
    the graph. Raises ValueError for graphs whose tiles would hold more than
    MAX_POSITIONS_PER_EDGE positions per edge (`takes` says so beforehand)."""
    lay = cached_layout(graph, rows)
    positions = lay.tiles * lay.rows * lay.span
    if not _positions_fit(graph, lay):
        raise ValueError(
            f"backend 'local' needs a locally dense graph: its tiles would hold {positions / graph.num_edges:.0f}"
            f" positions per edge (density {lay.density:.3g}; at most {MAX_POSITIONS_PER_EDGE}); use backend 'csr'"
        )
    return graph.cached(f"local_plan_{lay.rows}", lambda: _build(graph, lay))


def _build(graph: Graph, lay: Layout) -> Plan:
    src, dst = graph.src, graph.dst
    device = src.device
    t_rows, span = lay.rows, lay.span
    tile = dst // t_rows
    col = src - (tile * t_rows - lay.offset)
    counts = torch.zeros(lay.tiles * t_rows * span, dtype=torch.int32, device=device)
    counts.index_put_((dst * span + col,), torch.ones_like(dst, dtype=torch.int32), accumulate=True)
    counts = counts.view(lay.tiles, t_rows, span)
    edges = counts > 0
    degree = torch.zeros(lay.tiles * t_rows, dtype=torch.long, device=device).index_add_(0, dst, torch.ones_like(dst))
    empty_rows = torch.nonzero(degree[: graph.num_dst] == 0).flatten()
    ids = torch.arange(lay.tiles, device=device)
    boundary = ids[(ids < lay.first) | (ids >= lay.stop)]
    q_rows = (boundary[:, None] * t_rows + torch.arange(t_rows, device=device)).flatten()
    k_rows = (boundary[:, None] * t_rows - lay.offset + torch.arange(span, device=device)).flatten()
    repeated = bool((counts > 1).any())
    inner = (counts if repeated else edges)[lay.first : lay.stop]  # a repeated edge's count is in its bias too
    shared = lay.interior > 0 and bool((inner == inner[:1]).all())
    return Plan(
        lay,
        edges,
        counts if repeated else None,
        empty_rows,
        boundary,
        q_rows.clamp(max=graph.num_dst - 1),
        k_rows.clamp(0, graph.num_src - 1),
        q_rows < graph.num_dst,
        shared,
    )


__all__ = [
    "Layout",
    "Plan",
    "layout",
    "cached_layout",
    "choose_tile_rows",
    "plan",
    "takes",
    "TILE_ROWS",
    "MAX_POSITIONS_PER_EDGE",
]
