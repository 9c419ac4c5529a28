"""`GATConv` and `GATv2Conv`: PyG's graph attention operators (Velickovic et al. 2018; Brody et
al. 2022) on `edge_attention`, with an exact softmax over each node's in-edges and no (E, H, C)
tensor kept for backward."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._checks import check_edge_attr
from ..functional import edge_attention
from ..graphs import Graph
from ..kernels.scores import gatv2_scores, gatv2_scores_reference
from ._common import NotScriptable, check_backend, check_dropout, edge_count, graph_of_adj_t
from ._small_graph import takes_small_path

PairTensor = Tuple[Tensor, Tensor]
FillValue = Union[float, Tensor, str]
FILL_REDUCTIONS = ("add", "sum", "mean", "min", "max", "mul")
# GATv2 scores of at most this many (edge, head, channel) values take the plain reference: 32 molecules
# (~550 edges), GATv2Conv(64, 16, heads=4, edge_dim=16) fwd+bwd 2.0 ms against 2.35 via the chunked op.
UNCHUNKED_ELEMENTS = 1 << 18


class _GlorotLazyLinear(nn.LazyLinear):
    """nn.LazyLinear initialized as PyG's Linear(weight_initializer='glorot') once its width is known."""

    cls_to_become = nn.Linear

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            _reset_glorot_linear(self)


def _reset_glorot_linear(lin: nn.Linear) -> None:
    """PyG's Linear(weight_initializer='glorot'): weight uniform in +-sqrt(6 / (fan_in + fan_out)),
    bias uniform in +-1/sqrt(fan_in)."""
    nn.init.xavier_uniform_(lin.weight)
    if lin.bias is not None:
        bound = 1.0 / math.sqrt(lin.weight.shape[1]) if lin.weight.shape[1] > 0 else 0.0
        nn.init.uniform_(lin.bias, -bound, bound)


