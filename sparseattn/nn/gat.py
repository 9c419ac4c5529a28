"""`GATConv`: PyG's graph attention operator (Velickovic et al. 2018) on `edge_attention`, with an
exact softmax over each node's in-edges and no (E, H, C) tensor kept for backward."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..graphs import Graph
from ._common import NotScriptable, check_backend, check_dropout, graph_of_adj_t
from ._gat_common import (
    FillValue,
    OptPairTensor,
    attend,
    attention_edges,
    check_common,
    finish,
    glorot_,
    glorot_linear,
    node_counts,
    reset_glorot_linear,
    split_x,
)


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
        edge_dim: edge feature width; None for no edge features; -1 infers it at the first call
            with edge_attr (a lazy lin_edge, as PyG's lazy Linear).
        fill_value: the self loops' edge features: a float, a tensor (edge_dim,), or a reduction
            of each node's in-edges' features ("mean", "add"/"sum", "min", "max", "mul").
        bias: add a learned bias to the output.
        residual: add res(x_dst), a linear map of the destination features.
        backend: kernel backend for `edge_attention` (keyword only; not in PyG).

    Shapes:
        x: (N, in_channels), or a pair ((N_src, in_src), (N_dst, in_dst)), or (x_src, None) as
            PyG (no destination term in the score, no residual; N_dst from size, else from a
            Graph or adj_t, else N_src).
        edge_index: (2, E) int64 (row 0 source, row 1 destination), a `Graph`, or a torch.sparse
            adj_t (N_dst, N_src) (COO coalesced, CSR or CSC; edges in its storage order).
        edge_attr: (E, edge_dim) or (E,) for edge_dim=1; optional even with edge_dim set (then
            no edge term, as PyG). Given with edge_dim=None it is refused.
        size: (N_src, N_dst), optional, as PyG's.
        Output: (N_dst, H * C) if concat else (N_dst, C); with return_attention_weights=True also
        (edge_index (2, E'), alpha (E', H)) over the edges attended (self loops appended), or for
        a sparse adj_t (weights, alpha): a sparse (N_dst, N_src, H) tensor in adj_t's layout, as PyG.

    Differences from PyG: alpha is returned before dropout (PyG returns it after); a
    torch_sparse.SparseTensor is refused (pass a torch.sparse adj_t).
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
        check_common(out_channels, heads, negative_slope, fill_value)
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
            self.lin = glorot_linear(in_channels, width, False)
        else:
            self.lin_src = glorot_linear(in_channels[0], width, False)
            self.lin_dst = glorot_linear(in_channels[1], width, False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge: Optional[nn.Linear] = None
        self.att_edge: Optional[nn.Parameter] = None
        if edge_dim is not None:
            self.lin_edge = glorot_linear(edge_dim, width, False)
            self.att_edge = nn.Parameter(torch.empty(1, heads, out_channels))
        out_width = width if concat else out_channels
        dst_dim = in_channels if isinstance(in_channels, int) else in_channels[1]
        self.res: Optional[nn.Linear] = glorot_linear(dst_dim, out_width, False) if residual else None
        self.bias: Optional[nn.Parameter] = nn.Parameter(torch.empty(out_width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's init: glorot weights and attention vectors, zero bias."""
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None and not isinstance(lin, nn.LazyLinear):
                reset_glorot_linear(lin)
        for att in (self.att_src, self.att_dst, self.att_edge):
            glorot_(att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        x: Union[Tensor, OptPairTensor],
        edge_index: Union[Tensor, Graph],
        edge_attr: Optional[Tensor] = None,
        size: Optional[Tuple[int, int]] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]]]:
        """PyG's GATConv.forward, argument for argument (shapes in the class docstring).

        size: (N_src, N_dst), checked against the features; N_dst of (x_src, None) (else the
        adj_t's or Graph's N_dst, else N_src). return_attention_weights: True also returns
        (edge_index, alpha), alpha (E', H) in that edge_index's order; for a torch.sparse adj_t,
        (weights, alpha) with weights a sparse (N_dst, N_src, H) tensor in adj_t's layout and alpha
        its values. None or False return the output alone (PyG tests the value, not its type)."""
        x_src, x_dst = split_x(x, allow_missing_dst=True)
        h, c = self.heads, self.out_channels
        res = self.res(x_dst) if self.res is not None and x_dst is not None else None  # PyG: none without x_dst
        lin_src, lin_dst = (self.lin, self.lin) if self.lin is not None else (self.lin_src, self.lin_dst)
        assert lin_src is not None and lin_dst is not None
        xs = lin_src(x_src).view(-1, h, c)  # (N_src, H, C)
        xd: Optional[Tensor] = None
        if x_dst is not None:
            shared = isinstance(x, Tensor) and self.lin is not None
            xd = xs if shared else lin_dst(x_dst).view(-1, h, c)  # (N_dst, H, C)
        graph = graph_of_adj_t(edge_index)
        num_src, num_dst = node_counts(x_src, x_dst, size, graph)
        graph, index, edge_attr, dropped = attention_edges(
            graph, edge_attr, self.edge_dim, self.add_self_loops, self.fill_value, num_src, num_dst
        )
        scores = (xs * self.att_src).sum(-1).index_select(0, index[0])  # (E, H)
        if xd is not None:
            scores = scores + (xd * self.att_dst).sum(-1).index_select(0, index[1])
        if self.lin_edge is not None and self.att_edge is not None and edge_attr is not None:
            if isinstance(self.lin_edge, nn.LazyLinear):
                self.lin_edge(edge_attr[:0])  # edge_dim=-1: infer the width
            # att_edge . (W_e a) = a . (W_e^T att_edge) per head: (H, edge_dim) instead of (E, H, C)
            w = torch.einsum("hcf,hc->hf", self.lin_edge.weight.view(h, c, -1), self.att_edge[0])
            scores = scores + edge_attr @ w.t()
        scores = F.leaky_relu(scores, self.negative_slope)
        want_alpha = bool(return_attention_weights)
        result = attend(self, scores, xs, graph, num_dst, want_alpha, dropped)
        return finish(self, result, res, index, want_alpha, edge_index, num_src, num_dst, dropped)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
