"""The "auto" rule, in one place: which backend runs a call (`choose_auto`) and whether it runs in the
graph's locality order (`choose_order`), decided from the graph, the tensors and whether code is being
traced, and how attention within the graphs of a batch runs (`choose_padding`, `choose_packing`).
Each threshold lives beside the kernel it was measured for (dense/plan.py, local/plan.py, small.py,
padded.py); layers never choose (they pass "auto" or what their caller named).
"""

from __future__ import annotations

from typing import FrozenSet, Mapping, Optional

import torch
from torch import Tensor

from .._tracing import exporting, tracing
from ..graphs import Graph
from ..graphs.order import locality_pays
from .contract import Backend
from .dense import DENSE_MAX_SHAPES, DENSE_MIN_EDGES_PER_BLOCK, plan
from .local import LOCAL_MIN_DEGREE, LOCAL_MIN_DENSITY, TILE_ROWS, cached_layout
from .padded import PADDED_MAX_WASTE
from .small import small_pays

# "auto" relabels a graph in its locality order (graphs.locality_pays) only from this many nodes: the
# order search costs O(E) once per Graph, and graphs below this size gain little from a nearer source.
ORDER_MIN_NODES = 1 << 14


def choose_auto(
    q: Tensor,
    graph: Graph,
    registered: Mapping[str, Backend],
    edge_terms: FrozenSet[str] = frozenset(),
    value_dim: Optional[int] = None,
    edge_kv: bool = False,
) -> str:
    """The backend "auto" picks for these inputs (see docs/guide/backends.md), in this order:

    - "small" for CPU tensors with few gathered values (E * H * max(D, Dv): `small.small_pays`, more
      on a graph seen once, or with per-edge key or value terms (edge_kv), than on a reused Graph): a
      mini-batch of small graphs, where per-op overhead decides (tiny blocks included);
    - "dense" when the graph records dense blocks in at most DENSE_MAX_SHAPES distinct (kind, n_src,
      n_dst) shapes that either average >= DENSE_MIN_EDGES_PER_BLOCK edges or form unpadded batches
      of "full"/"causal" blocks: batched matmuls (or SDPA) beat any sparse kernel there;
    - "local" for CPU tensors when the graph averages >= LOCAL_MIN_DEGREE edges per destination and
      its tiles hold >= LOCAL_MIN_DENSITY edges (`local.cached_layout`: wide windows, dense bands);
    - "triton" for CUDA tensors with D <= 256 when triton is importable;
    - else "csr". Never "scatter" (slower everywhere), and "reference" only for a call with an edge
      term that no faster backend declares (`Backend.edge_terms`).

    Inside a torch.compile or torch.export trace never "dense" (its batches take their shapes from
    the block structure, so every new batch would compile anew; pass backend="dense" to have it anyway)
    nor "local" (eager only); inside torch.export never "small" (its programs keep the library's
    custom ops). edge_terms: the names of the call's edge terms and "eps" (`contract.extras_given`); only
    backends that declare them all are picked: never "dense" or "local" with any. edge_kv: the call has
    edge_key or edge_value and neither edge_scale nor eps. `registered` maps names to the registered
    backends."""
    chosen = _choose(q, graph, registered, edge_terms, value_dim, edge_kv)
    backend = registered.get(chosen)
    return chosen if backend is not None and backend.takes_terms(edge_terms) else "reference"


def _choose(
    q: Tensor,
    graph: Graph,
    registered: Mapping[str, Backend],
    edge_terms: FrozenSet[str],
    value_dim: Optional[int],
    edge_kv: bool,
) -> str:
    """`choose_auto`'s rule before the check that its choice declares the call's edge terms."""
    cpu = q.device.type == "cpu"
    width = max(q.shape[2], q.shape[2] if value_dim is None else value_dim)
    if cpu and not exporting() and small_pays(graph.num_edges * q.shape[1] * width, graph.one_call, edge_kv):
        return "small"
    blocks = None if tracing() or edge_terms else graph.blocks
    if blocks and len({(b.kind, b.n_src, b.n_dst) for b in blocks}) <= DENSE_MAX_SHAPES:
        if graph.num_edges >= DENSE_MIN_EDGES_PER_BLOCK * len(blocks) or all(
            not bk.padded and bk.kind in ("full", "causal") for bk in plan(graph).buckets
        ):
            return "dense"
    if cpu and not tracing() and not edge_terms and _local_pays(graph):
        return "local"
    triton = registered.get("triton")
    if q.device.type == "cuda" and q.shape[-1] <= 256 and triton is not None:
        # (probed only for CUDA tensors: the probe imports triton, ~1 s)
        if triton.takes_terms(edge_terms) and triton.available:
            return "triton"
    return "csr"