def _glorot_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A glorot-initialized nn.Linear, or a lazy one for in_features=-1 (PyG's lazy width)."""
    if in_features == -1:
        return _GlorotLazyLinear(out_features, bias=bias)
    if in_features <= 0:
        raise ValueError(f"in_channels must be > 0, or -1 to infer it at the first call, got {in_features}")
    lin = nn.Linear(in_features, out_features, bias=bias)
    _reset_glorot_linear(lin)
    return lin


def _glorot_(t: Optional[Tensor]) -> None:
    """PyG's inits.glorot on a (1, H, C) attention vector: uniform in +-sqrt(6 / (H + C))."""
    if t is not None:
        bound = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
        with torch.no_grad():
            t.uniform_(-bound, bound)


def _check_common(out_channels: int, heads: int, negative_slope: float, fill_value: object) -> None:
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


def _split_x(x: Union[Tensor, PairTensor]) -> PairTensor:
    """(x_src, x_dst): x twice for one tensor, the pair otherwise (x_dst None refused)."""
    if isinstance(x, Tensor):
        return x, x
    x_src, x_dst = x
    if x_dst is None:
        raise ValueError("x as a pair needs destination features: (x_src, None) is not supported, pass (x_src, x_dst)")
    return x_src, x_dst


def _loop_attr(edge_attr: Tensor, dst: Tensor, num_nodes: int, fill_value: FillValue) -> Tensor:
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


def _edges(
    edge_index: object,
    edge_attr: Optional[Tensor],
    edge_dim: Optional[int],
    add_loops: bool,
    fill_value: FillValue,
    num_src: int,
    num_dst: int,
) -> Tuple[Union[Tensor, Graph], Tensor, Optional[Tensor]]:
    """The graph to attend over, its (2, E) index and its edge features, after PyG's
    remove_self_loops + add_self_loops(fill_value, num_nodes=min(N_src, N_dst)) when add_loops:
    the edges that are not loops in their order, then one loop per node 0..N-1."""
    if edge_attr is not None and edge_dim is None:
        raise ValueError("edge_attr was given but the layer was built with edge_dim=None")
    graph = graph_of_adj_t(edge_index)
    if edge_attr is not None and edge_attr.dim() == 1:
        edge_attr = edge_attr.view(-1, 1)  # PyG takes (E,) as one feature per edge
    if edge_attr is not None:
        assert edge_dim is not None
        edge_attr = check_edge_attr(edge_attr, edge_count(graph), edge_dim, "edge_dim")  # type: ignore[arg-type]
    index = graph.edge_index if isinstance(graph, Graph) else graph
    if not isinstance(index, Tensor):
        raise TypeError(
            f"edge_index must be a (2, E) tensor, a Graph or a torch.sparse adj_t, got {type(index).__name__}"
        )
    if not add_loops:
        return graph, index, edge_attr  # type: ignore[return-value]
    if index.dim() != 2 or index.shape[0] != 2 or index.dtype.is_floating_point:
        raise ValueError(f"edge_index must be a (2, E) integer tensor, got {index.dtype} {tuple(index.shape)}")
    num_nodes = min(num_src, num_dst)

    def looped() -> Tuple[Tensor, Graph]:
        keep = index[0] != index[1]
        loops = torch.arange(num_nodes, device=index.device, dtype=index.dtype).view(1, -1).expand(2, -1)
        with_loops = torch.cat([index[:, keep], loops], dim=1)
        return keep, Graph(with_loops, num_src=num_src, num_dst=num_dst)

    # a Graph the caller keeps keeps its looped Graph (and that one's kernel structure) too
    keep, out = graph.cached(f"gat_self_loops_{num_src}_{num_dst}", looped) if isinstance(graph, Graph) else looped()
    if edge_attr is not None:
        edge_attr = edge_attr[keep]
        edge_attr = torch.cat([edge_attr, _loop_attr(edge_attr, index[1][keep], num_nodes, fill_value)])
    return out, out.edge_index, edge_attr


def _attend(
    layer: Union["GATConv", "GATv2Conv"],
    scores: Tensor,
    values: Tensor,
    graph: Union[Tensor, Graph],
    num_dst: int,
    want_alpha: bool,
):
    """edge_attention with the scores as the whole per-edge score (zero queries and keys of width 1,
    scale 0) and exact softmax. scores (E, H), values (N_src, H, C)."""
    h = values.shape[1]
    backend = layer.backend
    if takes_small_path(values, scores.numel(), backend):
        # a small graph (a batch of molecules): the reference's gathers and index_adds, no CSR built;
        # 32 FreeSolv molecules, GATv2Conv(64, 16, heads=4): fwd+bwd 3.3 -> 2.1 ms (PyG's 1.8)
        backend = "reference"
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
        backend=backend,
        return_weights=want_alpha,
    )


def _v2_scores_by_destination(
    layer: "GATv2Conv",
    x_l: Tensor,
    x_r: Tensor,
    graph: Union[Tensor, Graph],
    index: Tensor,
    att: Tensor,
    edge_attr: Optional[Tensor],
    edge_weight: Optional[Tensor],
) -> Tensor:
    """`gatv2_scores` (E, H) in the caller's edge order, computed over the edges in destination order
    when the graph is a `Graph` (its CSR, which the attention call builds anyway): the gathers of
    x_r and the index_add of its gradient then walk rows in order. Measured 1 thread, 20K nodes x 17
    in-edges, H x C = 8 x 64: the op's fwd+bwd 1160 -> 972 ms."""
    if not isinstance(graph, Graph) or graph.is_sorted_by_dst:
        return gatv2_scores(x_l, x_r, index, att, layer.negative_slope, edge_attr, edge_weight, chunk=layer.edge_chunk)

    def order() -> Tuple[Tensor, Tensor]:
        perm = graph.csr().perm
        return index.index_select(1, perm), perm

    sorted_index, perm = graph.cached("gatv2_destination_order", order)
    ea = None if edge_attr is None else edge_attr.index_select(0, perm)
    scores = gatv2_scores(x_l, x_r, sorted_index, att, layer.negative_slope, ea, edge_weight, chunk=layer.edge_chunk)
    return scores.new_empty(scores.shape).index_copy(0, perm, scores)  # (E, H) back in the caller's order


