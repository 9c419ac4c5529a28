"""`EdgeAttention`: a multi-head attention module over graph edges."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ._checks import check_clamp, check_dropout
from .functional import GraphLike, edge_attention
from .kernels import backend_names


class EdgeAttention(nn.Module):
    """Multi-head attention along the edges of a graph, with nn.MultiheadAttention's parameters.

    Parameter names, shapes and initialisation follow `nn.MultiheadAttention` (packed
    `in_proj_weight` when kdim == vdim == embed_dim, else `q_proj_weight`, `k_proj_weight`,
    `v_proj_weight`; `in_proj_bias`; `out_proj`), so a state dict loads from one to the other.

    Args:
        embed_dim: model width; must be divisible by num_heads.
        num_heads: number of heads H; head dim D = embed_dim // num_heads.
        bias: add biases to the projections.
        dropout: attention dropout on the normalized edge weights (training mode only).
        clamp: (lo, hi) score clamp, or None for exact softmax (see `edge_attention`). Bounds beyond
            +-686 raise ValueError here, beyond +-65 at a call with float32/float16/bfloat16 inputs.
        backend: kernel backend passed to `edge_attention`.
        kdim, vdim: feature sizes of the key and value inputs (default embed_dim).

    Shapes:
        x_dst: (N_dst, embed_dim); x_src: (N_src, kdim) (None: self-attention, x_src = x_dst);
        x_value: (N_src, vdim), default x_src; edge_bias: (E, H) or (E,).
        Output: (N_dst, embed_dim); with return_weights also (E, H) weights.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        clamp: Optional[Tuple[float, float]] = (-5.0, 5.0),
        backend: str = "auto",
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
    ) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be > 0, got embed_dim={embed_dim}, num_heads={num_heads}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim}, num_heads={num_heads}")
        if backend not in backend_names():
            raise ValueError(f"unknown backend {backend!r}; valid names are {', '.join(map(repr, backend_names()))}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout = check_dropout(dropout, "dropout")
        self.clamp = check_clamp(clamp)  # the widest dtype's range here; edge_attention checks q's dtype per call
        self.backend = backend
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _project(self, x_dst: Tensor, x_src: Tensor, x_value: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            wq, wk, wv = self.in_proj_weight[:e], self.in_proj_weight[e:2 * e], self.in_proj_weight[2 * e:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if self._qkv_same_embed_dim and x_src is x_dst and x_value is x_dst:
            q, k, v = F.linear(x_dst, self.in_proj_weight, b).chunk(3, dim=-1)  # one matmul for self-attention
        else:
            q, k, v = F.linear(x_dst, wq, bq), F.linear(x_src, wk, bk), F.linear(x_value, wv, bv)
        h, d = self.num_heads, self.head_dim
        return q.reshape(-1, h, d), k.reshape(-1, h, d), v.reshape(-1, h, d)  # (N, H, D)

    def forward(
        self,
        x_dst: Tensor,
        graph: GraphLike,
        x_src: Optional[Tensor] = None,
        *,
        x_value: Optional[Tensor] = None,
        edge_bias: Optional[Tensor] = None,
        return_weights: bool = False,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        if not isinstance(x_dst, Tensor) or x_dst.dim() != 2 or x_dst.shape[1] != self.embed_dim:
            shape = tuple(x_dst.shape) if isinstance(x_dst, Tensor) else type(x_dst).__name__
            raise ValueError(f"x_dst must have shape (N_dst, embed_dim={self.embed_dim}), got {shape}")
        if x_src is None:
            x_src = x_dst
        elif x_src.dim() != 2 or x_src.shape[1] != self.kdim:
            raise ValueError(f"x_src must have shape (N_src, kdim={self.kdim}), got {tuple(x_src.shape)}")
        if x_value is None:
            x_value = x_src
        if x_value.dim() != 2 or x_value.shape[1] != self.vdim or x_value.shape[0] != x_src.shape[0]:
            raise ValueError(
                f"x_value must have shape (N_src={x_src.shape[0]}, vdim={self.vdim}), got {tuple(x_value.shape)}"
                + ("; pass x_value= when kdim != vdim" if self.kdim != self.vdim else "")
            )
        q, k, v = self._project(x_dst, x_src, x_value)
        result = edge_attention(
            q, k, v, graph,
            clamp=self.clamp,
            bias=edge_bias,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_weights=return_weights,
        )
        out, weights = result if return_weights else (result, None)
        out = self.out_proj(out.reshape(-1, self.embed_dim))  # (N_dst, H, D) -> (N_dst, embed_dim)
        return (out, weights) if return_weights else out

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"clamp={self.clamp}, backend={self.backend!r}")
