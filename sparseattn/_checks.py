"""Input validation shared by `edge_attention`, `EdgeAttention` and `Graph`.

Every message names the argument and says what is wrong with it, so a user
can fix the call without reading the source.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._tracing import tracing

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _is_pyg_edge_index(t: object) -> bool:
    """Whether `t` is a torch_geometric.EdgeIndex: a Tensor subclass wrapping a plain (2, E) tensor,
    recognized by its type's name and methods (sparseattn never imports torch_geometric). Plain
    tensors, and the fake ones of a torch.compile/torch.export trace, are not looked into."""
    return (
        isinstance(t, Tensor) and type(t) is not Tensor and type(t).__name__ == "EdgeIndex" and hasattr(t, "as_tensor")
    )


def plain_edge_index(edge_index: object) -> object:
    """A torch_geometric.EdgeIndex as the plain tensor it wraps (its `as_tensor()`: no copy; its
    `as_subclass(torch.Tensor)` would stay an EdgeIndex, whose every op goes through PyG's
    `__torch_function__`); anything else as it is."""
    return edge_index.as_tensor() if _is_pyg_edge_index(edge_index) else edge_index  # type: ignore[attr-defined]


def edge_index_sizes(edge_index: object) -> Tuple[Optional[int], Optional[int]]:
    """(num_src, num_dst) a torch_geometric.EdgeIndex records (its `sparse_size()`, None where not
    set); (None, None) for anything else."""
    if not _is_pyg_edge_index(edge_index):
        return None, None
    rows, cols = edge_index.sparse_size()  # type: ignore[attr-defined]
    return rows, cols


def pyg_hint(obj: object) -> str:
    """The end of a TypeError for a torch_geometric Data/Batch passed where a graph belongs."""
    if hasattr(obj, "edge_index") or hasattr(obj, "adj_t"):
        return f": convert a {type(obj).__name__} once with sparseattn.graphs.from_pyg(data) and pass that Graph"
    return ""


def check_graph_tensor(graph: object) -> Tensor:
    """The `graph=` of `edge_attention`/`EdgeAttention` when it is not a Graph: a tensor, a
    torch_geometric.EdgeIndex becoming its plain tensor (node counts still come from q and k). A PyG
    Data/Batch is refused, pointing to `sparseattn.graphs.from_pyg`."""
    graph = plain_edge_index(graph)
    if not isinstance(graph, Tensor):
        raise TypeError(
            f"graph must be a (2, E) tensor or a sparseattn.Graph, got {type(graph).__name__}{pyg_hint(graph)}"
        )
    return graph


def check_edge_index(edge_index: object, name: str = "edge_index") -> Tensor:
    """Check that `edge_index` is a (2, E) integer tensor (a torch_geometric.EdgeIndex: the plain
    tensor it wraps); return it as int64."""
    edge_index = plain_edge_index(edge_index)
    if not isinstance(edge_index, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape (2, E) or a sparseattn.Graph, "
            f"got {type(edge_index).__name__}{pyg_hint(edge_index)}"
        )
    if edge_index.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must have an integer dtype (int64 preferred), got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(
            f"{name} must have shape (2, E) (row 0 = source, row 1 = destination), got shape {tuple(edge_index.shape)}"
        )
    return edge_index.long()


def check_size(size: int, expected: int, message: Callable[[], str], requirement: str) -> None:
    """Raise ValueError(message()) unless size == expected: a count or a tensor's length.

    Inside a torch.compile or torch.export trace either may be symbolic. One the trace has an
    example value for (a tensor's length) is compared as in eager code: the trace keeps a guard on
    the outcome, and a mismatch raises this ValueError while tracing (which dynamo quotes when
    fullgraph=True), not torch._check's "Expected cond to be True". One that depends on tensor
    values (unbacked) cannot be compared while tracing: the trace keeps a run-time check instead,
    whose message is `requirement`, without sizes (torch.compile takes only a constant message).
    """
    if not tracing() or (type(size) is int and type(expected) is int):  # plain ints: nothing to trace
        if size != expected:
            raise ValueError(message())
        return
    from torch.fx.experimental import symbolic_shapes  # loaded by every trace, not by `import torch`

    # False where the trace cannot tell (unbacked); before torch 2.7 traces compare only backed sizes
    guard_or_false: Callable[[object], bool] = getattr(symbolic_shapes, "guard_or_false", bool)
    if guard_or_false(size != expected):
        raise ValueError(message())
    if _CHECK_READS_CLOSURES:
        torch._check(size == expected, lambda: requirement)
    else:
        torch._check(size == expected)


# torch.compile reads a torch._check message from a closure on torch 2.13; on 2.11 it stops with
# "Can't extract message from torch._check()" (both seen; 2.12 is not known, so it goes without).
_CHECK_READS_CLOSURES = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13)


def node_count_message(name: str, have: int, want: int, num_src: int, num_dst: int) -> str:
    """The error for a Graph whose node count `name` ("num_src" or "num_dst"), have, is not the
    tensors' rows, want (num_src, num_dst: the tensors' counts, which the fix names)."""
    rows = "k and v have" if name == "num_src" else "q has"
    return (
        f"graph has {name}={have} but {rows} {want} rows; build it with the tensors' node counts, "
        f"Graph(edge_index, num_src={num_src}, num_dst={num_dst}) (without {name}= a Graph counts nodes up "
        "to its largest id)"
    )


def check_edge_attr(
    edge_attr: object, num_edges: Optional[int], width: int, width_name: str, name: str = "edge_attr"
) -> Tensor:
    """Check a layer's edge features: a floating-point (E, width) tensor, one row per edge
    (num_edges; None when the edge index is malformed, which edge_attention reports) and `width`
    columns, the layer's `width_name` (such as edge_dim). Nothing broadcasts: a (E, 1) column
    or a 1-D (E,) tensor is refused like any other shape."""
    _check_floating(edge_attr, name, f"(E, {width_name})")
    assert isinstance(edge_attr, Tensor)

    def message() -> str:  # int(): sizes may be symbolic in a trace, where only this error path runs
        e = "E" if num_edges is None else int(num_edges)
        return (
            f"{name} must have shape (E, {width_name}) = ({e}, {width}), one row per edge, "
            f"got {tuple(int(n) for n in edge_attr.shape)}"
        )

    if edge_attr.dim() != 2 or edge_attr.shape[1] != width:
        raise ValueError(message())
    if num_edges is not None:
        check_size(edge_attr.shape[0], num_edges, message, f"{name} must have one row per edge (E, {width_name})")
    return edge_attr


def check_node_count(name: str, n: object) -> int:
    """A node count: a non-negative int that fits int64 (ids are int64); ValueError otherwise."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**63:
        raise ValueError(f"{name} must be a non-negative int below 2**63, got {n!r}")
    return n


