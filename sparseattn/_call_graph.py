"""What one `EdgeAttention` call attends over: its inputs' rows checked, the graph argument resolved
(a Graph or (2, E) index for `edge_attention`, or an object of a registered graph kind with its own
attention), and the subgraph of edges into the destinations a call gives rows for (`dst_rows`)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ._checks import check_graph_tensor, check_node_ids
from .functional import GraphLike, as_graph, edge_attention
from .graphs import Graph
from .graphs.kinds import graph_kind
from .kernels.projected import EdgeProjection
from .kv import KVStore

Attend = Callable[..., Union[Tensor, Tuple[Tensor, Tensor]]]  # edge_attention, or a graph kind's


def check_rows(name: str, x: object, width: int, width_name: str, rows: str, num_rows: Optional[int] = None) -> None:
    if (
        not isinstance(x, Tensor)
        or x.dim() != 2
        or x.shape[1] != width
        or (num_rows is not None and x.shape[0] != num_rows)
    ):
        rows = rows if num_rows is None else f"{rows}={num_rows}"
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have shape ({rows}, {width_name}={width}), got {shape}")


def attention_over(graph: object, cache: Optional[KVStore], dst_rows: Optional[Tensor]) -> Tuple[Attend, Any, Any]:
    """(attend, target, graph) for `forward`'s graph argument: `attend(q, k, v, target, **kwargs)`
    computes the call and `graph` is what per-edge inputs and weights follow (hooks get it). A Graph
    or (2, E) tensor is its own target, attended by `edge_attention`; an object of a kind registered
    in `graphs.kinds` (a distributed Shard) attends over itself along its local graph."""
    kind = graph_kind(graph)
    if kind is None:  # a torch_geometric.EdgeIndex becomes its plain tensor
        plain = graph if isinstance(graph, Graph) else check_graph_tensor(graph)
        return edge_attention, plain, plain
    for name, value in (("cache", cache), ("dst_rows", dst_rows)):
        if value is not None:
            raise ValueError(f"{name}= does not apply to attention on {kind.name} (graph is a {type(graph).__name__})")
    return kind.attend, graph, kind.graph(graph)


def kept_edges(per_edge: Sequence[Union[Tensor, EdgeProjection, None]], kept: Tensor) -> List[Any]:
    """Per-edge inputs with a row per edge of the graph as the rows of the `kept` (E,) edges (an
    `EdgeProjection`'s feature rows); one with a row per kept edge already (or a broadcast one) as
    it is. An input given in two roles (one projection as edge_key and edge_value) stays one object,
    as the kernels read it once."""
    done: Dict[int, Any] = {}
    for t in per_edge:
        if id(t) not in done:
            if isinstance(t, EdgeProjection):
                done[id(t)] = t._replace(features=kept_edges([t.features], kept)[0])
            elif isinstance(t, Tensor) and t.dim() and t.shape[0] == kept.shape[0]:
                done[id(t)] = t[kept]
            else:
                done[id(t)] = t
    return [done[id(t)] for t in per_edge]


def select_destinations(graph: GraphLike, q: Tensor, num_src: int, dst_rows: Tensor) -> Tuple[Graph, Tensor, Tensor]:
    """The subgraph of edges into `dst_rows`, queries placed at those rows (zeros elsewhere) and
    the (E,) bool mask of the kept edges. q: (R, H, D) -> (N_dst, H, D)."""
    if not isinstance(dst_rows, Tensor) or dst_rows.dim() != 1 or dst_rows.dtype != torch.long:
        raise TypeError("dst_rows must be a 1-D int64 tensor of destination ids")
    if dst_rows.shape[0] != q.shape[0]:
        raise ValueError(f"dst_rows has {dst_rows.shape[0]} ids but x_dst has {q.shape[0]} rows")
    if isinstance(graph, Graph):
        g = graph
    else:  # a raw index does not say how many destinations there are: as many as it or dst_rows names
        named = [int(t.max()) + 1 for t in (graph[1], dst_rows) if t.numel()]
        g = as_graph(graph, num_src=num_src, num_dst=max(named, default=0))
    check_node_ids(dst_rows, g.num_dst, "dst_rows")  # a negative id would index from the end
    active = torch.zeros(g.num_dst, dtype=torch.bool, device=q.device)
    active[dst_rows] = True
    if dst_rows.numel() and int(active.sum()) != dst_rows.numel():
        raise ValueError(
            "dst_rows must not repeat a destination: the rows of x_dst given for one destination would "
            "be written over each other"
        )
    q_all = q.new_zeros(g.num_dst, *q.shape[1:]).index_copy(0, dst_rows, q)
    kept = active[g.dst]  # (E,) the edges into dst_rows
    return g.edge_subgraph(kept), q_all, kept


__all__ = ["Attend", "attention_over", "check_rows", "kept_edges", "select_destinations"]