def _finish(layer: Union["GATConv", "GATv2Conv"], result, res: Optional[Tensor], index: Tensor, want_alpha: bool):
    """Heads concatenated or averaged, residual and bias added; (out, (edge_index, alpha)) when asked."""
    out, alpha = result if isinstance(result, tuple) else (result, None)
    h, c = layer.heads, layer.out_channels
    out = out.reshape(-1, h * c) if layer.concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if layer.bias is not None:
        out = out + layer.bias
    if not want_alpha:
        return out
    return out, (index, alpha)


class GATConv(NotScriptable, nn.Module):
    """Graph attention (GAT), as `torch_geometric.nn.GATConv`, with the same constructor,
    parameter names and state-dict keys (`load_state_dict(pyg_conv.state_dict())` works both ways).

    Per edge j -> i and head, with W x the projected features (lin, or lin_src / lin_dst) and
    a_e = att_edge . lin_edge(edge_attr_ji) when edge_dim is set and edge_attr given:

        e_ji     = LeakyReLU(att_src . W x_j + att_dst . W x_i + a_e)
        alpha_ji = softmax_i(e_ji)                  (exact, over i's in-edges)
        out_i    = sum_j dropout(alpha_ji) W x_j

    then heads are concatenated (or averaged), res(x_i) (residual) and bias added. The score is a
    sum of per-node terms, so the layer builds it as an (E, H) tensor and makes one
    `edge_attention` call with it as the edge bias (zero queries and keys, scale 0): memory per
    edge is O(H), where PyG keeps (E, H, C) messages. att_edge . lin_edge(a) is computed as
    a @ (att_edge folded into lin_edge's weight), (H, edge_dim), without an (E, H, C) tensor.

    Args:
        in_channels: input width, or (source, destination) widths for bipartite inputs (then
            lin_src and lin_dst; else one lin); -1 infers a width at the first call.
        out_channels: C, the width per head.
        heads: number of heads H.
        concat: concatenate heads (output H * C) or average them (output C).
        negative_slope: LeakyReLU's slope.
        dropout: dropout on the normalized attention weights (training mode only).
        add_self_loops: remove each edge i -> i, then add one per node (of min(N_src, N_dst)),
            as PyG; their edge features follow fill_value.
        edge_dim: edge feature width; None for no edge features.
        fill_value: the self loops' edge features: a float, a tensor (edge_dim,), or a reduction
            of each node's in-edges' features ("mean", "add"/"sum", "min", "max", "mul").
        bias: add a learned bias to the output.
        residual: add res(x_dst), a linear map of the destination features.
        backend: kernel backend for `edge_attention` (keyword only; not in PyG).

    Shapes:
        x: (N, in_channels), or a pair ((N_src, in_src), (N_dst, in_dst)).
        edge_index: (2, E) int64 (row 0 source, row 1 destination), a `Graph`, or a torch.sparse
            adj_t (N_dst, N_src) (COO coalesced, CSR or CSC; edges in its storage order).
        edge_attr: (E, edge_dim) or (E,) for edge_dim=1; optional even with edge_dim set (then
            no edge term, as PyG). Given with edge_dim=None it is refused.
        Output: (N_dst, H * C) if concat else (N_dst, C); with return_attention_weights also
        (edge_index (2, E'), alpha (E', H)) over the edges attended (self loops appended).

    Differences from PyG: alpha is returned before dropout (PyG returns it after); a sparse
    adj_t is answered with a (2, E') edge_index, not a sparse tensor; (x_src, None) is refused.
    `torch.jit.script` is refused in one line (use torch.compile).
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: FillValue = "mean",
        bias: bool = True,
        residual: bool = False,
        *,
        backend: str = "auto",
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        super().__init__()
        _check_common(out_channels, heads, negative_slope, fill_value)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = float(negative_slope)
        self.dropout = check_dropout(dropout)
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual
        self.backend = check_backend(backend)
        width = heads * out_channels
        # registration order = PyG's
        self.lin: Optional[nn.Linear] = None
        self.lin_src: Optional[nn.Linear] = None
        self.lin_dst: Optional[nn.Linear] = None
        if isinstance(in_channels, int):
            self.lin = _glorot_linear(in_channels, width, False)
        else:
            self.lin_src = _glorot_linear(in_channels[0], width, False)
            self.lin_dst = _glorot_linear(in_channels[1], width, False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge: Optional[nn.Linear] = None
        self.att_edge: Optional[nn.Parameter] = None
        if edge_dim is not None:
            self.lin_edge = _glorot_linear(edge_dim, width, False)
            self.att_edge = nn.Parameter(torch.empty(1, heads, out_channels))
        out_width = width if concat else out_channels
        dst_dim = in_channels if isinstance(in_channels, int) else in_channels[1]
        self.res: Optional[nn.Linear] = _glorot_linear(dst_dim, out_width, False) if residual else None
        self.bias: Optional[nn.Parameter] = nn.Parameter(torch.empty(out_width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's init: glorot weights and attention vectors, zero bias."""
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None and not isinstance(lin, nn.LazyLinear):
                _reset_glorot_linear(lin)
        for att in (self.att_src, self.att_dst, self.att_edge):
            _glorot_(att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Union[Tensor, Graph],
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, PairTensor]]:
        """Args as the class docstring's Shapes. return_attention_weights: as PyG, any bool also
        returns (edge_index, alpha), alpha (E', H) in that edge_index's order."""
        x_src, x_dst = _split_x(x)
        h, c = self.heads, self.out_channels
        res = self.res(x_dst) if self.res is not None else None
        if self.lin is not None:
            xs = self.lin(x_src).view(-1, h, c)  # (N_src, H, C)
            xd = xs if isinstance(x, Tensor) else self.lin(x_dst).view(-1, h, c)  # (N_dst, H, C)
        else:
            assert self.lin_src is not None and self.lin_dst is not None
            xs = self.lin_src(x_src).view(-1, h, c)
            xd = self.lin_dst(x_dst).view(-1, h, c)
        alpha_src = (xs * self.att_src).sum(-1)  # (N_src, H)
        alpha_dst = (xd * self.att_dst).sum(-1)  # (N_dst, H)
        graph, index, edge_attr = _edges(
            edge_index, edge_attr, self.edge_dim, self.add_self_loops, self.fill_value, xs.shape[0], xd.shape[0]
        )
        scores = alpha_src.index_select(0, index[0]) + alpha_dst.index_select(0, index[1])  # (E, H)
        if self.lin_edge is not None and self.att_edge is not None and edge_attr is not None:
            # att_edge . (W_e a) = a . (W_e^T att_edge) per head: (H, edge_dim) instead of (E, H, C)
            w = torch.einsum("hcf,hc->hf", self.lin_edge.weight.view(h, c, -1), self.att_edge[0])
            scores = scores + edge_attr @ w.t()
        scores = F.leaky_relu(scores, self.negative_slope)
        want_alpha = isinstance(return_attention_weights, bool)
        result = _attend(self, scores, xs, graph, xd.shape[0], want_alpha)
        return _finish(self, result, res, index, want_alpha)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


