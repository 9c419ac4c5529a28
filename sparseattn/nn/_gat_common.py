"""What PyG's two graph attention layers share (`gat.GATConv`, `gatv2.GATv2Conv`): PyG's glorot
initialization, its self-loop rule with edge features, and the attention call that takes each edge's
score as its bias."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._checks import check_edge_attr
from .._tracing import tracing
from ..functional import edge_attention
from ..graphs import Graph
from ..graphs.memo import recall
from ..graphs.structure import row_pointers
from ._common import edge_count, explained_edge_weight, graph_of_adj_t

PairTensor = Tuple[Tensor, Tensor]
OptPairTensor = Tuple[Tensor, Optional[Tensor]]
FillValue = Union[float, Tensor, str]
FILL_REDUCTIONS = ("add", "sum", "mean", "min", "max", "mul")


class _GlorotLazyLinear(nn.LazyLinear):
    """nn.LazyLinear initialized as PyG's Linear(weight_initializer='glorot') once its width is known."""

    cls_to_become = nn.Linear

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            reset_glorot_linear(self)


def reset_glorot_linear(lin: nn.Linear) -> None:
    """PyG's Linear(weight_initializer='glorot'): weight uniform in +-sqrt(6 / (fan_in + fan_out)),
    bias uniform in +-1/sqrt(fan_in)."""
    nn.init.xavier_uniform_(lin.weight)
    if lin.bias is not None:
        bound = 1.0 / math.sqrt(lin.weight.shape[1]) if lin.weight.shape[1] > 0 else 0.0
        nn.init.uniform_(lin.bias, -bound, bound)


def glorot_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A glorot-initialized nn.Linear, or a lazy one for in_features=-1 (PyG's lazy width)."""
    if in_features == -1:
        return _GlorotLazyLinear(out_features, bias=bias)
    if in_features <= 0:
        raise ValueError(f"in_channels must be > 0, or -1 to infer it at the first call, got {in_features}")
    lin = nn.Linear(in_features, out_features, bias=bias)
    reset_glorot_linear(lin)
    return lin


def glorot_(t: Optional[Tensor]) -> None:
    """PyG's inits.glorot on a (1, H, C) attention vector: uniform in +-sqrt(6 / (H + C))."""
    if t is not None:
        bound = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
        with torch.no_grad():
            t.uniform_(-bound, bound)


def check_common(out_channels: int, heads: int, negative_slope: float, fill_value: object) -> None:
    if out_channels <= 0:
        raise ValueError(f"out_channels must be > 0, got {out_channels}")
    if heads <= 0:
        raise ValueError(f"heads must be > 0, got {heads}")
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float)):
        raise TypeError(f"negative_slope must be a float, got {type(negative_slope).__name__}")
    if isinstance(fill_value, str) and fill_value not in FILL_REDUCTIONS:
        raise ValueError(f"fill_value must be a float, a Tensor or one of {FILL_REDUCTIONS}, got {fill_value!r}")
    if not isinstance(fill_value, (int, float, str, Tensor)) or isinstance(fill_value, bool):
        raise TypeError(f"fill_value must be a float, a Tensor or a reduction name, got {type(fill_value).__name__}")


def split_x(x: Union[Tensor, OptPairTensor], allow_missing_dst: bool = False) -> OptPairTensor:
    """(x_src, x_dst): x twice for one tensor, the pair otherwise. (x_src, None) is PyG's GATConv's
    bipartite input without destination features (allow_missing_dst); GATv2Conv refuses it, as
    PyG's asserts."""
    if isinstance(x, Tensor):
        return x, x
    x_src, x_dst = x
    if x_dst is None and not allow_missing_dst:
        raise ValueError("x as a pair needs destination features: (x_src, None) is not supported, pass (x_src, x_dst)")
    return x_src, x_dst


