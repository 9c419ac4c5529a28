"""Backend registry: names for `edge_attention(..., backend=...)` and the "auto" rule.

Every backend follows one contract (contract.py): `fn(AttentionInputs) -> (out, weights)`, with
the device types and dtypes it takes declared in its `Backend` entry below. Optional dependencies
are probed once, when a backend is first asked for.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Union

import torch
from torch import Tensor

from ..graphs import Graph
from . import auto, csr, scatter
from .contract import ALL_FLOATS, EDGE_WEIGHT, EPS, EXTRAS, AttentionInputs, Backend, BackendFn, declared_terms
from .csr import csr_attention
from .dense import DENSE_MAX_SHAPES, DENSE_MIN_EDGES_PER_BLOCK, dense_attention, plan
from .guard import checked
from .local import LOCAL_MIN_DEGREE, LOCAL_MIN_DENSITY, local_attention, local_takes
from .options import KernelOptions, as_kernel_options, kernel_options
from .reference import reference_attention
from .small import SMALL_MAX_VALUES, SMALL_MAX_VALUES_ONE_CALL, small_attention

_BACKENDS: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Add (or replace) a backend under `backend.name`, for `edge_attention(..., backend=name)`."""
    _BACKENDS[backend.name] = backend


def registered_backend(name: str) -> Backend:
    """The `Backend` entry registered under `name` (its declared devices, dtypes and function);
    ValueError for an unknown name."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; registered names are {', '.join(map(repr, _BACKENDS))}")
    return _BACKENDS[name]


def backend_names() -> list:
    """All registered names, plus "auto"."""
    return ["auto", *_BACKENDS]


def available_backends() -> list:
    """Registered backends whose dependencies are importable here."""
    return [name for name, b in _BACKENDS.items() if b.available]


def backends_for(device_type: str) -> list:
    """Available backends that accept tensors on this device type ("cpu", "cuda")."""
    return [name for name, b in _BACKENDS.items() if device_type in b.devices and b.available]


def choose_auto(
    q: Tensor,
    graph: Graph,
    edge_terms: Union[bool, Iterable[str]] = False,
    value_dim: Optional[int] = None,
    edge_kv: bool = False,
) -> str:
    """The backend "auto" picks for these inputs (value_dim: v's width Dv, default q's D; edge_terms:
    the names of the call's edge terms and "eps", or True for TERMS_OF_TRUE): `auto.choose_auto` over
    the registered backends."""
    return auto.choose_auto(q, graph, _BACKENDS, declared_terms(edge_terms), value_dim, edge_kv)


def prepare(graph: Graph, heads: int, head_dim: Optional[int] = None, dtype: torch.dtype = torch.float32) -> None:
    """Build and cache, eagerly, every index the CPU kernels read for this graph and head count
    (csr's pattern in the layout it will take for keys (N_src, heads, head_dim) of dtype, or both
    layouts when head_dim is None; dense's plan when the graph has blocks). Never needed: compiled
    and exported code builds what a graph lacks inside the trace, through ops. It saves that work on
    every call of compiled code that reuses one graph."""
    from .csr import prepare as prepare_csr
    from .dense import prepare as prepare_dense

    prepare_csr(graph, heads, head_dim, dtype)
    prepare_dense(graph)


def get_backend(
    name: str,
    q: Tensor,
    graph: Graph,
    edge_terms: Union[bool, Iterable[str]] = False,
    value_dim: Optional[int] = None,
    edge_kv: bool = False,
) -> Backend:
    """Resolve a backend name ("auto" included) to a usable Backend, or raise. edge_terms: the names
    of the call's edge terms and "eps" (`contract.extras_given`; True: TERMS_OF_TRUE), which the
    backend must declare; edge_kv: it has edge_key or edge_value only (`auto.choose_auto`)."""
    terms = declared_terms(edge_terms)
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    if name == "auto":
        name = choose_auto(q, graph, terms, value_dim, edge_kv)
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid names are {', '.join(map(repr, backend_names()))}")
    backend = _BACKENDS[name]
    reason = backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    if not backend.takes_terms(terms):
        missing = " or ".join(sorted(terms - backend.edge_terms))
        takers = ", ".join(repr(n) for n, b in _BACKENDS.items() if b.takes_terms(terms))
        raise ValueError(f"backend {name!r} does not take {missing}; use one of {takers} or 'auto'")
    return backend


def reference_backend() -> Backend:
    """The definition: what degenerate inputs (no edges, H, D or Dv = 0) go to."""
    return _BACKENDS["reference"]


def _triton_attention(inputs: AttentionInputs):
    # Imported on first use: Triton reads TRITON_INTERPRET when the kernels are defined.
    from .triton import triton_attention

    return triton_attention(inputs)


# what triton's fused kernels compute beside q, k, v and bias: triton/launch.py's TERM_ORDER and eps
# (named here, where triton is not imported)
TRITON_TERMS = frozenset({"edge_key", "edge_value", "edge_scale", EPS})


def _probe_triton() -> Optional[str]:
    try:
        import triton  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing at import
        return f"triton is not importable ({type(e).__name__}: {e}); pip install triton"
    return None


# gather, clamp-exp, index_add: the definition; half types accumulate in float32 inside it
register_backend(
    Backend(
        "reference",
        reference_attention,
        dtypes={"cpu": ALL_FLOATS, "cuda": ALL_FLOATS},
        edge_terms=EXTRAS,  # the definition of every term
        grouped_kv=True,
    )
)
# SDDMM + CSR SpMM with a hand-written backward
register_backend(Backend("csr", csr_attention, edge_terms=csr.TERMS, grouped_kv=True))
# The two tile backends multiply whole tiles, non-edges too: `checked` gives a call whose result is not
# finite to csr, so that a NaN or inf reaches only the destinations whose edges touch it (guard.py).
# batched matmuls (or SDPA) over the graph's dense blocks; CUDA's SDPA and fused kernels take half types
dense_dtypes = {"cpu": (torch.float32, torch.float64), "cuda": ALL_FLOATS}
register_backend(
    Backend(
        "dense", checked(dense_attention, csr_attention, lambda x: plan(x.graph).reaches_non_edges), dtypes=dense_dtypes
    )
)
# tiles of consecutive destinations over their shared source span, batched matmuls (eager only)
register_backend(Backend("local", checked(local_attention, csr_attention, takes=local_takes), grouped_kv=True))
# small graphs in few ops: gathers and index_adds over the caller's edges, a hand-written backward
# edge terms beyond its own run the reference's math; edge_weight, whose gradient it does not give, goes elsewhere
register_backend(Backend("small", small_attention, edge_terms=EXTRAS - {EDGE_WEIGHT}))
# the reference on torch_scatter
register_backend(Backend("scatter", scatter.scatter_attention, probe=scatter.probe, edge_terms=scatter.TERMS))
register_backend(
    Backend(
        "triton",
        _triton_attention,  # fused kernels over the CSR: one pass forward, recomputing backward
        # CUDA only: CPU tensors run (slowly) in Triton's interpreter when TRITON_INTERPRET=1 was set
        # before first use; tests ask for backend="triton" by name, "auto" never picks it on CPU.
        probe=_probe_triton,
        devices=("cuda",),
        dtypes={"cpu": ALL_FLOATS, "cuda": ALL_FLOATS},  # float32 (float64 for float64) accumulators
        edge_terms=TRITON_TERMS,  # inside the fused kernels
    )
)

__all__ = [
    "AttentionInputs",
    "Backend",
    "BackendFn",
    "register_backend",
    "registered_backend",
    "backend_names",
    "available_backends",
    "backends_for",
    "choose_auto",
    "get_backend",
    "prepare",
    "reference_attention",
    "reference_backend",
    "csr_attention",
    "dense_attention",
    "plan",
    "DENSE_MIN_EDGES_PER_BLOCK",
    "DENSE_MAX_SHAPES",
    "LOCAL_MIN_DEGREE",
    "LOCAL_MIN_DENSITY",
    "SMALL_MAX_VALUES",
    "SMALL_MAX_VALUES_ONE_CALL",
    "small_attention",
    "local_attention",
    "KernelOptions",
    "as_kernel_options",
    "kernel_options",
]