def check_node_ids(ids: Tensor, num_nodes: int, name: str, count: Optional[str] = None) -> None:
    """Raise IndexError if any id in `ids` is negative or >= num_nodes; `count` names the argument
    that set num_nodes (such as "num_src"), which the message then names as the fix. One host read."""
    if ids.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(ids)).tolist()
    _check_id_range(lo, hi, num_nodes, name, count)


def check_edge_ids(
    edge_index: Tensor,
    num_src: int,
    num_dst: int,
    counts: Tuple[Optional[str], Optional[str]] = (None, None),
    name: str = "edge_index",
) -> None:
    """`check_node_ids` of both rows of edge_index (2, E), sources against num_src and destinations
    against num_dst, in one host read (each read waits for a GPU's queued work); `counts` name the
    arguments that set the two counts, as check_node_ids' `count`; `name` the index in messages."""
    if edge_index.shape[1] == 0:
        return
    (lo_src, lo_dst), (hi_src, hi_dst) = torch.stack(torch.aminmax(edge_index, dim=1)).tolist()
    _check_id_range(lo_src, hi_src, num_src, f"{name}[0] (sources)", counts[0])
    _check_id_range(lo_dst, hi_dst, num_dst, f"{name}[1] (destinations)", counts[1])


def _check_id_range(lo: int, hi: int, num_nodes: int, name: str, count: Optional[str]) -> None:
    """IndexError naming `name` unless lo >= 0 and hi < num_nodes (check_node_ids' messages)."""
    if lo < 0:
        raise IndexError(f"{name} contains a negative node id ({lo})")
    if hi >= num_nodes:
        fix = f" ({count}={num_nodes}: pass {count}={hi + 1} or more)" if count else ""
        raise IndexError(f"{name} contains node id {hi}, out of range for {num_nodes} nodes{fix}")


def check_qkv(q: object, k: object, v: object) -> None:
    """Check q: (N_dst, H, D), k: (N_src, H_kv, D), v: (N_src, H_kv, Dv) agree in shape, dtype and device;
    H_kv divides H (grouped-query attention, H_kv = H without it)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have 3 dimensions (nodes, heads, dim), got shape {tuple(t.shape)}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"k and v must have the same number of heads H_kv (dim 1), got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads and (kv_heads == 0 or heads % kv_heads != 0):
        raise ValueError(
            f"q's heads H (dim 1) must be a multiple of k's and v's heads H_kv (grouped-query attention: query "
            f"head h reads kv head h // (H / H_kv)), got H={heads} and H_kv={kv_heads}: q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same head dim D (dim 2), got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(
            f"k and v must have the same number of source nodes (dim 0), got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_same_device(q=q, k=k, v=v)


def check_same_device(**tensors: Optional[Tensor]) -> None:
    """Raise ValueError naming the tensors if they are not all on one device."""
    present = {n: t for n, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in present.items())
        raise ValueError(f"all tensors must be on one device, got {where}")


def _check_floating(t: object, name: str, shape: str) -> None:
    """TypeError naming `name` unless t is a floating-point tensor (of the described shape)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape}, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def check_bias(bias: Optional[Tensor], num_edges: int, num_heads: int, name: str = "bias") -> Optional[Tensor]:
    """Check a per-edge tensor (an edge bias, or what `name` says) of shape (E, H) or (E,); return it
    as (E, H) (a view, no copy)."""
    if bias is None:
        return None
    _check_floating(bias, name, "(E, H) or (E,)")
    if bias.dim() == 1 and bias.shape[0] == num_edges:
        return bias.unsqueeze(1).expand(num_edges, num_heads)
    if bias.dim() == 2 and bias.shape == (num_edges, num_heads):
        return bias
    raise ValueError(
        f"{name} must have shape (E, H) = ({num_edges}, {num_heads}) or (E,) = ({num_edges},), got {tuple(bias.shape)}"
    )


