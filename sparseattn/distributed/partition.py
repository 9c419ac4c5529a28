"""`partition`: split a graph into one `Shard` per rank, by destination."""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from .._checks import check_edge_index, check_graph_tensor, edge_index_sizes
from ..graphs import Graph
from ..graphs.structure import row_pointers
from .shard import Shard, local_part

METHODS = ("contiguous", "metis")


def partition(
    graph: Union[Graph, Tensor],
    num_parts: int,
    method: str = "contiguous",
    node_weights: Optional[Tensor] = None,
    *,
    num_nodes: Union[int, Tuple[int, int], None] = None,
) -> List[Shard]:
    """Split `graph` by destination into `num_parts` shards, one per rank (`shards[rank]`).

    Each destination is owned by one rank, which computes its output from its in-edges; the source
    rows those edges read from other ranks form the rank's halo, exchanged before every attention
    call (`sharded_edge_attention`). Every rank may call this on the same graph and gets the same
    shards (METIS runs with a fixed seed).

    Args:
        graph: a `Graph` or (2, E) edge index (with `num_nodes`). When num_src == num_dst the sources
            and destinations are one node set (self-attention): node i's q, k and v rows live on the
            same rank. Otherwise (bipartite, e.g. cross attention) sources and destinations are split
            separately.
        num_parts: number of shards (the world size); parts may be empty when it exceeds the nodes.
        method: "contiguous": ranges of consecutive node ids (what windows, sequences and batches of
            graphs want; needs nothing); "metis": a min-cut partition of the symmetrized graph by
            pymetis (`pip install pymetis`; self-attention graphs only).
        node_weights: (N,) non-negative weights to balance; default in-degree + 1 (the attention work
            of a destination: its edges, plus its row). For a bipartite graph's sources the default
            is out-degree + 1.
        num_nodes: the node count of a raw edge index: an int (self-attention), or (num_src, num_dst).
            Required for a raw index (a torch_geometric.EdgeIndex may carry it as its sparse size):
            counting from the largest ids would leave trailing nodes without edges owned by no rank
            and split a self-attention graph whose last node sends no edge as bipartite. A `Graph`
            carries its counts; num_nodes, if given with one, must equal them.

    Returns:
        A list of `num_parts` `Shard`s.
    """
    graph = _as_graph(graph, num_nodes)
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be an int >= 1, got {num_parts!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    graph = graph.to("cpu")
    src, dst = graph.src, graph.dst
    bipartite = graph.num_src != graph.num_dst
    if bipartite and method == "metis":
        raise ValueError(
            f"method='metis' partitions one node set; this graph has num_src={graph.num_src} != "
            f"num_dst={graph.num_dst} (bipartite): use method='contiguous'"
        )
    weights = _weights(node_weights, graph.num_dst, torch.bincount(dst, minlength=graph.num_dst))
    if method == "metis":
        dst_owner = metis_parts(graph, num_parts, weights)
    else:
        dst_owner = contiguous_parts(weights, num_parts)
    src_owner = dst_owner
    if bipartite:
        out_degree = torch.bincount(src, minlength=graph.num_src)
        src_owner = contiguous_parts(_weights(None, graph.num_src, out_degree), num_parts)
    return shards_from_owners(graph, dst_owner, src_owner, num_parts)


def _as_graph(graph: Union[Graph, Tensor], num_nodes: Union[int, Tuple[int, int], None]) -> Graph:
    """`graph` as a Graph with the node counts of `num_nodes` (int or (num_src, num_dst))."""
    counts = None
    if num_nodes is not None:
        pair = num_nodes if isinstance(num_nodes, tuple) else (num_nodes, num_nodes)
        if len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair):
            raise ValueError(f"num_nodes must be an int >= 0 or a pair (num_src, num_dst) of them, got {num_nodes!r}")
        counts = (pair[0], pair[1])
    if isinstance(graph, Graph):
        if counts is not None and counts != (graph.num_src, graph.num_dst):
            raise ValueError(
                f"num_nodes={num_nodes!r} but the Graph has num_src={graph.num_src}, num_dst={graph.num_dst}: "
                "a Graph carries its node counts (leave num_nodes out)"
            )
        return graph
    if counts is None:
        num_src, num_dst = edge_index_sizes(graph)  # a torch_geometric.EdgeIndex's sparse size, where set
        if num_src is None or num_dst is None:
            raise ValueError(
                "partition of a raw edge_index needs num_nodes= (an int, or (num_src, num_dst) for a bipartite "
                "graph) or a sparseattn.Graph: the largest ids miss trailing nodes without edges"
            )
        counts = (num_src, num_dst)
    edge_index = check_edge_index(check_graph_tensor(graph))
    for row, name, n in ((0, "source", counts[0]), (1, "destination", counts[1])):
        top = int(edge_index[row].max()) if edge_index.shape[1] else -1
        if top >= n:
            raise IndexError(f"edge_index[{row}] holds {name} id {top}, out of range for num_nodes={num_nodes!r}")
    return Graph(edge_index, num_src=counts[0], num_dst=counts[1])


def _weights(node_weights: Optional[Tensor], n: int, degree: Tensor) -> Tensor:
    if node_weights is None:
        return (degree + 1).double()
    if not isinstance(node_weights, Tensor) or node_weights.shape != (n,):
        shape = tuple(node_weights.shape) if isinstance(node_weights, Tensor) else type(node_weights).__name__
        raise ValueError(f"node_weights must be a tensor of shape ({n},) (one weight per node), got {shape}")
    w = node_weights.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("node_weights must be finite and >= 0")
    return w


