"""`GlobalAttention`: GraphGPS's global attention over each graph of a batch, without padding."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import edge_attention
from ..graphs import Graph
from ..kernels.within_graphs import attention_within_graphs
from ._common import NotScriptable, check_backend, check_dropout
from ._padded import is_mha_call, padded_attention


class GlobalAttention(NotScriptable, nn.MultiheadAttention):
    """Full self-attention within each graph of a PyG-style batch (GraphGPS's global attention
    block), without padding every graph to the largest. Not PyG's `GlobalAttention` pooling layer.

    GraphGPS computes `to_dense_batch` + `nn.MultiheadAttention(..., key_padding_mask)`; this layer
    computes the same over `complete_per_graph(batch)` with one `edge_attention` call. Parameters
    mirror `nn.MultiheadAttention` (in_proj_weight, in_proj_bias, out_proj; same init), so
    `load_state_dict(mha.state_dict())` works both ways. It is an `nn.MultiheadAttention` subclass,
    so code that tests `isinstance(attn, nn.MultiheadAttention)` before its padded call (PyG's
    `GPSConv`, whose attention is otherwise skipped without an error) calls it, and gets MHA's answer.

    Args:
        embed_dim: model width, divisible by num_heads; head dim D = embed_dim // num_heads.
        num_heads: H.
        dropout: dropout on the normalized attention weights (training mode only), as
            nn.MultiheadAttention's.
        bias: biases in the input and output projections.
        batch_first: the layout of the nn.MultiheadAttention-style call: (B, L, E), else (L, B, E).
        clamp: None for exact softmax (nn.MultiheadAttention's), or (lo, hi) for clamp mode.
        backend: kernel backend for `edge_attention`; with "auto" the kernels decide how a batch
            runs (`kernels.within_graphs`: its graphs packed into padded rows for one SDPA where
            that wastes little, else over the batch's block-diagonal complete graph), planned once per batch
            tensor and shared by every layer given the same `batch` or `ptr`.

    Shapes:
        x: (N, embed_dim); batch: (N,) sorted graph ids; ptr: (B + 1,) offsets; graph: a prebuilt
        `complete_per_graph(...)` (or any Graph over N nodes) to reuse across layers.
        Output: (N, embed_dim); with need_weights=True or False, (out, weights) as MHA returns,
        weights (E, H) per edge of the graph or None.

    Where GraphGPS called `self_attn(h_dense, h_dense, h_dense, key_padding_mask=~mask,
    need_weights=False)[0]`, the same call works on this layer (MHA's signature and `(out,
    weights)` return; padded rows attend to their sequence's real rows, as in MHA; a sequence with
    no real row gets 0 where MHA gives NaN; returned weights are before dropout). Without padding,
    call `self_attn(h, batch)` (a tensor: do not index it with [0]) or
    `self_attn(h, batch, need_weights=False)[0]`.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        batch_first: bool = False,
        clamp: Optional[Tuple[float, float]] = None,
        backend: str = "auto",
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        if num_heads <= 0 or embed_dim <= 0 or embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim must be divisible by num_heads, got {embed_dim} and {num_heads}")
        dropout = check_dropout(dropout)
        # nn.MultiheadAttention's parameters and init (in_proj_weight, in_proj_bias, out_proj)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=batch_first)
        self.clamp = clamp
        self.backend = check_backend(backend)

    def reset_parameters(self) -> None:
        """nn.MultiheadAttention's init (its `_reset_parameters`): xavier-uniform in_proj_weight, zero biases."""
        self._reset_parameters()

    def forward(  # type: ignore[override]  # MHA's call is one of the two this forward takes
        self,
        x: Tensor,
        batch: Optional[Tensor] = None,
        ptr: Optional[Tensor] = None,
        *,
        graph: Optional[Graph] = None,
        need_weights: Optional[bool] = None,
        attn_bias: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Union[Tensor, Tuple[Tensor, Optional[Tensor]]]:
        """x: (N, embed_dim) -> (N, embed_dim), attending within the graphs given by `graph`, else
        `ptr`, else `batch`, else all of x as one graph. With need_weights (True or False), returns
        (out, weights) as nn.MultiheadAttention does: weights (E, H) over the graph's edges, or None.
        attn_bias: an additive score per edge and head, (E, H) or (E,), over the edges of `graph`
        (else of `complete_per_graph(batch, ptr)`: destination-major, each graph's block in turn;
        differentiable), as `edge_attention`'s bias (GraphGPS's attention bias, Graphormer-style).

        Called as nn.MultiheadAttention, layer(x, x, x, key_padding_mask=..., need_weights=...) with x
        (B, L, embed_dim) (batch_first) or (L, B, embed_dim), each sequence one graph: returns MHA's
        (out, weights), weights (B, L, L) (per head with average_attn_weights=False) or None."""
        if is_mha_call(x, batch):
            if attn_bias is not None:
                raise ValueError("attn_bias (E, H) is per edge of the graph: pass it with batch, ptr or graph")
            return padded_attention(
                self, x, batch, ptr, key_padding_mask, need_weights is not False, attn_mask, average_attn_weights,
                is_causal,
            )  # fmt: skip
        if key_padding_mask is not None or attn_mask is not None or is_causal:
            raise ValueError(
                "key_padding_mask, attn_mask and is_causal belong to the nn.MultiheadAttention-style call "
                "layer(x_dense, x_dense, x_dense, key_padding_mask=...); with batch, ptr or graph no padding is needed"
            )
        h, d = self.num_heads, self.head_dim
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).view(-1, 3, h, d).unbind(1)  # (N, H, D) each
        kwargs = dict(clamp=self.clamp, dropout_p=self.dropout if self.training else 0.0, bias=attn_bias)
        kwargs.update(backend=self.backend, return_weights=bool(need_weights))
        if graph is None:
            out = attention_within_graphs(q, k, v, batch, ptr, **kwargs)  # type: ignore[arg-type]
        else:
            out = edge_attention(q, k, v, graph, **kwargs)  # type: ignore[arg-type]
        out, weights = out if isinstance(out, tuple) else (out, None)
        out = self.out_proj(out.reshape(-1, self.embed_dim))  # (N, H, D) -> (N, embed_dim)
        return out if need_weights is None else (out, weights)

    def extra_repr(self) -> str:
        """The settings `print(module)` shows: width, heads, dropout, clamp."""
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, clamp={self.clamp}"