class GATv2Conv(NotScriptable, nn.Module):
    """GATv2 attention, as `torch_geometric.nn.GATv2Conv`, with the same constructor, parameter
    names and state-dict keys (`load_state_dict(pyg_conv.state_dict())` works both ways).

    Per edge j -> i and head, with x_l = lin_l(x_j), x_r = lin_r(x_i) (lin_r is lin_l with
    share_weights) and W_e = lin_edge when edge_dim is set and edge_attr given:

        e_ji     = att . LeakyReLU(x_l[j] + x_r[i] + W_e edge_attr_ji)
        alpha_ji = softmax_i(e_ji)                  (exact, over i's in-edges)
        out_i    = sum_j dropout(alpha_ji) x_l[j]

    then heads are concatenated (or averaged), res(x_i) (residual) and bias added. The score needs
    a C-vector per edge and head; `sparseattn.kernels.scores.gatv2_scores` computes it in chunks of
    `edge_chunk` edges with a hand-written backward that recomputes each chunk, so no (E, H, C) tensor
    exists at once nor is kept for backward; then one `edge_attention` call takes the (E, H) scores
    as its edge bias. Graphs with E * H * C <= 2^18 (`UNCHUNKED_ELEMENTS`, a batch of molecules) take
    `gatv2_scores_reference` (plain autograd) when edge_chunk is None.

    Args: as `GATConv`, plus
        share_weights: one linear map for sources and destinations (lin_r is lin_l).
        bias: biases in lin_l and lin_r (as PyG) and on the output.
        edge_chunk: edges per chunk of the score computation (keyword only; not in PyG): each of
            the chunk's two buffers holds edge_chunk * H * C values. None: the device's default,
            `sparseattn.kernels.scores.default_chunk` (2^20 values per buffer on a CPU, 4 MiB in
            float32; 2^27 on a GPU).

    Shapes, return value, differences from PyG: as `GATConv`.
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: Optional[int] = None,
        fill_value: FillValue = "mean",
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        *,
        backend: str = "auto",
        edge_chunk: Optional[int] = None,
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        super().__init__()
        _check_common(out_channels, heads, negative_slope, fill_value)
        if edge_chunk is not None and (
            isinstance(edge_chunk, bool) or not isinstance(edge_chunk, int) or edge_chunk <= 0
        ):
            raise ValueError(f"edge_chunk must be a positive int or None, got {edge_chunk!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = float(negative_slope)
        self.dropout = check_dropout(dropout)
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual
        self.share_weights = share_weights
        self.backend = check_backend(backend)
        self.edge_chunk = edge_chunk
        width = heads * out_channels
        src_dim, dst_dim = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        # registration order = PyG's
        self.lin_l = _glorot_linear(src_dim, width, bias)
        self.lin_r = self.lin_l if share_weights else _glorot_linear(dst_dim, width, bias)
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge: Optional[nn.Linear] = None if edge_dim is None else _glorot_linear(edge_dim, width, False)
        out_width = width if concat else out_channels
        self.res: Optional[nn.Linear] = _glorot_linear(dst_dim, out_width, False) if residual else None
        self.bias: Optional[nn.Parameter] = nn.Parameter(torch.empty(out_width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's init: glorot weights and attention vector, Linear biases uniform in
        +-1/sqrt(fan_in), zero output bias."""
        for lin in (self.lin_l, self.lin_r, self.lin_edge, self.res):
            if lin is not None and not isinstance(lin, nn.LazyLinear):
                _reset_glorot_linear(lin)
        _glorot_(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Union[Tensor, Graph],
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, PairTensor]]:
        """Args as the class docstring's Shapes. return_attention_weights: as PyG, any bool also
        returns (edge_index, alpha), alpha (E', H) in that edge_index's order."""
        x_src, x_dst = _split_x(x)
        h, c = self.heads, self.out_channels
        res = self.res(x_dst) if self.res is not None else None
        x_l = self.lin_l(x_src).view(-1, h, c)  # (N_src, H, C)
        x_r = x_l if self.share_weights and isinstance(x, Tensor) else self.lin_r(x_dst).view(-1, h, c)  # (N_dst, H, C)
        graph, index, edge_attr = _edges(
            edge_index, edge_attr, self.edge_dim, self.add_self_loops, self.fill_value, x_l.shape[0], x_r.shape[0]
        )
        edge_weight = self.lin_edge.weight if self.lin_edge is not None and edge_attr is not None else None
        edge_attr = edge_attr if edge_weight is not None else None
        att = self.att.view(h, c)
        if self.edge_chunk is None and index.shape[1] * h * c <= UNCHUNKED_ELEMENTS:
            # a small graph (a batch of molecules): plain autograd over a few hundred KiB of (E, H, C)
            scores = gatv2_scores_reference(x_l, x_r, index, att, self.negative_slope, edge_attr, edge_weight)
        else:
            scores = _v2_scores_by_destination(self, x_l, x_r, graph, index, att, edge_attr, edge_weight)
        want_alpha = isinstance(return_attention_weights, bool)
        result = _attend(self, scores, x_l, graph, x_r.shape[0], want_alpha)
        return _finish(self, result, res, index, want_alpha)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
