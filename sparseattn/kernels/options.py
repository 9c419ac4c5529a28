"""Per-call kernel options: how a backend lays out and tiles one call, passed through the call as
one object (as FlexAttention's `kernel_options`), never set on a module.

    edge_attention(q, k, v, g, backend="csr", kernel_options={"csr_layout": "head-major"})
    with kernel_options(triton_forward={"layout": "heads"}):   # a default for calls that pass none
        ...

Each field is None (or empty) for "the backend's own choice"; a backend reads only its own fields.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union

CSR_LAYOUTS = ("interleaved", "head-major")
NODE_ORDERS = ("locality",)
LOCAL_TILES = ("torch", "triton")
# the triton backend's launch settings (kernels/triton/policy.py reads them): the names a call may set,
# the layouts of its forward kernel and of its two backward kernels, and the largest num_warps
TRITON_SETTINGS = ("layout", "BLOCK_E", "num_warps", "num_stages")
TRITON_LAYOUTS = ("tile", "lanes", "heads")
TRITON_BACKWARD_LAYOUTS = ("tile", "heads")
MAX_NUM_WARPS = 32  # 32 warps of 32 threads: CUDA's 1024 threads per program


@dataclass(frozen=True)
class KernelOptions:
    """csr_layout: "interleaved" or "head-major" for the csr backend (None: picked per graph; edge
    terms always run interleaved). dense_tile_bytes: the dense backend's clamp-mode tile budget in
    bytes (None: `dense.tiles.CLAMP_TILE_BYTES`). triton_forward, triton_backward: the Triton
    kernels' launch settings, empty for its own choice; the backward's are read when the forward
    runs: layout (`TRITON_LAYOUTS`; backward `TRITON_BACKWARD_LAYOUTS`), BLOCK_E (edges per tile, a
    power of two: the kernels' `tl.arange` takes no other; the triton backend also refuses tiles
    over Triton's largest tensor for the call's dims), num_warps (a power of two up to
    `MAX_NUM_WARPS`, as Triton compiles), num_stages (a positive int, or None for no explicit
    pipelining). A bad name or value is a ValueError naming the field, the name and the value.
    node_order: "locality" runs the call on the graph relabeled in `graphs.locality_order` (found
    once per Graph and cached on it), with q, k and v permuted into that order and the output back:
    for graphs with structure stored in a shuffled order (kNN points, meshes), and only where that
    order brings each destination's sources nearer (`graphs.locality_pays`, decided once per Graph;
    elsewhere the plain call); None: the graph's own order. Ignored inside torch.compile and
    torch.export traces. local_tiles: how the local backend computes its tiles on a GPU, "torch"
    (batched matmuls, `local/tiles.py`) or "triton" (`local/triton_tiles.py`, tensor cores); None:
    "torch" until the Triton tiles are measured on a device (CPU calls always run "torch")."""

    csr_layout: Optional[str] = None
    dense_tile_bytes: Optional[int] = None
    triton_forward: Mapping[str, Any] = field(default_factory=dict)
    triton_backward: Mapping[str, Any] = field(default_factory=dict)
    node_order: Optional[str] = None
    local_tiles: Optional[str] = None

    def __post_init__(self) -> None:
        if self.local_tiles is not None and self.local_tiles not in LOCAL_TILES:
            raise ValueError(
                f"kernel_options local_tiles must be one of {LOCAL_TILES} or None, got {self.local_tiles!r}"
            )
        if self.node_order is not None and self.node_order not in NODE_ORDERS:
            raise ValueError(f"kernel_options node_order must be one of {NODE_ORDERS} or None, got {self.node_order!r}")
        if self.csr_layout is not None and self.csr_layout not in CSR_LAYOUTS:
            raise ValueError(f"kernel_options csr_layout must be one of {CSR_LAYOUTS} or None, got {self.csr_layout!r}")
        tile = self.dense_tile_bytes
        if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
            raise ValueError(f"kernel_options dense_tile_bytes must be a positive int or None, got {tile!r}")
        for name in ("triton_forward", "triton_backward"):
            object.__setattr__(self, name, check_triton_settings(name, getattr(self, name)))

    def changed(self) -> Dict[str, Any]:
        """The fields that differ from a plain KernelOptions()."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(_PLAIN, f.name)}


