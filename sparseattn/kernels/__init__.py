"""Backend registry: names for `edge_attention(..., backend=...)` and the "auto" rule.

Every backend follows one contract (contract.py): `fn(AttentionInputs) -> (out, weights)`, with
the device types and dtypes it takes declared in its `Backend` entry below. Optional dependencies
are probed once, when a backend is first asked for.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

from .._tracing import tracing
from ..graphs import Graph
from . import scatter
from .contract import ALL_FLOATS, AttentionInputs, Backend, BackendFn
from .csr import csr_attention
from .dense import dense_attention, plan
from .guard import checked
from .local import TILE_ROWS, cached_layout, local_attention
from .options import KernelOptions, as_kernel_options, kernel_options
from .reference import reference_attention

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


# "auto" picks "dense" for block graphs whose blocks average at least this many edges (a 128 x 128
# complete block; measured: below it, padded variable-length batches such as 5..50-token blocks
# are faster with csr on CPU) and come in at most DENSE_MAX_SHAPES distinct shapes (each shape is
# one more padded batch to gather); smaller blocks too when every bucket is an unpadded batch of
# complete or causal blocks (F.scaled_dot_product_attention shapes: measured faster than csr from
# 32 x 32 complete and 64-token causal blocks up, in clamp mode whether or not the clamp binds)
DENSE_MIN_EDGES_PER_BLOCK = 16384
DENSE_MAX_SHAPES = 4
# "auto" picks "local" on CPU for graphs with at least LOCAL_MIN_DEGREE edges per destination whose
# tiles (local/plan.py) are at least LOCAL_MIN_DENSITY edges: measured (windows of 8192 nodes, H=8,
# D=64, 1 thread) level with csr in fwd+bwd at radius 16 (33 edges a row, tiles 52% edges) and
# faster from there on (1.6x at radius 32, 2.7x at 64); slower at radius 8 and 12 whatever the tile
LOCAL_MIN_DEGREE = 32
LOCAL_MIN_DENSITY = 0.5


def choose_auto(q: Tensor, graph: Graph, edge_terms: bool = False) -> str:
    """The backend "auto" picks for these inputs (see docs/guide/backends.md):
    "dense" when the graph records dense blocks in at most DENSE_MAX_SHAPES distinct (kind, n_src,
    n_dst) shapes that either average >= DENSE_MIN_EDGES_PER_BLOCK edges or form unpadded batches
    of "full"/"causal" blocks: batched matmuls (or SDPA) beat any sparse kernel there. Otherwise
    "local" for CPU tensors when the graph averages >= LOCAL_MIN_DEGREE edges per destination and
    its tiles hold >= LOCAL_MIN_DENSITY edges (`local.cached_layout`: wide windows, dense bands).
    Otherwise "triton" for CUDA tensors with D <= 256 when triton is importable, else "csr". Never
    "reference" or "scatter" (both are slower everywhere). Inside a torch.compile or torch.export
    trace, never "dense": its batches take their shapes from the block structure, so every new
    batch would compile anew (pass backend="dense" to have it anyway), and never "local" (eager
    only). With edge_terms (edge_key, edge_value, edge_scale or eps given), only backends that take
    them: never "dense" or "local"."""
    blocks = None if tracing() or edge_terms else graph.blocks
    if blocks and len({(b.kind, b.n_src, b.n_dst) for b in blocks}) <= DENSE_MAX_SHAPES:
        if graph.num_edges >= DENSE_MIN_EDGES_PER_BLOCK * len(blocks) or all(
            not bk.padded and bk.kind in ("full", "causal") for bk in plan(graph).buckets
        ):
            return "dense"
    if q.device.type == "cpu" and not tracing() and not edge_terms and _local_pays(graph):
        return "local"
    triton = _BACKENDS.get("triton")
    if q.device.type == "cuda" and q.shape[-1] <= 256 and triton is not None:
        # (probed only for CUDA tensors: the probe imports triton, ~1 s)
        if (triton.edge_terms or not edge_terms) and triton.available:
            return "triton"
    return "csr"


def _local_pays(graph: Graph) -> bool:
    """The "local" part of the auto rule: enough edges per destination first (O(1)), then the
    tiles' density (O(E) once, cached on the graph): of tiles of 16 rows first, which bounds that
    of any larger tile from above, so a random graph costs one pass over its edges."""
    if graph.num_dst == 0 or graph.num_edges < LOCAL_MIN_DEGREE * graph.num_dst:
        return False
    if cached_layout(graph, TILE_ROWS[0]).density < LOCAL_MIN_DENSITY:
        return False
    return cached_layout(graph).density >= LOCAL_MIN_DENSITY


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


def get_backend(name: str, q: Tensor, graph: Graph, edge_terms: bool = False) -> Backend:
    """Resolve a backend name ("auto" included) to a usable Backend, or raise. edge_terms: the call
    has edge_key, edge_value, edge_scale or eps, which the backend must take."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    if name == "auto":
        name = choose_auto(q, graph, edge_terms)
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid names are {', '.join(map(repr, backend_names()))}")
    backend = _BACKENDS[name]
    reason = backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    if edge_terms and not backend.edge_terms:
        takers = ", ".join(repr(n) for n, b in _BACKENDS.items() if b.edge_terms)
        raise ValueError(
            f"backend {name!r} does not take edge_key, edge_value, edge_scale or eps; use one of {takers} or 'auto'"
        )
    return backend


def reference_backend() -> Backend:
    """The definition: what degenerate inputs (no edges, H, D or Dv = 0) go to."""
    return _BACKENDS["reference"]


def _triton_attention(inputs: AttentionInputs):
    # Imported on first use: Triton reads TRITON_INTERPRET when the kernels are defined.
    from .triton import triton_attention

    return triton_attention(inputs)


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
        edge_terms=True,
        grouped_kv=True,
    )
)
# SDDMM + CSR SpMM with a hand-written backward
register_backend(Backend("csr", csr_attention, edge_terms=True, grouped_kv=True))
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
register_backend(Backend("local", checked(local_attention, csr_attention), grouped_kv=True))
# the reference on torch_scatter
register_backend(Backend("scatter", scatter.scatter_attention, probe=scatter.probe, edge_terms=True))
register_backend(
    Backend(
        "triton",
        _triton_attention,  # fused kernels over the CSR: one pass forward, recomputing backward
        # CUDA only: CPU tensors run (slowly) in Triton's interpreter when TRITON_INTERPRET=1 was set
        # before first use; tests ask for backend="triton" by name, "auto" never picks it on CPU.
        probe=_probe_triton,
        devices=("cuda",),
        dtypes={"cpu": ALL_FLOATS, "cuda": ALL_FLOATS},  # float32 (float64 for float64) accumulators
        edge_terms=True,  # edge_key, edge_value, edge_scale and eps inside the fused kernels
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
    "local_attention",
    "KernelOptions",
    "as_kernel_options",
    "kernel_options",
]
