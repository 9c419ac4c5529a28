"""Backend registry: names for `edge_attention(..., backend=...)` and the "auto" rule.

A backend is a function with the signature of `reference_attention`:
    fn(q, k, v, graph, *, scale, clamp, bias, dropout_mask, return_weights) -> (out, weights)
with q: (N_dst, H, D), k: (N_src, H, D), v: (N_src, H, Dv), bias and dropout_mask (E, H)
or None, out (N_dst, H, Dv) and weights (E, H) in the graph's edge order or None.
Optional dependencies are probed once, when a backend is first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch
from torch import Tensor

from ..graphs import Graph
from . import scatter
from .csr import csr_attention
from .dense import dense_attention, plan
from .reference import reference_attention


@dataclass
class Backend:
    name: str
    fn: Callable
    probe: Callable[[], Optional[str]] = lambda: None  # returns why it is unavailable, or None
    devices: tuple = ("cpu", "cuda")  # device types whose tensors it accepts
    _unavailable: Optional[str] = field(default=None, init=False)
    _probed: bool = field(default=False, init=False)

    def unavailable_reason(self) -> Optional[str]:
        if not self._probed:
            self._unavailable, self._probed = self.probe(), True
        return self._unavailable

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None


_BACKENDS: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    _BACKENDS[backend.name] = backend


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


def choose_auto(q: Tensor, graph: Graph) -> str:
    """The backend "auto" picks for these inputs (see README, "Backends"):
    "dense" when the graph records dense blocks in at most DENSE_MAX_SHAPES distinct (kind, n_src,
    n_dst) shapes that either average >= DENSE_MIN_EDGES_PER_BLOCK edges or form unpadded batches
    of "full"/"causal" blocks: batched matmuls (or SDPA) beat any sparse kernel there. Otherwise
    "triton" for CUDA tensors with D <= 256 when triton is importable, else "csr". Never
    "reference" or "scatter" (both are slower everywhere)."""
    blocks = graph.blocks
    if blocks and len({(b.kind, b.n_src, b.n_dst) for b in blocks}) <= DENSE_MAX_SHAPES:
        if graph.num_edges >= DENSE_MIN_EDGES_PER_BLOCK * len(blocks) or all(
            not bk.padded and bk.kind in ("full", "causal") for bk in plan(graph).buckets
        ):
            return "dense"
    triton = _BACKENDS.get("triton")
    if q.device.type == "cuda" and q.shape[-1] <= 256 and triton is not None and triton.available:
        return "triton"
    return "csr"


def prepare(graph: Graph, heads: int, head_dim: Optional[int] = None, dtype: torch.dtype = torch.float32) -> None:
    """Build and cache every index the CPU kernels read for this graph and head count (csr's
    pattern and its transpose; dense's plan when the graph has blocks), so that
    `torch.compile(fullgraph=True)` or `torch.export` of code calling `edge_attention` on this
    graph only reads cached tensors: building them would break the compiled graph. With the keys'
    head_dim (and dtype) given, only the csr layout those keys will take is built (on large random
    graphs the interleaved one is H * E entries that would go unused); without it, both."""
    from .csr_ops import prepare as prepare_csr
    from .dense import prepare as prepare_dense

    prepare_csr(graph, heads, head_dim, dtype)
    prepare_dense(graph)


def get_backend(name: str, q: Tensor, graph: Graph) -> Backend:
    """Resolve a backend name ("auto" included) to a usable Backend, or raise."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    if name == "auto":
        name = choose_auto(q, graph)
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid names are {', '.join(map(repr, backend_names()))}")
    backend = _BACKENDS[name]
    reason = backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    return backend


register_backend(Backend("reference", reference_attention))  # gather, clamp-exp, index_add: the definition
register_backend(Backend("csr", csr_attention))  # SDDMM + CSR SpMM with a hand-written backward
register_backend(Backend("dense", dense_attention))  # batched matmuls (or SDPA) over the graph's dense blocks
register_backend(Backend("scatter", scatter.scatter_attention, probe=scatter.probe))  # the reference on torch_scatter


def _triton_attention(*args, **kwargs):
    # Imported on first use: Triton reads TRITON_INTERPRET when the kernels are defined.
    from .triton_kernel import triton_attention

    return triton_attention(*args, **kwargs)


def _probe_triton() -> Optional[str]:
    try:
        import triton  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing at import
        return f"triton is not importable ({type(e).__name__}: {e}); pip install triton"
    return None


register_backend(
    Backend(
        "triton",
        _triton_attention,  # fused kernels over the CSR: one pass forward, recomputing backward
        # CUDA only: CPU tensors run (slowly) in Triton's interpreter when TRITON_INTERPRET=1 was set
        # before first use; tests ask for backend="triton" by name, "auto" never picks it on CPU.
        probe=_probe_triton,
        devices=("cuda",),
    )
)

__all__ = [
    "Backend",
    "register_backend",
    "backend_names",
    "available_backends",
    "backends_for",
    "choose_auto",
    "get_backend",
    "prepare",
    "reference_attention",
    "csr_attention",
    "dense_attention",
    "plan",
    "DENSE_MIN_EDGES_PER_BLOCK",
    "DENSE_MAX_SHAPES",
]
