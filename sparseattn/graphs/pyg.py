"""`from_pyg`: a `Graph` from a torch_geometric `Data` or `Batch`, read through its attributes
(`edge_index`, `num_nodes` or `x`, `ptr` or `batch`), so sparseattn never imports torch_geometric."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .._checks import check_edge_ids, check_edge_index, check_node_count
from .block import BLOCK_KINDS, square_blocks_num_edges
from .builders import from_blocks
from .graph import Graph
from .structure import sorted_id_counts


def from_pyg(data: object, *, num_nodes: Optional[int] = None, self_loops: bool = False) -> Graph:
    """The graph of a PyG `Data` or `Batch`: source = edge_index[0], destination = edge_index[1]
    (PyG's default flow, source_to_target), N_src = N_dst = N nodes.

    Args:
        data: an object with `edge_index`, a (2, E) integer tensor or torch_geometric.EdgeIndex,
            and a node count: `num_nodes`, else `x.shape[0]`. A batch (`ptr`, else a sorted `batch`
            vector of graph ids, as PyG's `Batch` has) records its graphs' node ranges, so
            `num_graphs`, `src_ptr`/`dst_ptr` and `split_dst`/`split_src` follow its graphs.
        num_nodes: N, instead of the data's (which PyG guesses from the largest id when the data
            has neither `num_nodes` nor `x`, missing trailing isolated nodes).
        self_loops: also attend from each node to itself: an edge (i, i) is appended after the
            data's edges for every node i without one, in node order (PyG's
            `add_remaining_self_loops` adds the same ones but moves existing loops to the end).

    The edges keep the data's order (appended loops last), so per-edge tensors built from
    `data.edge_attr` (bias, edge_key, ...) line up with the graph's edges. When every graph's edges
    are exactly one complete (or causal) block listed destination-major, as the builders list
    them, the graph records its `blocks` and the "dense" backend serves it; PyG sorts source-major,
    so sort first with `torch_geometric.utils.sort_edge_index(edge_index, edge_attr,
    sort_by_row=False)`, which permutes edge_attr along. Other destination-major indices without
    duplicates have their blocks found on first use, as any `Graph`'s.

    Raises TypeError naming what is missing (no `edge_index`, such as a Data left with only
    `adj_t` by `ToSparseTensor`; a HeteroData), ValueError for a node count or `ptr`/`batch` that
    does not fit, IndexError for an id >= N.
    """
    edge_index = check_edge_index(_edge_index_of(data), "data.edge_index")
    n = _num_nodes_of(data, num_nodes)
    check_edge_ids(edge_index, n, n, ("num_nodes", "num_nodes"), "data.edge_index")
    ptr = _graph_offsets(data, n)
    if self_loops:
        has_loop = torch.zeros(n, dtype=torch.bool, device=edge_index.device)
        has_loop[edge_index[0][edge_index[0] == edge_index[1]]] = True
        missing = torch.nonzero(~has_loop).squeeze(1)  # (N - nodes with a loop,)
        edge_index = torch.cat([edge_index, missing.expand(2, -1)], dim=1)
    g = _complete_blocks(edge_index, ptr if ptr is not None else (0, n))
    if g is None:
        g = Graph(edge_index, num_src=n, num_dst=n)
    if ptr is not None:  # the per-graph node ranges, with or without blocks
        g._src_ptr = g._dst_ptr = ptr
    return g


def _edge_index_of(data: object) -> object:
    if any(c.__name__ == "HeteroData" for c in type(data).__mro__):
        raise TypeError(
            "from_pyg takes a homogeneous Data or Batch, got a HeteroData: convert it with "
            "data.to_homogeneous(), or build Graph(data[edge_type].edge_index, num_src=..., num_dst=...) per edge type"
        )
    edge_index = getattr(data, "edge_index", None)
    if edge_index is not None:
        return edge_index
    if getattr(data, "adj_t", None) is not None:
        raise TypeError(
            f"from_pyg needs data.edge_index, but this {type(data).__name__} holds only adj_t (a sparse "
            "adjacency, as T.ToSparseTensor leaves it): build the data without that transform, or set "
            "data.edge_index = (adj_t's column ids, adj_t's row ids) stacked as a (2, E) tensor"
        )
    raise TypeError(
        f"from_pyg needs a Data or Batch with a (2, E) edge_index, got {type(data).__name__} without one"
        + (
            " (for a plain tensor use sparseattn.Graph(edge_index, num_src=N, num_dst=N))"
            if isinstance(data, Tensor)
            else ""
        )
    )


def _num_nodes_of(data: object, num_nodes: Optional[int]) -> int:
    n: object = num_nodes
    if n is None:
        n = getattr(data, "num_nodes", None)
    x = getattr(data, "x", None)
    if n is None and isinstance(x, Tensor):
        n = x.shape[0]
    if n is None:
        raise ValueError(
            f"from_pyg cannot tell how many nodes this {type(data).__name__} has (no num_nodes, no x): "
            "pass from_pyg(data, num_nodes=N)"
        )
    if isinstance(n, Tensor) and n.numel() == 1 and not n.is_floating_point():
        n = int(n)
    return check_node_count("num_nodes", n)


def _graph_offsets(data: object, n: int) -> Optional[Tuple[int, ...]]:
    """(B + 1,) node offsets of a batch's graphs from `data.ptr` or a sorted `data.batch`; None if neither."""
    named = getattr(data, "num_graphs", None)
    num_graphs = named if isinstance(named, int) else 0
    ptr, batch = getattr(data, "ptr", None), getattr(data, "batch", None)
    return batch_offsets(ptr, batch, n, name="data.", num_graphs=num_graphs)


