"""A locality order for the nodes of a graph given in a shuffled order.

The kernels visit destinations in id order and gather the rows of their sources. On a graph with
structure (a point cloud's kNN graph, a mesh) whose ids are shuffled, consecutive destinations share
no sources and every gather misses the cache. `locality_order` numbers the nodes breadth first
(Cuthill-McKee: each level's new nodes ordered by their first-numbered neighbour, then by degree),
so that neighbours get nearby ids; `relabel` renames the nodes in that order. Relabel once per graph
and permute the node features once, at the model's input (permuting q, k and v at every attention
call costs more than the cache gains: see the guide's "Node order" section). `source_spread` says
how far from its destinations a graph's sources sit in id order, and `locality_pays` whether the
locality order brings them much nearer.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .graph import Graph
from .structure import row_pointers

MAX_RESTARTS = 1024  # components seeded one by one; nodes of any further ones keep their id order
SAMPLE_EDGES = 4096  # edges `source_spread` reads (standard error ~0.005 on random edges)
# `locality_pays` when the locality order brings sources this many times nearer their destinations.
# Measured spreads (given ids -> locality order): kNN(16) over 50K points and a 224 x 224 mesh with
# shuffled ids 0.31 -> 0.018 and 0.29 -> 0.004; a random 50K graph 0.33 -> 0.32; windows of 8K tokens
# and those graphs once relabeled unchanged. Where the order pays, the call was 1.4-1.8x faster; where
# it did not, the permutations made it up to 1.9x slower (window-8192, 1 thread).
LOCALITY_GAIN = 2.0


def _symmetric_csr(graph: Graph) -> Tuple[Tensor, Tensor]:
    """Row pointers (N + 1,) and neighbour ids of the graph's edges taken both ways (duplicates kept)."""
    a = torch.cat([graph.src, graph.dst])
    b = torch.cat([graph.dst, graph.src])
    return row_pointers(a, graph.num_dst), b[torch.argsort(a, stable=True)]


def locality_order(graph: Graph) -> Tensor:
    """(N,) int64: the node ids in breadth-first (Cuthill-McKee) order, new id i -> old id order[i].
    Each component starts from its lowest id; a level's new nodes are sorted by the new id of the
    neighbour that found them, then by degree. Edges count in both directions. Needs a graph over one
    node set (num_src == num_dst)."""
    if graph.num_src != graph.num_dst:
        raise ValueError(
            f"locality_order needs one node set (num_src == num_dst), got {graph.num_src} sources and "
            f"{graph.num_dst} destinations"
        )
    n, device = graph.num_dst, graph.device
    ptr, nbr = _symmetric_csr(graph)
    degree = ptr[1:] - ptr[:-1]
    key_base = int(degree.max()) + 1 if n else 1  # key = finder's new id * key_base + degree
    rank = torch.full((n,), -1, dtype=torch.long, device=device)
    pieces, numbered, restarts = [], 0, 0
    frontier = torch.zeros(0, dtype=torch.long, device=device)
    while numbered < n:
        if frontier.numel() == 0:  # a new component: its lowest unnumbered id
            if restarts == MAX_RESTARTS:
                rest = (rank < 0).nonzero().view(-1)
                rank[rest] = torch.arange(numbered, n, device=device)
                pieces.append(rest)
                break
            frontier = (rank < 0).nonzero()[:1].view(-1)
            rank[frontier] = numbered
            pieces.append(frontier)
            numbered, restarts = numbered + 1, restarts + 1
        counts = degree[frontier]
        starts = torch.repeat_interleave(ptr[frontier] - torch.cumsum(counts, 0) + counts, counts)
        found = nbr[starts + torch.arange(starts.numel(), device=device)]  # the frontier's neighbours
        by = torch.repeat_interleave(rank[frontier], counts)  # the new id of the node that found each
        new = rank[found] < 0
        found, by = found[new], by[new]
        if found.numel() == 0:
            frontier = found
            continue
        key = torch.full((n,), torch.iinfo(torch.long).max, dtype=torch.long, device=device)
        key.scatter_reduce_(0, found, by * key_base + degree[found], "amin")
        level = torch.unique(found)
        level = level[torch.argsort(key[level], stable=True)]
        rank[level] = torch.arange(numbered, numbered + level.numel(), device=device)
        pieces.append(level)
        numbered += level.numel()
        frontier = level
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long, device=device)


def relabel(graph: Graph, order: Tensor) -> Graph:
    """The graph with node order[i] renamed i (order: (N,) a permutation, as `locality_order` gives),
    its edges in the same order, so per-edge tensors still line up. Rows of node tensors follow with
    x.index_select(0, order), and an output in the new order goes back with
    out.index_select(0, rank), rank[order] = arange(N).

        order = graphs.locality_order(graph)    # once per graph
        g = graphs.relabel(graph, order)
        out = model(x.index_select(0, order), g).index_select(0, torch.argsort(order))
    """
    n = graph.num_dst
    if graph.num_src != n:
        raise ValueError(f"relabel needs one node set (num_src == num_dst), got {graph.num_src} and {n}")
    order = torch.as_tensor(order, device=graph.device)
    if order.shape != (n,) or order.dtype.is_floating_point:
        raise ValueError(f"order must be an integer tensor of shape ({n},), got {order.dtype} {tuple(order.shape)}")
    rank = torch.full((n,), -1, dtype=torch.long, device=graph.device)
    rank[order.long()] = torch.arange(n, device=graph.device)
    if bool((rank < 0).any()):
        raise ValueError(f"order must be a permutation of the {n} node ids (some id is missing or repeated)")
    return Graph(rank[graph.edge_index], num_src=n, num_dst=n)


def source_spread(graph: Graph) -> float:
    """Mean |src / N_src - dst / N_dst| over a strided sample of SAMPLE_EDGES edges: about 1/3 for
    random edges, near 0 when each destination's sources sit near it in id order (windows, blocks
    of a batch, a graph in `locality_order`). Cached on the graph."""

    def build() -> float:
        step = max(1, graph.num_edges // SAMPLE_EDGES)
        src, dst = graph.src[::step][:SAMPLE_EDGES].double(), graph.dst[::step][:SAMPLE_EDGES].double()
        return float((src / max(graph.num_src, 1) - dst / max(graph.num_dst, 1)).abs().mean())

    return graph.cached("source_spread", build)


def locality_pays(graph: Graph) -> bool:
    """Whether relabeling in `locality_order` brings the graph's sources at least LOCALITY_GAIN times
    nearer their destinations (`source_spread` before over after): True for a graph with structure
    under shuffled ids, False for one already in a local order (a window, a mesh in row order, a
    relabeled graph) and for one without structure (random edges, which no order brings near).
    `KernelOptions(node_order="locality")` permutes only where it pays. Builds `locality_view`;
    cached on the graph."""
    return graph.cached(
        "locality_pays", lambda: source_spread(graph) > LOCALITY_GAIN * source_spread(locality_view(graph)[2])
    )


def locality_view(graph: Graph) -> Tuple[Tensor, Tensor, Graph]:
    """(order, rank, relabeled graph) for `KernelOptions(node_order="locality")`: order =
    `locality_order(graph)`, rank its inverse (rank[order] = arange(N)), the graph relabeled in that
    order; built once and cached on the graph."""

    def build() -> Tuple[Tensor, Tensor, Graph]:
        order = locality_order(graph)
        local = relabel(graph, order)
        local.cached("locality_pays", lambda: False)  # in its order already: no search for it again
        return order, torch.argsort(order), local

    return graph.cached("locality_view", build)


__all__ = ["locality_order", "relabel", "locality_view", "locality_pays", "source_spread"]
