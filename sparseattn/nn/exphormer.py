"""`ExphormerAttention`: the Exphormer / GraphGPS sparse attention layer on `edge_attention`."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
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

    As in the original, `E` always exists (dim_edge defaults to in_dim).

    Virtual nodes (`use_virt_nodes=True`, as the original): the virtual nodes' states virt_h
    (N_virt, in_dim) join x as nodes N..N+N_virt-1, virt_edge_index (their edges to and from the
    real nodes, ids in that joint numbering) and virt_edge_attr join the graph's, one attention runs
    over all of them, and the real nodes' rows are the output; the virtual nodes' new states are
    returned beside it, `(out, virt_out)`.

    Batch interface (the original's `forward(batch)`): `layer(batch)` on a PyG Data/Batch with x,
    expander_edge_index and expander_edge_attr (and virt_h, virt_edge_index, virt_edge_attr with
    virtual nodes) returns the real nodes' output and sets `batch.virt_h` to the virtual nodes'
    new states, as the original does.

    Args:
        in_dim: input width.
        out_dim: output width H * d; must be divisible by num_heads.
        num_heads: H.
        use_bias: biases in Q, K, V, E.
        dim_edge: edge feature width (default in_dim).
        use_virt_nodes: take virtual nodes (virt_h, virt_edge_index, virt_edge_attr) in forward.
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
        use_virt_nodes: bool = False,
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
        self.use_virt_nodes = use_virt_nodes
        self.backend = check_backend(backend)
        if dim_edge is None:
            dim_edge = in_dim
        width = self.out_dim * num_heads
        # the original's registration order
        self.Q = nn.Linear(in_dim, width, bias=use_bias)
        self.K = nn.Linear(in_dim, width, bias=use_bias)
        self.E = nn.Linear(dim_edge, width, bias=use_bias)
        self.V = nn.Linear(in_dim, width, bias=use_bias)

    def forward(
        self,
        x: Any,
        edge_index: Union[Tensor, Graph, None] = None,
        edge_attr: Optional[Tensor] = None,
        *,
        virt_h: Optional[Tensor] = None,
        virt_edge_index: Optional[Tensor] = None,
        virt_edge_attr: Optional[Tensor] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """x: (N, in_dim), edge_index: (2, E), Graph or torch.sparse adj_t (N, N), edge_attr: (E, dim_edge) or
        None -> (N, out_dim); with virtual nodes (out, virt_out (N_virt, out_dim)); x a PyG batch: see the
        class docstring."""
        if not isinstance(x, Tensor):
            return self._forward_batch(x)
        if edge_index is None:
            raise ValueError("edge_index is required when x is a tensor (a PyG batch carries expander_edge_index)")
        virtual = (virt_h, virt_edge_index, virt_edge_attr)
        if not self.use_virt_nodes and any(t is not None for t in virtual):
            raise ValueError("virt_h, virt_edge_index and virt_edge_attr need use_virt_nodes=True")
        if self.use_virt_nodes and any(t is None for t in virtual):
            raise ValueError("use_virt_nodes=True needs virt_h, virt_edge_index and virt_edge_attr")
        edge_index = graph_of_adj_t(edge_index)  # type: ignore[assignment]
        if edge_attr is not None:
            edge_attr = check_edge_attr(edge_attr, edge_count(edge_index), self.E.in_features, "dim_edge")
        num_real = x.shape[0]
        if self.use_virt_nodes:
            assert virt_h is not None and virt_edge_index is not None and virt_edge_attr is not None
            if edge_attr is None:
                raise ValueError("with virtual nodes, edge_attr is required (virt_edge_attr joins it)")
            index = edge_index.edge_index if isinstance(edge_index, Graph) else edge_index
            virt_edge_attr = check_edge_attr(
                virt_edge_attr, virt_edge_index.shape[1], self.E.in_features, "dim_edge", name="virt_edge_attr"
            )
            x = torch.cat([x, virt_h])
            edge_index = torch.cat([index, virt_edge_index.to(index.device, index.dtype)], dim=1)
            edge_attr = torch.cat([edge_attr, virt_edge_attr])
        h, d = self.num_heads, self.out_dim
        q = self.Q(x).view(-1, h, d)  # (N, H, d)
        k = self.K(x).view(-1, h, d)
        v = self.V(x).view(-1, h, d)
        e = None if edge_attr is None else self.E(edge_attr).view(-1, h, d)  # (E, H, d)
        out = edge_attention(q, k, v, edge_index, clamp=(-5.0, 5.0), edge_scale=e, eps=EPS, backend=self.backend)
        assert isinstance(out, Tensor)
        out = out.reshape(-1, h * d)  # (N (+ N_virt), H*d)
        return (out[:num_real], out[num_real:]) if self.use_virt_nodes else out

    def _forward_batch(self, batch: Any) -> Tensor:
        """The original's forward(batch): expander edges, virtual nodes from the batch; sets batch.virt_h."""
        if not hasattr(batch, "expander_edge_index"):
            raise TypeError(f"x must be a tensor or a PyG batch with expander_edge_index, got {type(batch).__name__}")
        virtual = {}
        if self.use_virt_nodes:
            virtual = {name: getattr(batch, name) for name in ("virt_h", "virt_edge_index", "virt_edge_attr")}
        result = self.forward(batch.x, batch.expander_edge_index, batch.expander_edge_attr, **virtual)
        if isinstance(result, tuple):
            result, batch.virt_h = result
        return result

    def extra_repr(self) -> str:
        """The settings `print(module)` shows: heads, head dim, backend."""
        return f"num_heads={self.num_heads}, head_dim={self.out_dim}, backend={self.backend!r}"
