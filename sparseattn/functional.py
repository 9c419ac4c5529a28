"""`edge_attention`: multi-head attention along the edges of a graph."""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import replace
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from ._checks import (
    check_bias,
    check_clamp,
    check_dropout,
    check_edge_term,
    check_eps,
    check_graph_tensor,
    check_qkv,
    check_same_device,
    check_scale,
    check_size,
    node_count_message,
)
from ._tracing import tracing
from .graphs import Graph
from .graphs.exported import check_node_counts
from .graphs.order import locality_view
from .kernels import AttentionInputs, get_backend, reference_backend
from .kernels.auto import choose_order
from .kernels.contract import EDGE_TERMS, extras_given
from .kernels.options import OptionsLike, as_kernel_options
from .kernels.permute import permute_rows
from .kernels.projected import (
    EdgeProjection,
    QueryProjection,
    check_projections,
    plan_projections,
    query_shape_view,
    shape_view,
)
from .kernels.projected import finish as finish_projections

GraphLike = Union[Graph, Tensor]


def as_graph(graph: GraphLike, num_src: int, num_dst: int) -> Graph:
    """Wrap a (2, E) tensor as a Graph with the given node counts (validated), or check a Graph's counts
    (the same ValueError eager and compiled, `_checks.check_size`)."""
    if isinstance(graph, Graph):
        _check_count("num_src", graph.num_src, num_src, num_src, num_dst)
        _check_count("num_dst", graph.num_dst, num_dst, num_src, num_dst)
        check_node_counts(graph, num_src, num_dst)  # again when an exported program runs (AOTInductor)
        return graph
    return Graph.borrowed(graph, num_src=num_src, num_dst=num_dst, one_call=True)  # lives for this call: no copy


def _check_count(name: str, have: int, want: int, num_src: int, num_dst: int) -> None:
    """ValueError unless a Graph's node count `name` (have) is the tensors' (want)."""
    rows = "k and v have" if name == "num_src" else "q has"
    check_size(
        have,
        want,  # int(): counts may be symbolic in a trace, where only this error path runs
        lambda: node_count_message(name, int(have), int(want), int(num_src), int(num_dst)),
        f"graph's {name} must equal the rows {rows}",
    )