def node_counts(
    x_src: Tensor, x_dst: Optional[Tensor], size: Optional[Tuple[int, int]], graph: object
) -> Tuple[int, int]:
    """(N_src, N_dst) as PyG's MessagePassing sets them: from the features, checked against size
    where both are given; without x_dst, N_dst is size[1], else the Graph's (or sparse adj_t's)
    N_dst, else N_src."""
    num_src = x_src.shape[0]
    if size is not None:
        if len(size) != 2:
            raise ValueError(f"size must be (N_src, N_dst), got {size!r}")
        dst_rows = None if x_dst is None else x_dst.shape[0]
        for n, rows, side in ((size[0], num_src, "x_src"), (size[1], dst_rows, "x_dst")):
            if rows is not None and n is not None and int(n) != rows:
                raise ValueError(f"size={tuple(size)} does not match {side} ({rows} rows)")
    if x_dst is not None:
        return num_src, x_dst.shape[0]
    if size is not None and size[1] is not None:
        return num_src, int(size[1])
    return num_src, graph.num_dst if isinstance(graph, Graph) else num_src


def loop_attr(edge_attr: Tensor, dst: Tensor, num_nodes: int, fill_value: FillValue) -> Tensor:
    """The self loops' features (num_nodes, F), as torch_geometric.utils.add_self_loops computes
    them: a constant, a tensor broadcast to every loop, or a reduction of each node's in-edges'
    features (0 for a node without in-edges; 1 for "mul")."""
    size = (num_nodes,) + tuple(edge_attr.shape[1:])
    if isinstance(fill_value, (int, float)):
        return edge_attr.new_full(size, float(fill_value))
    if isinstance(fill_value, Tensor):
        loop = fill_value.to(edge_attr.device, edge_attr.dtype)
        return (loop if loop.dim() == edge_attr.dim() else loop.unsqueeze(0)).expand(size).contiguous()
    index = dst.view(-1, 1).expand_as(edge_attr)
    if fill_value in ("add", "sum", "mean"):
        out = edge_attr.new_zeros(size).scatter_add_(0, index, edge_attr)
        if fill_value == "mean":
            count = edge_attr.new_zeros(num_nodes).scatter_add_(0, dst, edge_attr.new_ones(dst.shape[0]))
            out = out / count.clamp(min=1).view(-1, 1)
        return out
    if fill_value == "mul":
        return edge_attr.new_ones(size).scatter_reduce_(0, index, edge_attr, reduce="prod", include_self=True)
    reduce = "amax" if fill_value == "max" else "amin"
    return edge_attr.new_zeros(size).scatter_reduce_(0, index, edge_attr, reduce=reduce, include_self=False)


class AttentionEdges(NamedTuple):
    """What a GAT layer attends over (`attention_edges`): graph (a Graph or (2, E') tensor), its
    edge_index (2, E'), the edge features (E', F) or None, and dropped: None, or (E',) True at the graph's own
    self loops, kept in place under a trace where PyG removes them (their scores go to -inf in
    `attend`, their rows out of the returned weights in `finish`)."""

    graph: Union[Tensor, Graph]
    edge_index: Tensor
    edge_attr: Optional[Tensor]
    dropped: Optional[Tensor] = None


