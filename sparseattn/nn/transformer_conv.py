"""`TransformerConv`: PyG's graph transformer operator (UniMP, Shi et al. 2021) on `edge_attention`."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._checks import check_edge_attr
from ..functional import edge_attention
from ..graphs import Graph
from ..kernels.projected import EdgeProjection, QueryProjection
from ._common import (
    NotScriptable,
    check_backend,
    check_dropout,
    edge_count,
    explained_edge_weight,
    fused_linear,
    graph_of_adj_t,
    lazy_or_linear,
)

PairTensor = Tuple[Tensor, Tensor]


class TransformerConv(NotScriptable, nn.Module):
    """Multi-head dot-product attention over the in-edges of each node, as
    `torch_geometric.nn.TransformerConv`, with the same constructor, parameter names and state-dict
    keys (`load_state_dict(pyg_conv.state_dict())` works both ways).

    Per edge j -> i, per head, with e_ji = lin_edge(edge_attr) when edge_dim is set (else 0):

        alpha_ji = softmax_i(<q_i, k_j + e_ji> / sqrt(C))     (exact, over i's in-edges)
        out_i    = sum_j dropout(alpha_ji) (v_j + e_ji)

    then heads are concatenated (or averaged with concat=False), and with root_weight
    x_r = lin_skip(x_i) is added (with beta: out = b x_r + (1 - b) out, b = sigmoid(lin_beta([out, x_r,
    out - x_r]))). A node without in-edges gets 0 before the skip. One `edge_attention` call with
    clamp=None.

    The queries and, with edge features, e_ji = W_h a_ji (W_h the head's (C, edge_dim) block of
    lin_edge) reach `edge_attention` by their factors (`kernels.projected.QueryProjection(x_dst,
    lin_query.weight, lin_query.bias)`, `EdgeProjection(edge_attr, lin_edge.weight)`), and the
    kernels decide whether to build e per edge and head, as PyG does (small graphs), or to attend
    through `<q_i, W_h a_ji> = <W_h^T q_i, a_ji>` with one (E, 1, C + edge_dim) edge row shared by
    the heads and queries [q, W_h^T q] from one product with composed weights: C + edge_dim values
    per edge instead of PyG's several (E, H, C) tensors, the same formula.

    Args:
        in_channels: input width, or a (source, destination) pair for bipartite inputs; -1 (either
            side) infers it at the first call (nn.LazyLinear, as PyG's lazy Linear).
        out_channels: C, the width per head.
        heads: number of heads H.
        concat: concatenate heads (output H * C) or average them (output C).
        beta: gate the skip connection (only with root_weight, as in PyG).
        dropout: dropout on the normalized attention weights (training mode only), as PyG: dropped
            after the softmax, survivors scaled by 1 / (1 - dropout), no renormalization.
        edge_dim: edge feature width; None for no edge features; -1 infers it at the first call
            with edge_attr (a lazy lin_edge, as PyG's lazy Linear).
        bias: biases in lin_key, lin_query, lin_value and lin_skip.
        root_weight: add the transformed destination features lin_skip(x_dst).
        backend: kernel backend for `edge_attention` (keyword only; not in PyG).

    Shapes:
        x: (N, in_channels), or a pair ((N_src, in_src), (N_dst, in_dst)).
        edge_index: (2, E) int64 (row 0 source, row 1 destination), a `Graph` with N_src sources
            and N_dst destinations, or PyG's torch.sparse adj_t (N_dst, N_src), adj_t[dst, src] set
            per edge (COO coalesced, CSR or CSC; edges in its storage order). Duplicate edges count
            once each.
        edge_attr: (E, edge_dim).
        Output: (N_dst, H * C) if concat else (N_dst, C); with return_attention_weights also
        (edge_index (2, E), alpha (E, H)) (adj_t itself in place of edge_index, as PyG).

    `torch.jit.script` is refused in one line (use torch.compile).
    """

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.0,
        edge_dim: Optional[int] = None,
        bias: bool = True,
        root_weight: bool = True,
        *,
        backend: str = "auto",
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        super().__init__()
        src_dim, dst_dim = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        if out_channels <= 0:
            raise ValueError(f"out_channels must be > 0, got {out_channels}")
        if heads <= 0:
            raise ValueError(f"heads must be > 0, got {heads}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.beta = beta and root_weight
        self.root_weight = root_weight
        self.concat = concat
        self.dropout = check_dropout(dropout)
        self.edge_dim = edge_dim
        self.backend = check_backend(backend)
        self._alpha: Optional[Tensor] = None  # PyG's attribute: None outside a call (see forward)
        width = heads * out_channels
        # registration order = PyG's, so one seed draws the same kind of init in the same order
        self.lin_key = lazy_or_linear(src_dim, width, bias)
        self.lin_query = lazy_or_linear(dst_dim, width, bias)
        self.lin_value = lazy_or_linear(src_dim, width, bias)
        self.lin_edge: Optional[nn.Linear] = None if edge_dim is None else lazy_or_linear(edge_dim, width, False)
        out_width = width if concat else out_channels
        self.lin_skip = lazy_or_linear(dst_dim, out_width, bias)
        self.lin_beta: Optional[nn.Linear] = nn.Linear(3 * out_width, 1, bias=False) if self.beta else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's init: every Linear uniform in +-1/sqrt(fan_in), weights and biases (PyG's
        kaiming_uniform(a=sqrt(5)) and bias init equal nn.Linear's)."""
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip, self.lin_beta):
            if lin is not None:
                lin.reset_parameters()

    def forward(
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Union[Tensor, Graph],
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, PairTensor]]:
        """PyG's TransformerConv.forward, argument for argument (shapes in the class docstring; no
        size argument, as PyG's). return_attention_weights: as PyG's, any bool (True or False) also
        returns (edge_index, alpha) with alpha (E, H) the softmax weights before dropout, in
        edge_index's order (a Graph's `edge_index` when a Graph was passed; a sparse adj_t as it
        came). `_alpha`, where PyG's message() leaves the weights for its forward to read and
        clear, is None before and after every call here too. (x_src, None) is refused (PyG fails
        in lin_query)."""
        if not isinstance(x, Tensor) and x[1] is None:
            raise ValueError(
                "x as a pair needs destination features: (x_src, None) is not supported, pass (x_src, x_dst)"
            )
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        given, edge_index = edge_index, graph_of_adj_t(edge_index)  # type: ignore[assignment]
        h, c = self.heads, self.out_channels
        dropout_p = self.dropout if self.training else 0.0
        want_alpha = isinstance(return_attention_weights, bool)
        kwargs: Dict[str, Any] = dict(clamp=None, dropout_p=dropout_p, backend=self.backend, return_weights=want_alpha)
        if self.lin_edge is None and edge_attr is not None:
            raise ValueError("edge_attr was given but the layer was built with edge_dim=None")
        if self.lin_edge is not None and edge_attr is None:
            raise ValueError(f"edge_attr (E, {self.edge_dim}) is required: the layer was built with edge_dim")
        if isinstance(self.lin_edge, nn.LazyLinear) and isinstance(edge_attr, Tensor) and edge_attr.dim() == 2:
            self.lin_edge(edge_attr[:0])  # edge_dim=-1: infer the width
        if self.lin_edge is not None and edge_attr is not None:
            edge_attr = check_edge_attr(edge_attr, edge_count(edge_index), self.lin_edge.in_features, "edge_dim")
        num_edges = edge_count(edge_index) or 0
        edge_weight = explained_edge_weight(self, x_dst, num_edges, x_dst.shape[0])
        if edge_weight is not None:  # under PyG's mask explainers (`sparseattn.nn.explainable`)
            kwargs["edge_weight"] = edge_weight
        k, v, x_r = self._project(x_src, x_dst)
        # q = lin_query(x_dst) and e_ji = lin_edge(a_ji) per head given by their factors: the kernels
        # build them, or attend around e (`kernels.projected`)
        q = QueryProjection(x_dst, self.lin_query.weight, self.lin_query.bias)
        e = None if self.lin_edge is None else EdgeProjection(edge_attr, self.lin_edge.weight)  # type: ignore[arg-type]
        result = edge_attention(q, k, v, edge_index, edge_key=e, edge_value=e, **kwargs)
        out, alpha = result if isinstance(result, tuple) else (result, None)
        out = out.reshape(-1, h * c) if self.concat else out.mean(dim=1)  # (N_dst, H*C) or (N_dst, C)
        if x_r is not None:  # root_weight: lin_skip(x_dst), from `_project`'s product
            if self.lin_beta is not None:
                b = torch.sigmoid(self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)))  # (N_dst, 1)
                out = b * x_r + (1 - b) * out
            else:
                out = out + x_r
        if not want_alpha:
            return out
        assert alpha is not None
        if isinstance(given, Tensor) and given.layout != torch.strided:
            return out, (given, alpha)  # PyG returns a sparse adj_t as it came
        index = edge_index.edge_index if isinstance(edge_index, Graph) else edge_index
        return out, (index, alpha)

    def _project(self, x_src: Tensor, x_dst: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """k and v (N_src, H, C) and lin_skip(x_dst) (None without root_weight), in one GEMM per input
        where the kernels say it pays (`fused_linear`); lazy widths inferred first (lin_query's too:
        the query reaches the kernels by its factors)."""
        lins = [self.lin_query, self.lin_key, self.lin_value, self.lin_skip]
        if any(isinstance(lin, nn.LazyLinear) for lin in lins):
            self.lin_query(x_dst[:0]), self.lin_key(x_src[:0]), self.lin_value(x_src[:0]), self.lin_skip(x_dst[:0])
        h, c = self.heads, self.out_channels
        on_dst = [self.lin_skip] if self.root_weight else []
        if x_src is x_dst:
            k, v, *skip = fused_linear(x_src, [self.lin_key, self.lin_value, *on_dst])
        else:
            k, v = fused_linear(x_src, [self.lin_key, self.lin_value])
            skip = [self.lin_skip(x_dst)] if self.root_weight else []
        return k.view(-1, h, c), v.view(-1, h, c), (skip[0] if skip else None)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
