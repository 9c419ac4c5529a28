"""`ExphormerAttention`: the Exphormer / GraphGPS sparse attention layer on `edge_attention`."""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor, nn

from .._checks import check_edge_attr
from ..functional import edge_attention
from ..graphs import Graph
from ._common import NotScriptable, check_backend, edge_count, graph_of_adj_t

EPS = 1e-6  # Exphormer's normalizer term: h = wV / (Z + 1e-6)


class ExphormerAttention(NotScriptable, nn.Module):
    """The attention of Exphormer (Shirzad et al. 2023; `graphgps/layer/Exphormer.py`), with its
    parameter names `Q`, `K`, `E`, `V` (nn.Linear, bias = use_bias), so state dicts load both ways.

    Per edge s -> t, per head (head dim d = out_dim // num_heads):

        score_e = exp(clamp(sum_c K[s, c] * Q[t, c] / sqrt(d) * E[e, c], -5, 5))
        h[t]    = sum_e score_e V[s] / (sum_e score_e + 1e-6)

    with E = self.E(edge_attr); without edge_attr the E factor is absent. One `edge_attention` call
    in clamp mode (-5, 5) with edge_scale=E and the kernel's eps=1e-6 option, which adds 1e-6 to each
    destination's normalizer (so a destination without in-edges gets 0).

    As in the original, `E` always exists (dim_edge defaults to in_dim). The original's virtual
    nodes (`use_virt_nodes`) are not included: add them as extra nodes and edges of the graph.

    Args:
        in_dim: input width.
        out_dim: output width H * d; must be divisible by num_heads.
        num_heads: H.
        use_bias: biases in Q, K, V, E.
        dim_edge: edge feature width (default in_dim).
        backend: kernel backend for `edge_attention` (keyword only).

    Shapes:
        x: (N, in_dim); edge_index: (2, E) int64 (row 0 source, row 1 destination) or a `Graph`
        over N nodes, or PyG's torch.sparse adj_t (N, N) (as `TransformerConv`'s); edge_attr: (E, dim_edge).
        Output: (N, out_dim). `torch.jit.script` is refused in one line (use torch.compile).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        num_heads: int,
        use_bias: bool,
        dim_edge: Optional[int] = None,
        *,
        backend: str = "auto",
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        super().__init__()
        if num_heads <= 0 or out_dim % num_heads != 0:
            raise ValueError(f"out_dim must be divisible by num_heads, got out_dim={out_dim}, num_heads={num_heads}")
        self.out_dim = out_dim // num_heads  # per head, as the original names it
        self.num_heads = num_heads
        self.use_bias = use_bias
        self.backend = check_backend(backend)
        if dim_edge is None:
            dim_edge = in_dim
        width = self.out_dim * num_heads
        # the original's registration order
        self.Q = nn.Linear(in_dim, width, bias=use_bias)
        self.K = nn.Linear(in_dim, width, bias=use_bias)
        self.E = nn.Linear(dim_edge, width, bias=use_bias)
        self.V = nn.Linear(in_dim, width, bias=use_bias)

    def forward(self, x: Tensor, edge_index: Union[Tensor, Graph], edge_attr: Optional[Tensor] = None) -> Tensor:
        """x: (N, in_dim), edge_index: (2, E), Graph or torch.sparse adj_t (N, N), edge_attr: (E, dim_edge) or
        None -> (N, out_dim)."""
        edge_index = graph_of_adj_t(edge_index)  # type: ignore[assignment]
        if edge_attr is not None:
            edge_attr = check_edge_attr(edge_attr, edge_count(edge_index), self.E.in_features, "dim_edge")
        h, d = self.num_heads, self.out_dim
        q = self.Q(x).view(-1, h, d)  # (N, H, d)
        k = self.K(x).view(-1, h, d)
        v = self.V(x).view(-1, h, d)
        e = None if edge_attr is None else self.E(edge_attr).view(-1, h, d)  # (E, H, d)
        out = edge_attention(q, k, v, edge_index, clamp=(-5.0, 5.0), edge_scale=e, eps=EPS, backend=self.backend)
        assert isinstance(out, Tensor)
        return out.reshape(-1, h * d)  # (N, H*d)

    def extra_repr(self) -> str:
        """The settings `print(module)` shows: heads, head dim, backend."""
        return f"num_heads={self.num_heads}, head_dim={self.out_dim}, backend={self.backend!r}"