def check_edge_term(
    t: Optional[Tensor], name: str, shape: Tuple[int, int, int], width: str, kv_heads: Optional[int] = None
) -> Optional[Tensor]:
    """Check an edge term of shape (E, H, width) = shape, or (E, 1, width) shared by the heads: a
    floating-point tensor or None. With grouped-query heads (kv_heads = H_kv < H) edge terms stay per
    query head; one of (E, H_kv, width), per kv head, is refused with the repeat that makes it one."""
    if t is None:
        return None
    _check_floating(t, name, f"(E, H, {width})")
    num_edges, heads, w = shape
    if kv_heads is not None and 1 < kv_heads < heads and t.dim() == 3 and t.shape[1] == kv_heads:
        raise ValueError(
            f"{name} must have shape (E, H, {width}) = {tuple(shape)}, one row per query head, or "
            f"(E, 1, {width}), got {tuple(t.shape)}: per kv head (H_kv={kv_heads}) is not taken; repeat it "
            f"per query head with {name}.repeat_interleave({heads // kv_heads}, dim=1)"
        )
    if t.dim() != 3 or t.shape[0] != num_edges or t.shape[1] not in (heads, 1) or t.shape[2] != w:
        raise ValueError(
            f"{name} must have shape (E, H, {width}) = {tuple(shape)} or (E, 1, {width}) = {(num_edges, 1, w)} "
            f"(shared by the heads), got {tuple(t.shape)}"
        )
    return t


def check_eps(eps: object, clamp: Optional[Tuple[float, float]]) -> float:
    """A normalizer eps: a finite float >= 0, and > 0 only in clamp mode."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not 0 <= eps < math.inf:  # (NaN compares False; math.isfinite does not trace)
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    if eps > 0 and clamp is None:
        raise ValueError(
            "eps > 0 needs clamp mode (clamp=(lo, hi)): with clamp=None the weights are shifted by each "
            "destination's max score, so a fixed eps would mean something different per destination"
        )
    return eps


def max_clamp_bound(dtype: torch.dtype) -> float:
    """The largest |lo| and |hi| that `check_clamp` accepts for inputs of this dtype. Weights
    accumulate in float64 for float64 inputs, else in float32; there exp(+-bound) stays 2^32 away
    from overflow and from the smallest normal number, so z = sum of a destination's weights (up to
    2^32 in-edges) is finite and never 0. 65.0 for float32/float16/bfloat16, 686.0 for float64."""
    info = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32)
    return float(math.floor(min(math.log(info.max), -math.log(info.tiny)) - 32 * math.log(2)))


def check_clamp(clamp: object, dtype: torch.dtype = torch.float64) -> Optional[Tuple[float, float]]:
    """Check clamp is None or (lo, hi) with lo <= hi, both within +-max_clamp_bound(dtype); return it
    as floats. Beyond that, exp(hi) summed over in-edges can overflow (NaN outputs), or exp(lo) underflow
    to 0 (a destination whose scores all sit at lo would get 0, not the mean of its values). The
    default dtype accepts every bound that some dtype can hold."""
    if clamp is None:
        return None
    if not isinstance(clamp, Sequence) or isinstance(clamp, str) or len(clamp) != 2:
        raise TypeError(f"clamp must be None or a pair (lo, hi), got {clamp!r}")
    lo, hi = float(clamp[0]), float(clamp[1])
    if lo != lo or hi != hi:  # NaN (comparisons, not math.isnan: torch.compile may hand symbolic floats)
        raise ValueError(f"clamp bounds must not be NaN, got {clamp!r}")
    if lo > hi:
        raise ValueError(f"clamp must satisfy lo <= hi, got lo={lo} > hi={hi}")
    bound = max_clamp_bound(dtype)
    if max(-lo, hi) > bound:
        acc = "float64" if dtype == torch.float64 else "float32"
        raise ValueError(
            f"clamp=({lo}, {hi}) is out of range for {dtype} inputs: weights exp(score) accumulate in {acc}, "
            f"where exp of a bound beyond +-{bound} can overflow (summed over in-edges) or underflow to 0; "
            f"the largest safe bound is {bound}: use bounds in [-{bound}, {bound}], or clamp=None (exact "
            "softmax, which never overflows)"
        )
    return lo, hi


def check_scale(scale: object, head_dim: int) -> float:
    """Resolve the score scale; None means 1/sqrt(D). (int(D): under torch.compile(dynamic=True) the
    head dim is symbolic; the scale is a constant of the kernels, so D is taken as fixed.)"""
    if scale is None:
        head_dim = int(head_dim)
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not -math.inf < scale < math.inf:  # not finite (NaN compares False)
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_dropout(p: object, name: str = "dropout_p") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(p).__name__}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)
