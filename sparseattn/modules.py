"""`EdgeAttention`: a multi-head attention module over graph edges."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.hooks import RemovableHandle

from ._checks import check_clamp, check_dropout, check_node_ids
from .functional import GraphLike, as_graph, edge_attention
from .graphs import Graph
from .kernels import backend_names
from .kv import KeyValue, KVStore


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

    Beyond the plain call, as incremental decoders and adaptive-depth models need:
        kv = attn.project_kv(memory)                      # project a fixed source set once
        out = attn(x, cross_graph, kv=kv)                 # ... and reuse it in every call
        out = attn(x_new, step_graph, cache=kv_cache)     # append this step's keys/values (KVCache)
        out = attn(x_active, graph, dst_rows=active_ids)  # only some destinations, all sources
        attn.register_weights_hook(fn)                    # fn(module, graph, weights) per call
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
            raise ValueError(
                f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim}, num_heads={num_heads}"
            )
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
        self._weights_hooks: "OrderedDict[int, Callable]" = OrderedDict()
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

    def _weights(self, which: int) -> Tuple[Tensor, Optional[Tensor]]:
        """Weight and bias of projection `which` (0 = query, 1 = key, 2 = value)."""
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight[which * e : (which + 1) * e]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[which]
        b = None if self.in_proj_bias is None else self.in_proj_bias[which * e : (which + 1) * e]
        return w, b

    def project_q(self, x_dst: Tensor) -> Tensor:
        """Queries: (N, embed_dim) -> (N, H, D)."""
        _check_rows("x_dst", x_dst, self.embed_dim, "embed_dim", "N_dst")
        return F.linear(x_dst, *self._weights(0)).reshape(-1, self.num_heads, self.head_dim)

    def project_kv(self, x_src: Tensor, x_value: Optional[Tensor] = None) -> KeyValue:
        """Keys and values: x_src (N_src, kdim) and x_value (N_src, vdim), default x_src, -> two
        (N_src, H, D). Project a fixed source set once (an encoder's memory) and pass the result
        as `kv=` to every later call."""
        _check_rows("x_src", x_src, self.kdim, "kdim", "N_src")
        if x_value is None:
            if self.kdim != self.vdim:
                raise ValueError(
                    f"pass x_value= when kdim != vdim (kdim={self.kdim}, vdim={self.vdim}): the values "
                    "cannot be projected from x_src"
                )
            x_value = x_src
        _check_rows("x_value", x_value, self.vdim, "vdim", "N_src", num_rows=x_src.shape[0])
        h, d = self.num_heads, self.head_dim
        return KeyValue(
            F.linear(x_src, *self._weights(1)).reshape(-1, h, d), F.linear(x_value, *self._weights(2)).reshape(-1, h, d)
        )

    def forward(
        self,
        x_dst: Tensor,
        graph: GraphLike,
        x_src: Optional[Tensor] = None,
        *,
        x_value: Optional[Tensor] = None,
        kv: Optional[KeyValue] = None,
        cache: Optional["KVStore"] = None,
        dst_rows: Optional[Tensor] = None,
        edge_bias: Optional[Tensor] = None,
        return_weights: bool = False,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Attend from the sources into the destinations along `graph`'s edges.

        Args:
            x_dst: (N_dst, embed_dim) destination inputs; with `dst_rows`, (R, embed_dim) inputs of
                just those destinations.
            graph: (2, E) edge index or `Graph` from N_src sources into N_dst destinations.
            x_src: (N_src, kdim) source inputs; None means self-attention (x_src = x_dst).
            x_value: (N_src, vdim) value inputs, default x_src.
            kv: keys and values projected earlier (`project_kv`), used instead of x_src/x_value.
            cache: a `KVStore` (`KVCache` for incremental decoding, `NodeKV` for adaptive depth):
                this call's keys and values are written into it and attention reads all of its rows.
            dst_rows: (R,) int64 destination ids: compute only these rows of the output (the edges
                into other destinations are skipped; every source stays readable).
            edge_bias: (E, H) or (E,) additive scores.
            return_weights: also return the normalized (E, H) weights.

        Returns: (N_dst, embed_dim), or (R, embed_dim) with `dst_rows`; with return_weights also the
        (E', H) weights of the edges attended along (E' = E, or the edges into `dst_rows`, in the
        order of `graph.dst_subgraph`). Registered weight hooks see the same weights.
        """
        _check_rows("x_dst", x_dst, self.embed_dim, "embed_dim", "N_dst")
        self_attention = x_src is None and x_value is None
        if self_attention and kv is None and cache is None and dst_rows is None and self._qkv_same_embed_dim:
            # one packed matmul, as nn.MultiheadAttention does for self-attention
            q, k, v = F.linear(x_dst, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
            h, d = self.num_heads, self.head_dim
            q, kv = q.reshape(-1, h, d), KeyValue(k.reshape(-1, h, d), v.reshape(-1, h, d))  # (N, H, D)
        else:
            q = self.project_q(x_dst)
            if kv is None:
                kv = self.project_kv(x_dst if x_src is None else x_src, x_value)
            elif x_src is not None or x_value is not None:
                raise ValueError("pass either kv or x_src/x_value, not both")
        if cache is not None:
            kv = cache.update(kv, dst_rows)
        if dst_rows is not None:
            graph, q = _select_destinations(graph, q, kv.k.shape[0], dst_rows)
        need_weights = return_weights or bool(self._weights_hooks)
        result = edge_attention(
            q,
            kv.k,
            kv.v,
            graph,
            clamp=self.clamp,
            bias=edge_bias,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_weights=need_weights,
        )
        out, weights = result if isinstance(result, tuple) else (result, None)
        if dst_rows is not None:
            out = out[dst_rows]
        out = self.out_proj(out.reshape(out.shape[0], self.embed_dim))  # (N, H, D) -> (N, embed_dim)
        for hook in list(self._weights_hooks.values()):
            hook(self, graph, weights)
        if return_weights:
            assert weights is not None
            return out, weights
        return out

    def register_weights_hook(self, hook: Callable[["EdgeAttention", GraphLike, Tensor], None]) -> RemovableHandle:
        """Call `hook(module, graph, weights)` after every forward, with the (E, H) normalized
        weights along `graph` (the graph attended along: with `dst_rows`, the subgraph of edges into
        those rows). Returns a handle whose `remove()` unregisters it. `sparseattn.record_attention`
        uses this to collect the weights of a whole model for plots."""
        handle = RemovableHandle(self._weights_hooks)
        self._weights_hooks[handle.id] = hook
        return handle

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"clamp={self.clamp}, backend={self.backend!r}"
        )


def _check_rows(name: str, x: object, width: int, width_name: str, rows: str, num_rows: Optional[int] = None) -> None:
    if (
        not isinstance(x, Tensor)
        or x.dim() != 2
        or x.shape[1] != width
        or (num_rows is not None and x.shape[0] != num_rows)
    ):
        rows = rows if num_rows is None else f"{rows}={num_rows}"
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have shape ({rows}, {width_name}={width}), got {shape}")


def _select_destinations(graph: GraphLike, q: Tensor, num_src: int, dst_rows: Tensor) -> Tuple[Graph, Tensor]:
    """The subgraph of edges into `dst_rows` and queries placed at those rows (zeros elsewhere).
    q: (R, H, D) -> (N_dst, H, D)."""
    if not isinstance(dst_rows, Tensor) or dst_rows.dim() != 1 or dst_rows.dtype != torch.long:
        raise TypeError("dst_rows must be a 1-D int64 tensor of destination ids")
    if dst_rows.shape[0] != q.shape[0]:
        raise ValueError(f"dst_rows has {dst_rows.shape[0]} ids but x_dst has {q.shape[0]} rows")
    if isinstance(graph, Graph):
        g = graph
    else:  # a raw index does not say how many destinations there are: as many as it or dst_rows names
        named = [int(t.max()) + 1 for t in (graph[1], dst_rows) if t.numel()]
        g = as_graph(graph, num_src=num_src, num_dst=max(named, default=0))
    check_node_ids(dst_rows, g.num_dst, "dst_rows")  # a negative id would index from the end
    active = torch.zeros(g.num_dst, dtype=torch.bool, device=q.device)
    active[dst_rows] = True
    if dst_rows.numel() and int(active.sum()) != dst_rows.numel():
        raise ValueError(
            "dst_rows must not repeat a destination: the rows of x_dst given for one destination would "
            "be written over each other"
        )
    q_all = q.new_zeros(g.num_dst, *q.shape[1:]).index_copy(0, dst_rows, q)
    return g.dst_subgraph(active), q_all