def contiguous_parts(weights: Tensor, num_parts: int) -> Tensor:
    """(N,) owning rank of each node: consecutive ranges whose weight sums are as equal as possible."""
    n = weights.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    ends = torch.cumsum(weights, 0)
    total = float(ends[-1])
    if total <= 0:  # all weights zero: equal node counts
        return torch.arange(n) * num_parts // n
    # node i goes to the part its weight's midpoint falls in
    mid = (ends - weights / 2) / total
    return torch.clamp((mid * num_parts).long(), max=num_parts - 1)


def metis_parts(graph: Graph, num_parts: int, weights: Tensor) -> Tensor:
    """(N,) owning rank of each node from METIS on the undirected simple graph underlying `graph`."""
    try:
        import numpy as np
        import pymetis
    except ImportError:
        raise ImportError(
            "partition(method='metis') needs pymetis: pip install pymetis (or sparseattn[metis]); "
            "method='contiguous' needs nothing"
        ) from None
    n = graph.num_dst
    if num_parts == 1 or n == 0:
        return torch.zeros(n, dtype=torch.long)
    src, dst = graph.src, graph.dst
    keep = src != dst
    a = torch.cat([src[keep], dst[keep]])
    b = torch.cat([dst[keep], src[keep]])
    key = torch.unique(a * n + b)  # sorted, no duplicates: row a, column b
    rows, cols = key // n, key % n
    xadj = row_pointers(rows, n)
    # METIS takes integer vertex weights: scale so the largest is 10^6
    top = float(weights.max()) if weights.numel() else 0.0
    vweights = (weights * (1e6 / top)).round().long().clamp_(min=1) if top > 0 else torch.ones(n, dtype=torch.long)
    xadj_np, adjncy_np, vw_np = xadj.numpy(), cols.numpy(), vweights.numpy()
    options = pymetis.Options(seed=0)
    if hasattr(pymetis, "CSRAdjacency"):
        adjacency = pymetis.CSRAdjacency(xadj_np, adjncy_np)
        result = pymetis.part_graph(num_parts, adjacency, vweights=vw_np, options=options)
    else:  # pymetis before 2025
        result = pymetis.part_graph(num_parts, xadj=xadj_np, adjncy=adjncy_np, vweights=vw_np, options=options)
    return torch.as_tensor(np.asarray(result[1]), dtype=torch.long)


def _positions(owner: Tensor, num_parts: int) -> Tuple[Tensor, List[Tensor]]:
    """Each node's position among its owner's nodes, and each part's nodes (ascending ids)."""
    order = torch.sort(owner, stable=True).indices  # nodes grouped by owner, ids ascending within
    counts = torch.bincount(owner, minlength=num_parts).tolist()
    pos = torch.empty_like(owner)
    starts = torch.repeat_interleave(torch.cumsum(torch.tensor([0] + counts[:-1]), 0), torch.tensor(counts))
    pos[order] = torch.arange(owner.numel()) - starts
    return pos, list(torch.split(order, counts))


def shards_from_owners(graph: Graph, dst_owner: Tensor, src_owner: Tensor, num_parts: int) -> List[Shard]:
    """The shards of `graph` given the owning rank of every destination and source ((N_dst,) and
    (N_src,) int64; the same tensor for a self-attention graph)."""
    self_attention = src_owner is dst_owner
    dst_pos, dst_nodes = _positions(dst_owner, num_parts)
    src_pos, src_nodes = (dst_pos, dst_nodes) if self_attention else _positions(src_owner, num_parts)
    src, dst = graph.src, graph.dst
    edge_part = dst_owner[dst]
    edge_order = torch.sort(edge_part, stable=True).indices  # edges grouped by part, global order within
    edge_groups = torch.split(edge_order, torch.bincount(edge_part, minlength=num_parts).tolist())
    parts = []
    for rank, ids in enumerate(edge_groups):
        s = src[ids]
        parts.append(
            local_part(
                s,
                dst_pos[dst[ids]],
                src_owner[s],
                src_pos[s],
                rank,
                num_parts,
                dst_nodes[rank].numel(),
                src_nodes[rank].numel(),
                graph.num_src,
            )
        )
    shards = []
    for rank in range(num_parts):
        # what rank sends to each peer p: the rows of p's halo it owns, in p's halo order
        pieces, counts = [], []
        for peer in range(num_parts):
            halo = parts[peer].halo
            start = sum(parts[peer].recv_counts[:rank])
            mine = halo[start : start + parts[peer].recv_counts[rank]]
            pieces.append(src_pos[mine])
            counts.append(mine.numel())
        nodes = dst_nodes[rank]
        shards.append(
            Shard(
                rank=rank,
                num_parts=num_parts,
                nodes=nodes,
                src_nodes=nodes if self_attention else src_nodes[rank],
                halo=parts[rank].halo,
                graph=parts[rank].graph,
                edge_ids=edge_groups[rank],
                send_index=torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long),
                send_counts=tuple(counts),
                recv_counts=parts[rank].recv_counts,
                num_nodes=graph.num_dst,
                num_src_nodes=graph.num_src,
            )
        )
    return shards