def attention_edges(
    edge_index: object,
    edge_attr: Optional[Tensor],
    edge_dim: Optional[int],
    add_loops: bool,
    fill_value: FillValue,
    num_src: int,
    num_dst: int,
) -> AttentionEdges:
    """The graph to attend over, its (2, E) index and its edge features, after PyG's
    remove_self_loops + add_self_loops(fill_value, num_nodes=min(N_src, N_dst)) when add_loops:
    the edges that are not loops in their order, then one loop per node 0..N-1. A raw edge_index
    under a trace keeps its edges, loops too, marked `dropped`, then one loop per node: the same
    attention with no size that comes from the data, so no graph break (`looped_index` would be one)."""
    if edge_attr is not None and edge_dim is None:
        raise ValueError("edge_attr was given but the layer was built with edge_dim=None")
    graph = graph_of_adj_t(edge_index)
    if edge_attr is not None and edge_attr.dim() == 1:
        edge_attr = edge_attr.view(-1, 1)  # PyG takes (E,) as one feature per edge
    if edge_attr is not None:
        assert edge_dim is not None
        width = edge_attr.shape[-1] if edge_dim == -1 and edge_attr.dim() == 2 else edge_dim  # -1: lazy, any width
        edge_attr = check_edge_attr(edge_attr, edge_count(graph), width, "edge_dim")  # type: ignore[arg-type]
    index = graph.edge_index if isinstance(graph, Graph) else graph
    if not isinstance(index, Tensor):
        raise TypeError(
            f"edge_index must be a (2, E) tensor, a Graph or a torch.sparse adj_t, got {type(index).__name__}"
        )
    if not add_loops:
        return AttentionEdges(graph, index, edge_attr)  # type: ignore[arg-type]
    if index.dim() != 2 or index.shape[0] != 2 or index.dtype.is_floating_point:
        raise ValueError(f"edge_index must be a (2, E) integer tensor, got {index.dtype} {tuple(index.shape)}")
    num_nodes = min(num_src, num_dst)
    if tracing() and not isinstance(graph, Graph):
        return _masked_loops(index, edge_attr, fill_value, num_nodes, num_src, num_dst)

    # a Graph the caller keeps keeps its looped Graph (and that one's kernel structure) too; the looped
    # index of a raw edge_index is made by the first layer given that tensor (`graphs.memo`: the others
    # read nothing back), its Graph lives for one call and says so (`Graph.one_call`) to the kernels
    if isinstance(graph, Graph):
        looped = lambda: _with_graph(looped_index(index, num_nodes), num_src, num_dst)  # noqa: E731
        kept, out = graph.cached(f"gat_self_loops_{num_src}_{num_dst}", looped)
    else:
        kept, with_loops = recall(index, ("gat self loops", num_src, num_dst), lambda: looped_index(index, num_nodes))
        out = Graph.borrowed(with_loops, num_src, num_dst, one_call=True)
    if edge_attr is not None:
        edge_attr = edge_attr.index_select(0, kept)
        kept_dst = out.edge_index[1, : kept.shape[0]]
        edge_attr = torch.cat([edge_attr, loop_attr(edge_attr, kept_dst, num_nodes, fill_value)])
    return AttentionEdges(out, out.edge_index, edge_attr)


def _masked_loops(
    index: Tensor, edge_attr: Optional[Tensor], fill_value: FillValue, num_nodes: int, num_src: int, num_dst: int
) -> AttentionEdges:
    """`attention_edges` of a raw index under a trace: its E edges, loops marked dropped, then one loop
    per node (2, E + num_nodes); the loops' features reduce the other edges' only (a dropped edge's
    row goes to a spare node, num_nodes, cut off after)."""
    is_loop = index[0] == index[1]  # (E,)
    looped = torch.cat([index, node_loops(index, num_nodes)], dim=1)
    dropped = torch.cat([is_loop, is_loop.new_zeros(num_nodes)])
    if edge_attr is not None:
        dst = torch.where(is_loop, torch.full_like(index[1], num_nodes), index[1])
        filled = loop_attr(edge_attr, dst, num_nodes + 1, fill_value)[:num_nodes]
        edge_attr = torch.cat([edge_attr, filled])
    return AttentionEdges(Graph.borrowed(looped, num_src, num_dst, one_call=True), looped, edge_attr, dropped)


def looped_index(index: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor]:
    """The positions of index's edges that are not loops (E_kept,) and the looped index: those edges in
    their order, then one loop per node 0..num_nodes-1 (2, E_kept + num_nodes)."""
    kept = (index[0] != index[1]).nonzero().view(-1)
    return kept, torch.cat([index.index_select(1, kept), node_loops(index, num_nodes)], dim=1)


def node_loops(index: Tensor, num_nodes: int) -> Tensor:
    """One self loop per node 0..num_nodes-1, (2, num_nodes) in index's dtype and device."""
    return torch.arange(num_nodes, device=index.device, dtype=index.dtype).view(1, -1).expand(2, -1)


