"""anemoi's graph transformer message passing (`anemoi.models.layers.conv.GraphTransformerConv`, the
operator of ECMWF's AIFS encoder, processor and decoder) on `edge_attention`: the same call, without
PyG or the per-edge (E, H, C) messages PyG builds."""

from __future__ import annotations

from typing import Optional, Tuple, Union

from torch import Tensor, nn

from ..functional import edge_attention
from ..graphs import Graph
from ..kernels.projected import EdgeProjection
from ._common import NotScriptable, check_backend, check_dropout


class GraphTransformerConv(NotScriptable, nn.Module):
    """Attention from sources j to destinations i over the edges of a (bipartite) graph, with the
    edge features added to the keys and to the values, as anemoi's layer of that name:

        alpha_ij = softmax_j(<query_i, key_j + e_ij> / sqrt(C)),  out_i = sum_j alpha_ij (value_j + e_ij)

    (exact softmax over each destination's in-edges, attention dropout on alpha in training). The
    projections, norms and MLPs around it are the caller's, as in anemoi's blocks.

    Args:
        out_channels: C, the width of one head (the scale is C ** -0.5).
        dropout: attention dropout on alpha, in training only.
        keep_alpha: keep the last call's alpha, (E, H) in the edges' order, as `self.alpha` (anemoi
            always keeps it; here it costs an (E, H) tensor, so it is off by default).
        backend: `edge_attention`'s backend.

    forward(query, key, value, edge_attr, edge_index, size=None):
        query: (N_dst, H, C); key, value: (N_src, H, C); edge_attr: (E, H, C), anemoi's flat
        (E, H * C), or None; or, in place of the block's `lin_edge(edge_features)`, that projection by
        its factors, `sparseattn.EdgeProjection(edge_features, lin_edge.weight, lin_edge.bias)`, which
        lets the kernels attend without building the (E, H, C) term on large graphs (the same result);
        edge_index: (2, E) (row 0 source, row 1 destination) or a `Graph`; size: (N_src, N_dst),
        checked against the inputs when given. Returns (N_dst, H, C).
    """

    def __init__(self, out_channels: int, dropout: float = 0.0, *, keep_alpha: bool = False, backend: str = "auto"):
        super().__init__()
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or out_channels <= 0:
            raise ValueError(f"out_channels must be a positive int, got {out_channels!r}")
        self.out_channels = out_channels
        self.dropout = check_dropout(dropout)
        self.keep_alpha = keep_alpha
        self.backend = check_backend(backend)
        self.alpha: Optional[Tensor] = None

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        edge_attr: Union[Tensor, EdgeProjection, None],
        edge_index: Union[Tensor, Graph],
        size: Optional[Tuple[int, int]] = None,
    ) -> Tensor:
        """out (N_dst, H, C) of the class docstring's formula; keeps alpha with keep_alpha."""
        if query.dim() != 3 or query.shape[-1] != self.out_channels:
            raise ValueError(
                f"query must be (N_dst, H, {self.out_channels}) (out_channels={self.out_channels}), "
                f"got {tuple(query.shape)}"
            )
        if size is not None and (int(size[0]), int(size[1])) != (key.shape[0], query.shape[0]):
            raise ValueError(
                f"size {tuple(size)} disagrees with key ({key.shape[0]} sources) and query "
                f"({query.shape[0]} destinations)"
            )
        width = query.shape[1] * query.shape[2]
        if isinstance(edge_attr, Tensor) and edge_attr.dim() == 2 and edge_attr.shape[1] == width:
            edge_attr = edge_attr.view(-1, query.shape[1], query.shape[2])  # anemoi's flat (E, H * C)
        result = edge_attention(
            query,
            key,
            value,
            edge_index,
            scale=self.out_channels**-0.5,
            clamp=None,
            edge_key=edge_attr,
            edge_value=edge_attr,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_weights=self.keep_alpha,
        )
        if isinstance(result, tuple):
            result, self.alpha = result
        return result

    def extra_repr(self) -> str:
        """out_channels and dropout, as printed in the module's repr."""
        return f"{self.out_channels}, dropout={self.dropout}"