def batch_offsets(
    ptr: Optional[object], batch: Optional[object], n: int, *, name: str = "", num_graphs: int = 0
) -> Optional[Tuple[int, ...]]:
    """(B + 1,) node offsets of the graphs of a PyG-style batch of n nodes, from ptr (B + 1,) node
    offsets, else batch (n,) sorted graph ids (at least num_graphs graphs: trailing empty ones
    kept); None if neither is given. ValueError naming `{name}ptr` or `{name}batch` otherwise."""
    if ptr is not None:
        if not isinstance(ptr, Tensor) or ptr.dim() != 1 or ptr.numel() == 0 or ptr.is_floating_point():
            got = f"shape {tuple(ptr.shape)}, dtype {ptr.dtype}" if isinstance(ptr, Tensor) else type(ptr).__name__
            raise ValueError(f"{name}ptr must be a non-empty 1-D integer tensor of node offsets (B + 1,), got {got}")
        offsets = tuple(int(x) for x in ptr.tolist())
        if offsets[0] != 0 or offsets[-1] != n or any(b < a for a, b in zip(offsets[:-1], offsets[1:])):
            raise ValueError(f"{name}ptr must be non-decreasing from 0 to num_nodes={n}, got {list(offsets)[:8]}")
        return offsets
    if batch is None:
        return None
    if isinstance(batch, Tensor) and (batch.is_floating_point() or batch.is_complex() or batch.dtype == torch.bool):
        raise ValueError(f"{name}batch must be an integer tensor of graph ids (int64 as in PyG), got {batch.dtype}")
    if not isinstance(batch, Tensor) or batch.dim() != 1 or batch.numel() != n:
        shape = tuple(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
        raise ValueError(
            f"{name}batch must be a 1-D integer tensor of graph ids, one per node: ({n},) for {n} node rows, got "
            f"{shape}"
        )
    counts = sorted_id_counts(batch, num_graphs) if n else batch.new_zeros(num_graphs)
    if counts is None:
        raise ValueError(f"{name}batch must hold graph ids >= 0 in non-decreasing order (sorted), as a PyG Batch does")
    return (0, *(int(x) for x in torch.cumsum(counts, 0).tolist()))


def _complete_blocks(edge_index: Tensor, ptr: Tuple[int, ...]) -> Optional[Graph]:
    """The graph with its blocks recorded when the edges are, graph by graph, exactly one dense
    block of one kind listed destination-major; else None."""
    sizes = [b - a for a, b in zip(ptr[:-1], ptr[1:])]
    num_edges = edge_index.shape[1]
    nodes, squares = sum(sizes), sum(s * s for s in sizes)
    for kind in BLOCK_KINDS if num_edges else ():
        if square_blocks_num_edges(kind, nodes, squares) != num_edges:
            continue
        g = from_blocks([(kind, s, s) for s in sizes if s], device=edge_index.device)  # empty graphs: no block
        if torch.equal(g.edge_index, edge_index):
            return g
    return None


def complete_per_graph(batch: Optional[Tensor] = None, ptr: Optional[Tensor] = None, num_nodes: int = -1) -> Graph:
    """The graph in which every node attends to every node of its own graph (itself included):
    block-diagonal, one recorded "full" block per graph, so the "dense" backend can serve it.

    Args:
        batch: (N,) PyG batch vector, graph id of each node, sorted.
        ptr: (B + 1,) node offsets of the graphs (PyG's `data.ptr`); used instead of batch if given.
        num_nodes: N; with neither batch nor ptr, all N nodes form one graph.

    Returns: a `Graph` over N nodes with sum_b n_b^2 edges, destination-major.
    """
    given = ptr if ptr is not None else batch
    if given is None:
        if num_nodes < 0:
            raise ValueError("pass batch, ptr or num_nodes")
        sizes, device = [num_nodes], None
    else:
        n = num_nodes
        if n < 0:  # no x to count: the nodes ptr or batch cover
            n = (int(ptr[-1]) if ptr.numel() else 0) if ptr is not None else given.numel()
        offsets = batch_offsets(ptr, batch, n)
        assert offsets is not None
        sizes, device = [b - a for a, b in zip(offsets[:-1], offsets[1:])], given.device
    # empty graphs hold no nodes: leaving them out changes no node id
    return from_blocks([("full", n, n) for n in sizes if n > 0], device=device)


__all__ = ["from_pyg", "batch_offsets", "complete_per_graph"]
