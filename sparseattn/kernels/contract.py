"""The backend contract, declared once: what `edge_attention` hands a backend and what a backend
declares about itself.

A backend is a function `fn(inputs: AttentionInputs) -> (out, weights)`. `edge_attention` has
already checked the inputs, resolved scale and clamp, drawn the dropout mask, cast q, k, v (and
bias, mask) to a dtype the backend takes on that device (half types to float32 where it takes only
float32/float64; outputs are cast back), and sent inputs without edges or with H, D or Dv = 0 to
the reference. So a backend sees E >= 1 and H, D, Dv >= 1 in one of its dtypes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, Mapping, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .._tracing import tracing
from ..graphs import Graph
from .options import KernelOptions


@dataclass(frozen=True)
class EdgeTerm:
    """A per-edge tensor of a call beside bias: `name` (its argument everywhere: edge_attention's
    keyword, AttentionInputs' field, the ops' schema), `width` "D" (q and k's head dim: it enters the
    score) or "Dv" (v's: it enters the message), shape (E, H or 1, width), differentiable. A new term
    is an entry in EDGE_TERMS, edge_attention's keyword, an AttentionInputs field (last: callers build
    it by position), and its math in the reference; a backend computes it once its math is there and
    its name in its `Backend.edge_terms`, and until then never receives it."""

    name: str
    width: str


EDGE_TERMS: Tuple[EdgeTerm, ...] = (
    EdgeTerm("edge_key", "D"),
    EdgeTerm("edge_value", "Dv"),
    EdgeTerm("edge_scale", "D"),
)

EPS = "eps"  # the normalizer's eps (clamp mode): a backend declares it beside the edge terms it takes
# Multipliers of the normalized weights given by the caller (edge_attention's edge_weight): they reach
# a backend folded into dropout_mask, and only one that differentiates dropout_mask (the reference's
# autograd) declares them, since the fast backends' backwards give it no gradient.
EDGE_WEIGHT = "edge_weight"
# Every name a backend can declare in `Backend.edge_terms`: the edge terms, eps and edge_weight.
EXTRAS: FrozenSet[str] = frozenset(t.name for t in EDGE_TERMS) | {EPS, EDGE_WEIGHT}
# What `Backend(edge_terms=True)` declares: the terms there were when it was a flag, and eps. A fixed
# set, not "every term": a backend registered that way never receives a term added since.
TERMS_OF_TRUE: FrozenSet[str] = frozenset({"edge_key", "edge_value", "edge_scale", EPS})


def extras_given(terms: Mapping[str, Optional[Tensor]], eps: float, edge_weight: bool = False) -> FrozenSet[str]:
    """The names of the edge terms present in `terms` (by name, None when absent), "eps" when eps > 0
    and "edge_weight" when the caller gave one: what a backend must take to compute the call."""
    given = frozenset(name for name, t in terms.items() if t is not None) | ({EPS} if eps else frozenset())
    return given | {EDGE_WEIGHT} if edge_weight else given


def declared_terms(edge_terms: Union[bool, Iterable[str]]) -> FrozenSet[str]:
    """`Backend.edge_terms` (or a call's needs) as a set of names: True -> TERMS_OF_TRUE, False -> none;
    a name not in EXTRAS raises ValueError."""
    if isinstance(edge_terms, bool):
        return TERMS_OF_TRUE if edge_terms else frozenset()
    names = frozenset(edge_terms)
    unknown = sorted(names - EXTRAS)
    if unknown:
        raise ValueError(f"edge_terms names {unknown}, which are not edge terms; known: {sorted(EXTRAS)}")
    return names


class AttentionInputs(NamedTuple):
    """What a backend computes attention of.

    q: (N_dst, H, D), k: (N_src, H_kv, D), v: (N_src, H_kv, Dv), one dtype and device, where
    H_kv = H unless the backend declares `Backend.grouped_kv` (then H_kv divides H, and query head h
    reads kv head h // (H / H_kv)); graph: N_src
    sources into N_dst destinations along E edges; scale: score scale; clamp: (lo, hi) bounds on
    the scaled score, or None for exact softmax; bias: (E, H) additive scores or None; dropout_mask:
    (E, H) multipliers of the normalized weights (0 or 1/(1 - p); times the caller's edge_weight for a
    backend that declares EDGE_WEIGHT) or None; return_weights: also
    return the (E, H) normalized weights; edge_key: (E, H, D) added to the key of each edge's
    source, edge_value: (E, H, Dv) added to its value, edge_scale: (E, H, D) multiplied per channel
    into the query-key product (each None when absent); eps: added to each destination's
    normalizer (clamp mode only; 0 otherwise); options: the call's `KernelOptions` (layouts, tiles).
    Per-edge tensors are in the graph's edge order.
    A backend sees edge terms and eps > 0 only when its `Backend.edge_terms` says it takes them."""

    q: Tensor
    k: Tensor
    v: Tensor
    graph: Graph
    scale: float
    clamp: Optional[Tuple[float, float]]
    bias: Optional[Tensor]
    dropout_mask: Optional[Tensor]
    return_weights: bool
    edge_key: Optional[Tensor] = None
    edge_value: Optional[Tensor] = None
    edge_scale: Optional[Tensor] = None
    eps: float = 0.0
    options: KernelOptions = KernelOptions()

    @property
    def terms(self) -> Dict[str, Optional[Tensor]]:
        """The call's edge terms by name, in EDGE_TERMS' order (None where absent)."""
        return {t.name: getattr(self, t.name) for t in EDGE_TERMS}

    @property
    def has_edge_terms(self) -> bool:
        """Whether any edge term or a normalizer eps is present (what `Backend.edge_terms` gates)."""
        return bool(self.extras)

    @property
    def extras(self) -> FrozenSet[str]:
        """The names of the edge terms present, and "eps" when eps > 0 (`extras_given`)."""
        return extras_given(self.terms, self.eps)

    def wants_grad(self) -> bool:
        """Whether autograd will ask this call for a gradient: grad mode on and q, k, v, bias or an edge
        term requiring one."""
        tensors = (self.q, self.k, self.v, self.bias, *self.terms.values())
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)

    def op_args(self, **overrides: Any) -> Dict[str, Any]:
        """The attention arguments of a backend's forward op (`op_spec.ATTENTION_ARGS`) by name, as
        this call gives them (clamp as a list, the dropout mask as "mask"), with `overrides` applied."""
        args: Dict[str, Any] = dict(
            q=self.q,
            k=self.k,
            v=self.v,
            edge_index=self.graph.edge_index,
            bias=self.bias,
            mask=self.dropout_mask,
            **self.terms,
            eps=float(self.eps),
            scale=self.scale,
            clamp=None if self.clamp is None else list(self.clamp),
            return_weights=self.return_weights,
        )
        args.update(overrides)
        return args


# returns out (N_dst, H, Dv) in q's dtype and, when inputs.return_weights, the weights (E, H), else None
BackendFn = Callable[[AttentionInputs], Tuple[Tensor, Optional[Tensor]]]


def gradient_bounds(clamp: Tuple[float, float], dtype: torch.dtype) -> Tuple[float, float]:
    """The clamp's (lo, hi) widened to the next values outside them in dtype, for a backend that masks
    the clamp's gradient with hardtanh_backward (which passes it strictly inside its bounds): the
    contract is torch.clamp's backward, which passes it at lo and hi too."""
    lo, hi, inf = (torch.tensor(x, dtype=dtype) for x in (clamp[0], clamp[1], math.inf))
    return torch.nextafter(lo, -inf).item(), torch.nextafter(hi, inf).item()


FLOATS = (torch.float32, torch.float64)
ALL_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _no_dependencies() -> Optional[str]:
    """The probe of a backend without optional dependencies: always available (None)."""
    return None


@dataclass
class Backend:
    """A registered backend: its function, the device types it takes tensors on, the input dtypes it
    computes in per device type (others are cast to float32 by `edge_attention`), and a probe of
    its optional dependencies (returns why it is unavailable, or None), run once when first asked.
    edge_terms: the names of the edge terms (and "eps") it computes, from EXTRAS; True declares
    TERMS_OF_TRUE, False none. `edge_attention` refuses a call with a term its backend does not
    declare, and "auto" picks only backends that declare the call's terms; a backend therefore never
    receives a term it does not know, and a new term reaches only the backends that add it.
    grouped_kv: whether it takes k and v with H_kv < H heads (grouped-query attention);
    `edge_attention` repeats them to H heads for a backend that does not."""

    name: str
    fn: BackendFn
    probe: Callable[[], Optional[str]] = _no_dependencies
    devices: Tuple[str, ...] = ("cpu", "cuda")
    dtypes: Dict[str, Tuple[torch.dtype, ...]] = field(default_factory=lambda: {"cpu": FLOATS, "cuda": FLOATS})
    edge_terms: FrozenSet[str] = frozenset()  # (True / False accepted: `declared_terms`)
    grouped_kv: bool = False
    _unavailable: Optional[str] = field(default=None, init=False)
    _probed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        # nothing to probe: known now, so compiled code reads a constant (a probe first run inside a
        # trace would change the backend and make the next call recompile)
        self._probed = self.probe is _no_dependencies
        self.edge_terms = declared_terms(self.edge_terms)

    def takes_terms(self, names: FrozenSet[str]) -> bool:
        """Whether it computes a call with these edge terms (and eps): all of them declared."""
        return names <= self.edge_terms

    def unavailable_reason(self) -> Optional[str]:
        """Why this backend cannot run here (a missing dependency, as its probe says), or None.
        The probe runs once and is cached; inside a torch.compile/export trace nothing is cached."""
        if not self._probed:
            if tracing():  # inside a trace: ask, but change nothing
                return self.probe()
            self._unavailable, self._probed = self.probe(), True
        return self._unavailable

    @property
    def available(self) -> bool:
        """Whether its optional dependencies import here (`unavailable_reason()` is None)."""
        return self.unavailable_reason() is None

    def compute_dtype(self, dtype: torch.dtype, device_type: str) -> torch.dtype:
        """The dtype this backend computes inputs of `dtype` in: itself when it takes it, else float32."""
        return dtype if dtype in self.dtypes.get(device_type, FLOATS) else torch.float32


__all__ = [
    "AttentionInputs",
    "Backend",
    "BackendFn",
    "EdgeTerm",
    "EDGE_TERMS",
    "EPS",
    "EXTRAS",
    "TERMS_OF_TRUE",
    "declared_terms",
    "extras_given",
    "FLOATS",
    "ALL_FLOATS",
]
