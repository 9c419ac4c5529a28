"""`EdgeAttention`: a multi-head attention module over graph edges."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.hooks import RemovableHandle

from . import _mha_state
from ._call_graph import attention_over, check_rows, kept_edges, select_destinations
from ._checks import check_clamp, check_dropout, check_eps
from .functional import GraphLike
from .kernels import backend_names
from .kv import KeyValue, KVStore


class EdgeAttention(nn.Module):
    """Multi-head attention along the edges of a graph, with nn.MultiheadAttention's parameters.

    Parameter names, shapes and initialisation follow `nn.MultiheadAttention` (packed
    `in_proj_weight` when kdim == vdim == embed_dim, else `q_proj_weight`, `k_proj_weight`,
    `v_proj_weight`; `in_proj_bias`; `out_proj`), so a state dict loads from one to the other.
    With clamp=None the module computes what nn.MultiheadAttention computes on the same graph;
    clamp mode (the default) differs wherever a scaled score leaves [lo, hi]. To convert an
    nn.MultiheadAttention use `EdgeAttention.from_multihead_attention(mha)` (exact mode, checked).

    State dicts: nothing beyond MHA's keys is saved (an `_extra_state` entry would break strict
    loading into nn.MultiheadAttention). The module's clamp goes into the state dict's metadata
    (`state_dict()._metadata`, kept by torch.save/torch.load), and `load_state_dict` warns where the
    clamp would change results silently: a state dict whose metadata lacks that record (from
    nn.MultiheadAttention, or saved by sparseattn before it kept the record) loaded into a
    clamp-mode module, or one saved under another clamp. A plain dict without metadata (a copy,
    an EMA average) says nothing of its origin and loads without a warning.
    Keys `bias_k`/`bias_v` (MHA's add_bias_kv) are refused with ValueError: their extra key row
    has no counterpart along graph edges. MHA's add_zero_attn leaves no key, so only
    `from_multihead_attention` can refuse it.

    Args:
        embed_dim: model width; must be divisible by num_heads.
        num_heads: number of heads H; head dim D = embed_dim // num_heads.
        bias: add biases to the projections.
        dropout: attention dropout on the normalized edge weights (training mode only).
        clamp: (lo, hi) score clamp, or None for exact softmax (see `edge_attention`). Bounds beyond
            +-686 raise ValueError here, beyond +-65 at a call with float32/float16/bfloat16 inputs.
        backend: kernel backend passed to `edge_attention`.
        kdim, vdim: feature sizes of the key and value inputs (default embed_dim).
        eps: added to each destination's normalizer (clamp mode only; see `edge_attention`).
        num_kv_heads: heads H_kv of the keys and values (grouped-query attention), a divisor of
            num_heads; default num_heads. The key and value projections then have
            num_kv_heads * D outputs: `in_proj_weight` (embed_dim + 2 * num_kv_heads * D, embed_dim),
            or `k_proj_weight` (num_kv_heads * D, kdim) and `v_proj_weight` (num_kv_heads * D, vdim),
            and `in_proj_bias` (embed_dim + 2 * num_kv_heads * D,); query head h reads kv head
            h // (num_heads / num_kv_heads). The result equals a num_heads module whose key and value
            projections repeat each kv head's rows for its query heads; "reference" and "csr" never
            repeat k and v in memory, the other backends get them repeated (`edge_attention`).
            Below num_heads the state dict no longer loads into nn.MultiheadAttention.

    Shapes:
        x_dst: (N_dst, embed_dim); x_src: (N_src, kdim) (None: self-attention, x_src = x_dst);
        x_value: (N_src, vdim), default x_src; edge_bias: (E, H) or (E,); edge_key, edge_value,
        edge_scale: (E, H, D) or (E, embed_dim), the latter split into heads as the projections are
        (per query head, also with num_kv_heads < num_heads).
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
        eps: float = 0.0,
        num_kv_heads: Optional[int] = None,
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
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
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if isinstance(self.num_kv_heads, bool) or not isinstance(self.num_kv_heads, int) or self.num_kv_heads <= 0:
            raise ValueError(f"num_kv_heads must be a positive int or None, got {num_kv_heads!r}")
        if num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads (each kv head serves num_heads / num_kv_heads "
                f"query heads), got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        kv_dim = self.num_kv_heads * self.head_dim  # width of the key and value projections
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout = check_dropout(dropout, "dropout")
        self.clamp = check_clamp(clamp)  # the widest dtype's range here; edge_attention checks q's dtype per call
        self.eps = check_eps(eps, self.clamp)
        self.backend = backend
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(embed_dim + 2 * kv_dim, embed_dim))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim))
            self.k_proj_weight = nn.Parameter(torch.empty(kv_dim, self.kdim))
            self.v_proj_weight = nn.Parameter(torch.empty(kv_dim, self.vdim))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(embed_dim + 2 * kv_dim))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self._weights_hooks: "OrderedDict[int, Callable]" = OrderedDict()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.MultiheadAttention's init: xavier-uniform projection weights (packed or separate),
        zero biases; `out_proj.weight` keeps nn.Linear's init."""
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
        e, kv_dim = self.embed_dim, self.num_kv_heads * self.head_dim
        lo = (0, e, e + kv_dim)[which]
        hi = lo + (e if which == 0 else kv_dim)
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight[lo:hi]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[which]
        b = None if self.in_proj_bias is None else self.in_proj_bias[lo:hi]
        return w, b

    def project_q(self, x_dst: Tensor) -> Tensor:
        """Queries: (N, embed_dim) -> (N, H, D)."""
        check_rows("x_dst", x_dst, self.embed_dim, "embed_dim", "N_dst")
        return F.linear(x_dst, *self._weights(0)).reshape(-1, self.num_heads, self.head_dim)

    def project_kv(self, x_src: Tensor, x_value: Optional[Tensor] = None) -> KeyValue:
        """Keys and values: x_src (N_src, kdim) and x_value (N_src, vdim), default x_src, -> two
        (N_src, H_kv, D) (H_kv = num_kv_heads). Project a fixed source set once (an encoder's
        memory) and pass the result as `kv=` to every later call."""
        check_rows("x_src", x_src, self.kdim, "kdim", "N_src")
        if x_value is None:
            if self.kdim != self.vdim:
                raise ValueError(
                    f"pass x_value= when kdim != vdim (kdim={self.kdim}, vdim={self.vdim}): the values "
                    "cannot be projected from x_src"
                )
            x_value = x_src
        check_rows("x_value", x_value, self.vdim, "vdim", "N_src", num_rows=x_src.shape[0])
        h, d = self.num_kv_heads, self.head_dim
        return KeyValue(
            F.linear(x_src, *self._weights(1)).reshape(-1, h, d), F.linear(x_value, *self._weights(2)).reshape(-1, h, d)
        )

    def forward(
        self,
        x_dst: Tensor,
        graph: Union[GraphLike, Any],
        x_src: Optional[Tensor] = None,
        *,
        x_value: Optional[Tensor] = None,
        kv: Optional[KeyValue] = None,
        cache: Optional["KVStore"] = None,
        dst_rows: Optional[Tensor] = None,
        edge_bias: Optional[Tensor] = None,
        edge_key: Optional[Tensor] = None,
        edge_value: Optional[Tensor] = None,
        edge_scale: Optional[Tensor] = None,
        edge_weight: Optional[Tensor] = None,
        return_weights: bool = False,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Attend from the sources into the destinations along `graph`'s edges.

        Args:
            x_dst: (N_dst, embed_dim) destination inputs; with `dst_rows`, (R, embed_dim) inputs of
                just those destinations.
            graph: (2, E) edge index (or torch_geometric.EdgeIndex) or `Graph` from N_src sources
                into N_dst destinations (a PyG Data/Batch: `graphs.from_pyg(data)` first); or this
                rank's `distributed.Shard` (or a `HaloExchange` over it) of a partitioned graph: then
                x_dst holds the rows of `shard.nodes`, x_src those of `shard.src_nodes`, per-edge
                inputs one row per edge of `shard.graph`, and the output is this rank's rows
                (`sharded_edge_attention`; every rank calls the module collectively).
            x_src: (N_src, kdim) source inputs; None means self-attention (x_src = x_dst).
            x_value: (N_src, vdim) value inputs, default x_src.
            kv: keys and values projected earlier (`project_kv`), used instead of x_src/x_value.
            cache: a `KVStore` (`KVCache` for incremental decoding, `NodeKV` for adaptive depth):
                this call's keys and values are written into it and attention reads all of its rows.
            dst_rows: (R,) int64 destination ids: compute only these rows of the output (the edges
                into other destinations are skipped; every source stays readable).
            edge_bias: (E, H) or (E,) additive scores.
            edge_key, edge_value, edge_scale: per-edge terms already projected by the caller (no
                projection of the module's applies to them), added to the keys, added to the
                values, multiplied per channel into q·k (see `edge_attention`): (E, H, D), or
                (E, embed_dim) viewed as (E, H, D). edge_key and edge_value may also be given by
                their factors, an `EdgeProjection(features (E, F), weight (embed_dim, F))` (an
                nn.Linear's weight and bias, heads major), which the kernels build or, where one
                projection is both terms on a large graph, factor (no (E, H, D) tensor).
            edge_weight: (E, H) or (E,) multipliers of the normalized weights after the softmax
                (`edge_attention`'s; the reference backend computes it).
            return_weights: also return the normalized (E, H) weights (before edge_weight).

        With `dst_rows`, per-edge inputs may have a row per edge of `graph` (those of the edges
        into `dst_rows` are used) or per edge of `graph.dst_subgraph`.

        Returns: (N_dst, embed_dim), or (R, embed_dim) with `dst_rows`; with return_weights also the
        (E', H) weights of the edges attended along (E' = E, or the edges into `dst_rows`, in the
        order of `graph.dst_subgraph`). Registered weight hooks see the same weights.
        """
        check_rows("x_dst", x_dst, self.embed_dim, "embed_dim", "N_dst")
        attend, target, graph = attention_over(graph, cache=cache, dst_rows=dst_rows)
        per_edge = [edge_bias, *(self._split_heads(t) for t in (edge_key, edge_value, edge_scale)), edge_weight]
        q, kv = self._project(x_dst, x_src, x_value, kv, packed=cache is None and dst_rows is None)
        if cache is not None:
            kv = cache.update(kv, dst_rows)
        if dst_rows is not None:
            graph, q, kept = select_destinations(graph, q, kv.k.shape[0], dst_rows)
            target, per_edge = graph, kept_edges(per_edge, kept)
        result = attend(
            q,
            kv.k,
            kv.v,
            target,
            clamp=self.clamp,
            bias=per_edge[0],
            edge_key=per_edge[1],
            edge_value=per_edge[2],
            edge_scale=per_edge[3],
            edge_weight=per_edge[4],
            eps=self.eps,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_weights=return_weights or bool(self._weights_hooks),
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

    def _project(
        self, x_dst: Tensor, x_src: Optional[Tensor], x_value: Optional[Tensor], kv: Optional[KeyValue], packed: bool
    ) -> Tuple[Tensor, KeyValue]:
        """Queries (N_dst, H, D) and the keys and values (N_src, H, .) of a call (`forward`'s
        arguments). packed: self-attention may take one packed matmul (no cache, no dst_rows)."""
        if packed and kv is None and x_src is None and x_value is None and self._qkv_same_embed_dim:
            # one packed matmul, as nn.MultiheadAttention does for self-attention
            kv_dim, d = self.num_kv_heads * self.head_dim, self.head_dim
            qkv = F.linear(x_dst, self.in_proj_weight, self.in_proj_bias)
            q, k, v = qkv.split([self.embed_dim, kv_dim, kv_dim], dim=-1)
            h, h_kv = self.num_heads, self.num_kv_heads
            return q.reshape(-1, h, d), KeyValue(k.reshape(-1, h_kv, d), v.reshape(-1, h_kv, d))  # (N, H or H_kv, D)
        q = self.project_q(x_dst)
        if kv is None:
            return q, self.project_kv(x_dst if x_src is None else x_src, x_value)
        if x_src is not None or x_value is not None:
            raise ValueError("pass either kv or x_src/x_value, not both")
        return q, kv

    def _split_heads(self, t: Optional[Tensor]) -> Optional[Tensor]:
        """An (E, embed_dim) edge term as (E, H, D); anything else as it is (edge_attention checks it)."""
        if isinstance(t, Tensor) and t.dim() == 2 and t.shape[1] == self.embed_dim:
            return t.reshape(t.shape[0], self.num_heads, self.head_dim)  # (E, embed_dim) -> (E, H, D)
        return t

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention, *, backend: str = "auto") -> "EdgeAttention":
        """An exact-mode (clamp=None) EdgeAttention computing what `mha` computes: the same
        embed_dim, num_heads, kdim/vdim, bias and dropout, its weights copied (packed or separate
        projections), on its device and dtype and in its training mode. `mha(x, x, x, attn_mask=m)`
        equals this module over the graph of the pairs m allows (`graphs.complete(L)` for no mask,
        `graphs.causal(L)` for the causal one); batch_first only changes how inputs are laid out:
        a (B, L, E) batch is x.reshape(B * L, E) over `graphs.batch` of B graphs.

        Raises ValueError for add_zero_attn=True or bias_k/bias_v (add_bias_kv=True): each adds a key
        row (zeros, or learned) that every query attends to, which has no node along graph edges.
        """
        return _mha_state.from_multihead_attention(cls, mha, backend)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """The parameters, as nn.MultiheadAttention saves them, and the clamp in the metadata."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        _mha_state.record_clamp(destination, prefix, self.clamp)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: dict, *args: Any) -> None:
        """Refuse MHA's bias_k/bias_v; warn where the clamp would change results (class docstring)."""
        _mha_state.check_loading(state_dict, prefix, local_metadata, self.clamp)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    def register_weights_hook(self, hook: Callable[["EdgeAttention", GraphLike, Tensor], None]) -> RemovableHandle:
        """Call `hook(module, graph, weights)` after every forward, with the (E, H) normalized
        weights along `graph` (the graph attended along: with `dst_rows`, the subgraph of edges into
        those rows). Returns a handle whose `remove()` unregisters it. `sparseattn.record_attention`
        uses this to collect the weights of a whole model for plots."""
        handle = RemovableHandle(self._weights_hooks)
        self._weights_hooks[handle.id] = hook
        return handle

    def extra_repr(self) -> str:
        """The settings `print(module)` shows: widths, heads, dropout, clamp, backend (and eps)."""
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"clamp={self.clamp}, backend={self.backend!r}"
            + (f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else "")
            + (f", eps={self.eps}" if self.eps else "")
        )