def edge_attention(
    q: Union[Tensor, QueryProjection],
    k: Tensor,
    v: Tensor,
    graph: GraphLike,
    *,
    scale: Optional[float] = None,
    clamp: Optional[Tuple[float, float]] = (-5.0, 5.0),
    bias: Optional[Tensor] = None,
    edge_key: Union[Tensor, EdgeProjection, None] = None,
    edge_value: Union[Tensor, EdgeProjection, None] = None,
    edge_scale: Optional[Tensor] = None,
    eps: float = 0.0,
    dropout_p: float = 0.0,
    edge_weight: Optional[Tensor] = None,
    backend: str = "auto",
    return_weights: bool = False,
    kernel_options: OptionsLike = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention along graph edges: out[t] = sum_e w_e v[s] / sum_e w_e over edges e = (s, t),
    with w_e = exp(clamp(scale * `<k[s], q[t]>` + bias[e], lo, hi)). With edge terms, per head:
    score_e = scale * sum_d q[t, d] * (k[s, d] + edge_key[e, d]) * edge_scale[e, d] + bias[e] and
    out[t] = sum_e w_e (v[s] + edge_value[e]) / (sum_e w_e + eps).

    Args:
        q: (N_dst, H, D) queries, one row per destination node; or a `QueryProjection(inputs,
            weight, bias)` standing for `F.linear(inputs, weight, bias).view(N_dst, H, D)`, which
            lets the kernels build the queries an `EdgeProjection`'s factored form needs straight
            from the inputs (`kernels.projected`).
        k: (N_src, H_kv, D) keys, one row per source node; H_kv = H, or any divisor of H
            (grouped-query attention: query head h reads kv head h // (H / H_kv), as SDPA's
            enable_gqa). "reference" and "csr" read each kv row once per edge for its group of
            query heads; "dense", "scatter" and "triton" get k and v repeated to H heads.
        v: (N_src, H_kv, Dv) values, with k's heads.
        graph: (2, E) integer tensor (row 0 source, row 1 destination; N_src and N_dst are
            taken from k and q; a torch_geometric.EdgeIndex is taken as its plain tensor) or a
            `Graph` with matching node counts (a PyG Data/Batch: `graphs.from_pyg(data)` first).
            A raw tensor builds the kernels' index on every call; a Graph builds it once and
            keeps it, which also lets "csr" train in its faster layout on graphs with locality.
        scale: score scale, default 1/sqrt(D).
        clamp: (lo, hi) bounds on the scaled score (the DGL tutorial's scaled_exp), or None for
            exact softmax (max-subtracted; equal to dense masked softmax at any score magnitude).
            Bounds must lie within +-65 (float32, float16, bfloat16 inputs) or +-686 (float64), where
            exp of a bound can neither overflow nor underflow to 0 (`_checks.max_clamp_bound`);
            ValueError otherwise.
        bias: optional additive score per edge, (E, H) or (E,); differentiable.
        edge_key: optional (E, H, D) added to the key of each edge's source (PyG's TransformerConv,
            anemoi's graph transformer); differentiable.
        edge_value: optional (E, H, Dv) added to the value of each edge's source; differentiable.
        edge_scale: optional (E, H, D) multiplied per channel into the query-key product
            (Exphormer, the Dwivedi-Bresson graph transformer); differentiable.
            Edge terms and bias are per query head (H) also when k and v have H_kv < H heads;
            a term of (E, H_kv, .) heads is refused (repeat_interleave it to H heads).
            Each edge term may also be (E, 1, .), one row shared by the heads: "csr" then reads it
            once per edge and returns its gradient without any (E, H, .) tensor (edge_key,
            edge_value; `sparseattn.nn.TransformerConv` builds on this).
            edge_key and edge_value may also be given by their factors, an `EdgeProjection(features
            (E, F), weight (H * D, F))` standing for `F.linear(features, weight).view(E, H, D)` (a
            projection of edge features, as TransformerConv's lin_edge(edge_attr)); the kernels
            decide whether to build that term or, where one projection is both terms, to attend
            through the factored form that never builds it (`kernels.projected`).
        eps: added to each destination's normalizer sum_e w_e (Exphormer's 1e-6); clamp mode
            only (ValueError with clamp=None). Default 0: a destination without edges gets 0.
        dropout_p: probability of dropping each normalized edge weight (attention dropout);
            survivors are scaled by 1/(1 - dropout_p). Deterministic under `torch.manual_seed`.
        edge_weight: optional (E, H) or (E,) multipliers of the normalized weights, applied after the
            softmax (and with dropout's): out[t] = sum_e edge_weight[e] p_e v[s], as PyG's explainers'
            edge masks scale each edge's message; differentiable. Only the "reference" backend takes
            it (the only one that differentiates it): "auto" picks it, another name is refused.
        backend: "auto" or a name from `sparseattn.kernels.backend_names()`. Edge terms and eps
            run on the backends that declare them (`registered_backend(name).edge_terms`: today
            "reference", "csr", "small", "scatter" and "triton"); the others ("dense", "local")
            refuse them naming the term, and "auto" picks only a backend that declares them.
        return_weights: also return the normalized weights (before dropout and edge_weight).
        kernel_options: per-call kernel settings (`sparseattn.kernels.KernelOptions`, or a dict of
            its fields: csr_layout, dense_tile_bytes, triton_forward, triton_backward, node_order,
            local_tiles), as FlexAttention's kernel_options; None: the default in force (`kernels.kernel_options`).

    Returns:
        out: (N_dst, H, Dv) in q's dtype. A destination with no in-edges gets exactly 0 (and zero
        gradient). With return_weights=True also weights: (E, H) in the caller's edge order,
        summing to 1 over each destination's in-edges.

    Per-edge tensors (bias, edge terms, the returned weights) are in the caller's edge order.
    Duplicate edges count once each. Half-precision inputs accumulate in float32, also under
    `torch.autocast` (which is off inside the kernels; q, k and v arrive as autocast made them).
    NaN or inf in q, k, v, bias or an edge term reaches only the destinations whose edges touch it, on every
    backend (out and the weights non-finite exactly where the reference's are); in clamp mode a score of +inf
    or -inf is clamped to hi or lo like any other score. A gradient is non-finite only in rows connected to a
    destination such a value touches, or whose incoming gradient is non-finite (its dq row, its edges'
    sources' dk and dv rows, its edges' bias and edge-term rows); elsewhere it equals the reference's.
    """
    if isinstance(q, QueryProjection) or isinstance(edge_key, EdgeProjection) or isinstance(edge_value, EdgeProjection):
        call = plan_projections(q, k, v, edge_key, edge_value, edge_scale, eps, scale)
        result = edge_attention(
            call.q, call.k, call.v, graph, scale=call.scale, clamp=clamp, bias=bias, edge_key=call.edge_key,
            edge_value=call.edge_value, edge_scale=edge_scale, eps=eps, dropout_p=dropout_p, edge_weight=edge_weight,
            backend=backend, return_weights=return_weights, kernel_options=kernel_options,
        )  # fmt: skip
        return finish_projections(call, result)
    terms = dict(edge_key=edge_key, edge_value=edge_value, edge_scale=edge_scale)  # EDGE_TERMS, by name
    g, scale, clamp, bias, terms, eps, dropout_p, edge_weight = _checked_arguments(
        q, k, v, graph, scale, clamp, bias, terms, eps, dropout_p, return_weights, edge_weight
    )
    options = as_kernel_options(kernel_options)
    if _reorders(g, options, backend):
        return _in_locality_order(
            q, k, v, g, options, scale=scale, clamp=clamp, bias=bias, **terms, eps=eps, dropout_p=dropout_p,
            edge_weight=edge_weight, backend=backend, return_weights=return_weights,
        )  # fmt: skip
    num_heads, kv_heads = q.shape[1], k.shape[1]
    dropout_mask = None
    if dropout_p > 0.0:
        keep = torch.rand(g.num_edges, num_heads, device=q.device) >= dropout_p
        dropout_mask = keep.to(q.dtype) / (1.0 - dropout_p)
    if edge_weight is not None:  # both multiply the normalized weights (`contract.EDGE_WEIGHT`)
        dropout_mask = edge_weight if dropout_mask is None else edge_weight * dropout_mask
    extras = extras_given(terms, eps, edge_weight is not None)
    chosen = get_backend(backend, q, g, edge_terms=extras, value_dim=v.shape[2], edge_kv=_only_key_value(terms, eps))
    if g.num_edges == 0 or 0 in (q.shape[1], q.shape[2], v.shape[2]):
        chosen = reference_backend()  # the definition gives zeros (or empty tensors); kernels reject empty shapes
    if kv_heads != num_heads and not chosen.grouped_kv:  # this backend reads H heads of k and v: repeat them
        k, v = (t.repeat_interleave(num_heads // kv_heads, dim=1) for t in (k, v))
    dtype = q.dtype
    work = chosen.compute_dtype(dtype, q.device.type)  # half types run in float32 where a backend lacks them
    if work != dtype or any(t is not None and t.dtype != work for t in (k, v, bias, dropout_mask, *terms.values())):
        q, k, v = (t.to(work) for t in (q, k, v))
        bias, dropout_mask = (None if t is None else t.to(work) for t in (bias, dropout_mask))
        terms = {name: None if t is None else t.to(work) for name, t in terms.items()}
    inputs = AttentionInputs(
        q, k, v, g, scale, clamp, bias, dropout_mask, return_weights, **terms, eps=eps, options=options
    )
    if torch.is_autocast_enabled(q.device.type):  # backends keep their own precision rules under autocast
        with torch.autocast(q.device.type, enabled=False):
            out, weights = chosen.fn(inputs)
    else:
        out, weights = chosen.fn(inputs)
    if out.dtype != dtype:
        out = out.to(dtype)
    if not return_weights:
        return out
    assert weights is not None, f"backend {chosen.name!r} returned no weights"
    return out, weights.to(dtype)


def _reorders(g: Graph, options, backend: str) -> bool:
    """Whether the call runs in the graph's locality order (`kernels.auto.choose_order`); warns when
    kernel_options asks for the order on a raw edge_index, which would search for it in every call."""
    if options.node_order is not None and g.one_call and g.num_src == g.num_dst and not tracing():
        warnings.warn(
            f"kernel_options node_order={options.node_order!r} with a raw edge_index searches for the order "
            "in every call (it is cached on a Graph): pass a sparseattn.Graph to keep it",
            stacklevel=3,
        )
    return choose_order(g, options.node_order, backend)


def _in_locality_order(q, k, v, g: Graph, options, *, return_weights: bool, **kwargs):
    """The call on g relabeled in its locality order (`graphs.locality_view`, cached on g): q, k and
    v permuted into it, the output back; per-edge tensors keep the caller's edge order."""
    inner = replace(options, node_order=None)
    order, rank, local = locality_view(g)
    q, k, v = (permute_rows(t, order, rank) for t in (q, k, v))
    result = edge_attention(q, k, v, local, return_weights=return_weights, kernel_options=inner, **kwargs)
    del q, k, v  # the permuted copies' buffers (pooled, `kernels.memory`) can take the output's rows back
    if isinstance(result, tuple):
        return permute_rows(result[0], rank, order), result[1]
    return permute_rows(result, rank, order)


def _only_key_value(terms: Dict[str, Optional[Tensor]], eps: float) -> bool:
    """The call's edge terms are edge_key and/or edge_value alone ("small" runs those itself)."""
    given = extras_given(terms, eps)
    return bool(given) and given <= {"edge_key", "edge_value"}


def _checked_arguments(
    q, k, v, graph, scale, clamp, bias, terms: Dict[str, Optional[Tensor]], eps, dropout_p, return_weights,
    edge_weight=None,
):  # fmt: skip
    """edge_attention's checks of its arguments (ValueError or TypeError naming the argument), terms
    the edge terms by name (`kernels.contract.EDGE_TERMS`): returns the Graph and the normalized scale,
    clamp, bias, edge terms, eps, dropout_p and edge_weight (as (E, H))."""
    check_qkv(q, k, v)
    if not isinstance(graph, Graph):  # a torch_geometric.EdgeIndex becomes its plain tensor; a PyG Data is refused
        graph = check_graph_tensor(graph)
    edge_index = graph.edge_index if isinstance(graph, Graph) else graph
    check_same_device(q=q, k=k, v=v, graph=edge_index)
    g = as_graph(graph, num_src=k.shape[0], num_dst=q.shape[0])
    num_heads, num_edges, d, dv, kv_heads = q.shape[1], g.num_edges, q.shape[2], v.shape[2], k.shape[1]
    bias = check_bias(bias, num_edges, num_heads)
    edge_weight = check_bias(edge_weight, num_edges, num_heads, "edge_weight")
    widths = {"D": d, "Dv": dv}
    terms = {
        t.name: check_edge_term(terms[t.name], t.name, (num_edges, num_heads, widths[t.width]), t.width, kv_heads)
        for t in EDGE_TERMS
    }
    check_same_device(q=q, bias=bias, edge_weight=edge_weight, **terms)
    clamp = check_clamp(clamp, q.dtype)
    eps = check_eps(eps, clamp)
    scale = check_scale(scale, q.shape[2])
    dropout_p = check_dropout(dropout_p)
    if not isinstance(return_weights, bool):
        raise TypeError(f"return_weights must be a bool, got {type(return_weights).__name__}")
    return g, scale, clamp, bias, terms, eps, dropout_p, edge_weight


@functools.cache
def _keyword_defaults() -> Dict[str, Any]:
    """edge_attention's keyword-only arguments and their defaults."""
    params = inspect.signature(edge_attention).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_arguments(q: Tensor, k: Tensor, v: Tensor, graph: GraphLike, **kwargs) -> None:
    """Raise the ValueError or TypeError `edge_attention(q, k, v, graph, **kwargs)` would raise for
    its arguments, without attending (only shapes, dtypes and devices of q, k, v are read; a named
    backend is resolved, "auto" is not): for callers that must fail before a collective, such as
    `sparseattn.distributed`."""
    defaults = _keyword_defaults()  # edge_attention's own, so the two cannot drift apart
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise TypeError(f"edge_attention() got unexpected keyword arguments: {', '.join(unknown)}")
    given = {**defaults, **kwargs}
    checked = {name: value for name, value in given.items() if name not in ("backend", "kernel_options")}
    checked["terms"] = {t.name: checked.pop(t.name) for t in EDGE_TERMS}
    q = query_shape_view(q, k)  # a QueryProjection as a stand-in of its shape, checked
    terms = checked["terms"]
    if any(isinstance(t, EdgeProjection) for t in terms.values()):  # checked, then as their terms' shape
        check_qkv(q, k, v)
        check_projections(terms["edge_key"], terms["edge_value"], q.shape[1], q.shape[2], v.shape[2])
        checked["terms"] = {name: shape_view(t, q.shape[1]) for name, t in terms.items()}
    g, _, _, _, terms, eps, _, edge_weight = _checked_arguments(q, k, v, graph, **checked)
    as_kernel_options(given["kernel_options"])
    backend = given["backend"]
    if backend != "auto":  # a named backend resolves without the data ("auto" chooses in the call)
        get_backend(backend, q, g, edge_terms=extras_given(terms, eps, edge_weight is not None))


__all__ = ["edge_attention", "as_graph", "check_arguments"]