def _with_graph(looped: Tuple[Tensor, Tensor], num_src: int, num_dst: int) -> Tuple[Tensor, Graph]:
    """(kept positions, looped index) with the index as a Graph of its own."""
    return looped[0], Graph.borrowed(looped[1], num_src, num_dst)


def attend(
    layer: Any,
    scores: Tensor,
    values: Tensor,
    graph: Union[Tensor, Graph],
    num_dst: int,
    want_alpha: bool,
    dropped: Optional[Tensor] = None,
):
    """edge_attention with the scores as the whole per-edge score (zero queries and keys of width 1,
    scale 0) and exact softmax. scores (E, H), values (N_src, H, C); dropped (E,) edges score -inf
    (`AttentionEdges`); under PyG's mask explainers each edge's weight times its mask
    (`_common.explained_edge_weight`; with dropped, the caller's edges keep their masks in place and
    the appended loops get 1, PyG's mask for the loops it adds)."""
    appended = 0  # the loops `_masked_loops` appends after the caller's edges (one per node)
    if dropped is not None:
        scores = scores.masked_fill(dropped.unsqueeze(1), float("-inf"))
        appended = min(values.shape[0], num_dst)
    h = values.shape[1]
    q0 = values.new_zeros(num_dst, h, 1)
    k0 = values.new_zeros(values.shape[0], h, 1)
    return edge_attention(
        q0,
        k0,
        values,
        graph,
        scale=0.0,
        clamp=None,
        bias=scores,
        dropout_p=layer.dropout if layer.training else 0.0,
        backend=layer.backend,
        return_weights=want_alpha,
        edge_weight=explained_edge_weight(layer, values, scores.shape[0], num_dst, appended),
    )


def finish(
    layer: Any,
    result,
    res: Optional[Tensor],
    index: Tensor,
    want_alpha: bool,
    given: object = None,
    num_src: int = 0,
    num_dst: int = 0,
    dropped: Optional[Tensor] = None,
):
    """Heads concatenated or averaged, residual and bias added; when asked, (out, (edge_index,
    alpha)), or for a torch.sparse adj_t (out, (weights, alpha)) as PyG (`sparse_weights`), without
    the dropped edges (`AttentionEdges`)."""
    out, alpha = result if isinstance(result, tuple) else (result, None)
    h, c = layer.heads, layer.out_channels
    out = out.reshape(-1, h * c) if layer.concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if layer.bias is not None:
        out = out + layer.bias
    if not want_alpha:
        return out
    if dropped is not None:
        index, alpha = index[:, ~dropped], alpha[~dropped]
    if isinstance(given, Tensor) and given.layout != torch.strided:
        weights = sparse_weights(given.layout, index, alpha, num_src, num_dst)
        return out, (weights, weights.values())
    return out, (index, alpha)


def sparse_weights(layout: torch.layout, index: Tensor, alpha: Tensor, num_src: int, num_dst: int) -> Tensor:
    """PyG's set_sparse_value(adj_t, alpha) for an adj_t given in `layout`: the attended edges
    (self loops included) as a hybrid sparse (N_dst, N_src, H) tensor in that layout, alpha its
    values, entries in the layout's order (COO and CSR by destination then source, CSC by source
    then destination; ties in edge order). index (2, E') (source, destination), alpha (E', H)."""
    src, dst = index[0], index[1]
    size = (num_dst, num_src, alpha.shape[1])
    by_src = layout == torch.sparse_csc
    order = torch.argsort(src * num_dst + dst if by_src else dst * num_src + src, stable=True)
    src, dst, values = src[order], dst[order], alpha[order]
    if layout == torch.sparse_coo:  # adj_t was coalesced, and self loops are added once: no duplicates
        return torch.sparse_coo_tensor(torch.stack([dst, src]), values, size, is_coalesced=True, check_invariants=False)
    major, minor, count = (src, dst, num_src) if by_src else (dst, src, num_dst)
    pointers = row_pointers(major, count)
    if by_src:
        return torch.sparse_csc_tensor(pointers, minor, values, size, check_invariants=False)
    return torch.sparse_csr_tensor(pointers, minor, values, size, check_invariants=False)
