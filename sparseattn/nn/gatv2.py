"""`GATv2Conv`: PyG's GATv2 operator (Brody et al. 2022) on `edge_attention`: the additive score by
`kernels.scores.gatv2_edge_scores`, then one exact-softmax call with it as the edge bias."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ..graphs import Graph
from ..kernels.scores import gatv2_edge_scores
from ._common import NotScriptable, check_backend, check_dropout, fused_linear
from ._gat_common import (
    FillValue,
    PairTensor,
    attend,
    attention_edges,
    check_common,
    finish,
    glorot_,
    glorot_linear,
    reset_glorot_linear,
    split_x,
)


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
    as its edge bias. Which score path runs (plain autograd on a small graph, chunks over the edges
    in destination order on a large one) is `kernels.scores.gatv2_edge_scores`' decision.

    Args: as `GATConv`, plus
        share_weights: one linear map for sources and destinations (lin_r is lin_l).
        bias: biases in lin_l and lin_r (as PyG) and on the output.
        edge_chunk: edges per chunk of the score computation (keyword only; not in PyG): each of
            the chunk's two buffers holds edge_chunk * H * C values. None: the device's default,
            `sparseattn.kernels.scores.default_chunk` (2^20 values per buffer on a CPU, 4 MiB in
            float32; 2^27 on a GPU).

    Shapes, return value, differences from PyG: as `GATConv`, without its size argument (PyG's
    GATv2Conv.forward has none) and with (x_src, None) refused (PyG's asserts x_dst).
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
        check_common(out_channels, heads, negative_slope, fill_value)
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
        self.lin_l = glorot_linear(src_dim, width, bias)
        self.lin_r = self.lin_l if share_weights else glorot_linear(dst_dim, width, bias)
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge: Optional[nn.Linear] = None if edge_dim is None else glorot_linear(edge_dim, width, False)
        out_width = width if concat else out_channels
        self.res: Optional[nn.Linear] = glorot_linear(dst_dim, out_width, False) if residual else None
        self.bias: Optional[nn.Parameter] = nn.Parameter(torch.empty(out_width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's init: glorot weights and attention vector, Linear biases uniform in
        +-1/sqrt(fan_in), zero output bias."""
        for lin in (self.lin_l, self.lin_r, self.lin_edge, self.res):
            if lin is not None and not isinstance(lin, nn.LazyLinear):
                reset_glorot_linear(lin)
        glorot_(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Union[Tensor, Graph],
        edge_attr: Optional[Tensor] = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, PairTensor]]:
        """PyG's GATv2Conv.forward, argument for argument (shapes in the class docstring).
        return_attention_weights: True also returns (edge_index, alpha), alpha (E', H) in that
        edge_index's order; for a torch.sparse adj_t, (weights, alpha) with weights a sparse
        (N_dst, N_src, H) tensor in adj_t's layout and alpha its values. None or False return the
        output alone (PyG tests the value). (x_src, None) is refused (PyG asserts)."""
        x_src, x_dst = split_x(x)
        assert x_dst is not None  # split_x refuses (x_src, None) here
        h, c = self.heads, self.out_channels
        x_l, x_r, res = self._project(x_src, x_dst, shared=self.share_weights and isinstance(x, Tensor))
        num_src, num_dst = x_l.shape[0], x_r.shape[0]
        graph, index, edge_attr, dropped = attention_edges(
            edge_index, edge_attr, self.edge_dim, self.add_self_loops, self.fill_value, num_src, num_dst
        )
        if isinstance(self.lin_edge, nn.LazyLinear) and edge_attr is not None:
            self.lin_edge(edge_attr[:0])  # edge_dim=-1: infer the width
        edge_weight = self.lin_edge.weight if self.lin_edge is not None and edge_attr is not None else None
        edge_attr = edge_attr if edge_weight is not None else None
        att = self.att.view(h, c)
        scores = gatv2_edge_scores(
            x_l, x_r, graph, index, att, self.negative_slope, edge_attr, edge_weight, chunk=self.edge_chunk
        )
        want_alpha = bool(return_attention_weights)
        result = attend(self, scores, x_l, graph, num_dst, want_alpha, dropped)
        return finish(self, result, res, index, want_alpha, edge_index, num_src, num_dst, dropped)

    def _project(self, x_src: Tensor, x_dst: Tensor, shared: bool) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """x_l (N_src, H, C), x_r (N_dst, H, C) (x_l itself where shared) and res(x_dst) (None without
        residual), the maps of one input in one GEMM where the kernels say it pays (`fused_linear`);
        lazy widths inferred first."""
        lins = [lin for lin in (self.lin_l, None if shared else self.lin_r, self.res) if lin is not None]
        if any(isinstance(lin, nn.LazyLinear) for lin in lins):
            self.lin_l(x_src[:0]), self.lin_r(x_dst[:0]), self.res(x_dst[:0]) if self.res is not None else None
        h, c = self.heads, self.out_channels
        if x_src is x_dst:
            x_l, *rest = fused_linear(x_src, lins)
            x_r = x_l if shared else rest.pop(0)
            res = rest[0] if rest else None
        else:
            x_l, x_r = self.lin_l(x_src), self.lin_r(x_dst)
            res = self.res(x_dst) if self.res is not None else None
        return x_l.view(-1, h, c), x_r.view(-1, h, c), res

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