def _count(value: Any) -> bool:
    """Whether value is an int >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _power_of_two(value: Any, most: Optional[int] = None) -> bool:
    return _count(value) and not value & (value - 1) and (most is None or value <= most)


def check_triton_settings(name: str, settings: Any) -> Dict[str, Any]:
    """A triton backend's launch settings as a dict, or a TypeError (not a mapping) or ValueError
    naming the field (`name`: "triton_forward" or "triton_backward"), the setting and its value."""
    if not isinstance(settings, Mapping):
        raise TypeError(f"kernel_options {name} must be a mapping of launch settings, got {type(settings).__name__}")
    settings = dict(settings)
    unknown = sorted(set(settings) - set(TRITON_SETTINGS), key=str)
    if unknown:
        raise ValueError(f"kernel_options {name} has unknown names {unknown}; valid names are {list(TRITON_SETTINGS)}")
    layouts = TRITON_LAYOUTS if name == "triton_forward" else TRITON_BACKWARD_LAYOUTS
    rules = {
        "layout": (lambda x: x in layouts, f"one of {layouts}"),
        "BLOCK_E": (_power_of_two, "a power of two (edges per tile: Triton's tl.arange takes no other)"),
        "num_warps": (lambda x: _power_of_two(x, MAX_NUM_WARPS), f"a power of two from 1 to {MAX_NUM_WARPS}"),
        "num_stages": (lambda x: x is None or _count(x), "an int >= 1 or None"),
    }
    for key, value in settings.items():
        valid, wanted = rules[key]
        if not valid(value):
            raise ValueError(f"kernel_options {name}[{key!r}] must be {wanted}, got {value!r}")
    return settings


OptionsLike = Union[KernelOptions, Mapping[str, Any], None]
_PLAIN = KernelOptions()
# the defaults `kernel_options` blocks set, innermost last: a plain list, which compiled code reads
# as a guarded global (torch.compile cannot trace a ContextVar)
_DEFAULTS: List[KernelOptions] = []


def _default() -> KernelOptions:
    return _DEFAULTS[-1] if _DEFAULTS else _PLAIN


def as_kernel_options(options: OptionsLike) -> KernelOptions:
    """A call's options: `options` itself, a mapping of KernelOptions fields, or (None) the default
    in force (`kernel_options`). An unknown name is a ValueError naming it."""
    if options is None:
        return _default()
    if isinstance(options, KernelOptions):
        return options
    if not isinstance(options, Mapping):
        raise TypeError(f"kernel_options must be a KernelOptions, a dict or None, got {type(options).__name__}")
    known = {f.name for f in fields(KernelOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"kernel_options has unknown names {unknown}; valid names are {sorted(known)}")
    return KernelOptions(**options)


@contextlib.contextmanager
def kernel_options(**settings: Any) -> Iterator[KernelOptions]:
    """A default for the calls inside the block that pass no kernel_options: the default in force
    with `settings` replaced (a thin convenience over passing kernel_options=)."""
    merged = replace(_default(), **as_kernel_options(settings).changed())
    _DEFAULTS.append(merged)
    try:
        yield merged
    finally:
        _DEFAULTS.pop()


__all__ = [
    "KernelOptions",
    "OptionsLike",
    "CSR_LAYOUTS",
    "NODE_ORDERS",
    "LOCAL_TILES",
    "TRITON_SETTINGS",
    "TRITON_LAYOUTS",
    "TRITON_BACKWARD_LAYOUTS",
    "MAX_NUM_WARPS",
    "as_kernel_options",
    "check_triton_settings",
    "kernel_options",
]