def factor_edge_projection(num_edges: int, heads: int, channels: int, edge_dim: int) -> bool:
    """Whether a call whose edge_key and edge_value are one projection e = W_h a (an `EdgeProjection`:
    TransformerConv's lin_edge of edge_attr, H heads of C channels from F features; `kernels.projected`
    asks) attends through the factored form
    <q, W_h a> = <W_h^T q, a> with one (E, 1, C + F) edge row, instead of the (E, H, C) term: where the
    row is narrower (C + F < H * C) and the graph is beyond "small"'s size for a call with edge terms
    (`small.small_pays` false for E * H * C values, edge_kv), whether the graph is seen once or reused.
    On a batch of 32 molecules (454 edges, H=4, C=16, F=16) the factored form's extra ops made the
    layer's fwd+bwd 1.5x slower (1 thread), and three layers sharing a `from_pyg` Graph of 32
    molecules (2,300 edges) ran 1.3x slower factored than not, on csr as well as "small"; on large
    graphs it saves the (E, H, C) tensors."""
    return channels + edge_dim < heads * channels and not small_pays(num_edges * heads * channels, False, edge_kv=True)


# Off the CPU, eager layers stack their maps up to this many rows: the bound the CPU measurement once
# set (4 maps, 6% faster at 267 rows, 2% at 512, slower above), kept where nothing was measured since.
FUSED_PROJECTION_MAX_ROWS = 512


def fuse_projections(rows: int, device: torch.device) -> bool:
    """Whether several Linear maps of one (rows, in) input (TransformerConv's key, value and skip;
    GATv2Conv's lin_l, lin_r and res) run as one product over their stacked weights
    (`nn._common.fused_linear`): inside a trace, where the compiler schedules one GEMM (GATv2Conv
    compiled fwd+bwd on batches of 32 molecules 1.03-1.06x faster, 1 thread); eagerly on a CPU never.
    Measured there (1 thread, fwd+bwd, interleaved): stacking 2-4 maps of 64 -> 64 at 267-1,040 rows
    with the input's gradient and gathered outputs ran 0.92-1.00x the separate products' speed (the
    stacked backward joins the gradients first; the outputs are strided views), TransformerConv on
    FreeSolv batches 0.97-0.99x, and 15-45% slower above 512 rows without the input's gradient. Off the
    CPU (launches rather than arithmetic, not measured) eagerly up to FUSED_PROJECTION_MAX_ROWS rows."""
    return tracing() or (device.type != "cpu" and rows <= FUSED_PROJECTION_MAX_ROWS)


def choose_padding(cost: int, edges: int) -> bool:
    """Whether attention within each graph of a batch (`kernels.within_graphs`, exact softmax without
    bias or returned weights, backend "auto") runs as one SDPA over the batch's graphs packed in
    padded rows (`kernels.padded`) rather than over its block graph: when the padded plan's cost in
    scores (`padded.rows_cost`) is at most PADDED_MAX_WASTE times the graphs' sum_b n_b^2 edges."""
    return cost <= PADDED_MAX_WASTE * edges


def choose_packing(device: torch.device) -> bool:
    """Whether attention within the graphs of a batch packs several graphs into a padded row
    (`kernels.padded`) rather than one per row: on the CPU, whose SDPA pays per row and head about
    as much as for PACK_ROW_SCORES more scores (where that was measured). Elsewhere one graph per
    row: a packed row's result must be checked for a NaN of one graph reaching another (two host
    reads per call, which a GPU step captured in a CUDA graph cannot make), and GPU SDPA kernels were
    not measured to pay per row."""
    return device.type == "cpu"


def _local_pays(graph: Graph) -> bool:
    """The "local" part of the rule: enough edges per destination first (O(1)), then the tiles'
    density (O(E) once, cached on the graph): of tiles of 16 rows first, which bounds that of any
    larger tile from above, so a random graph costs one pass over its edges."""
    if graph.num_dst == 0 or graph.num_edges < LOCAL_MIN_DEGREE * graph.num_dst:
        return False
    if cached_layout(graph, TILE_ROWS[0]).density < LOCAL_MIN_DENSITY:
        return False
    return cached_layout(graph).density >= LOCAL_MIN_DENSITY


def choose_order(graph: Graph, node_order: Optional[str], backend: str) -> bool:
    """Whether a call runs on the graph relabeled in its locality order (`graphs.locality_view`):
    where that order brings each destination's sources at least twice as near (`graphs.locality_pays`,
    decided once per Graph and cached). With kernel_options node_order="locality" on any graph; with
    backend "auto" and no node_order on a `Graph` of at least ORDER_MIN_NODES nodes from its second call
    on (the search costs about as much as one call; a graph attended over once, or a raw edge_index,
    never pays it) that does not record blocks. Never inside a trace (the search branches on the data),
    nor for a graph of two node sets (cross attention, a KV cache's keys), which one permutation of its
    nodes cannot order."""
    if tracing() or graph.num_src != graph.num_dst:
        return False
    if node_order is None and (backend != "auto" or graph.one_call or graph.num_dst < ORDER_MIN_NODES):
        return False
    if node_order is None:
        calls = graph.cached("auto_order_calls", lambda: [0])
        calls[0] += 1
        if calls[0] < 2 or graph.blocks:  # a graph seen once pays no search; blocks are in their order already
            return False
    return locality_pays(graph)


__all__ = [
    "choose_auto",
    "choose_order",
    "choose_packing",
    "choose_padding",
    "factor_edge_projection",
    "fuse_projections",
    "FUSED_PROJECTION_MAX_ROWS",
    "ORDER_MIN_NODES",
]
