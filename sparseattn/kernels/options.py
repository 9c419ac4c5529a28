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


@dataclass(frozen=True)
class KernelOptions:
    """csr_layout: "interleaved" or "head-major" for the csr backend (None: picked per graph; edge
    terms always run interleaved). dense_tile_bytes: the dense backend's clamp-mode tile budget in
    bytes (None: `dense.tiles.CLAMP_TILE_BYTES`). triton_forward, triton_backward: the Triton
    kernels' launch settings (layout, BLOCK_E, num_warps, num_stages; the triton backend checks the
    names and values), empty for its own choice; the backward's are read when the forward runs.
    node_order: "locality" runs the call on the graph relabeled in `graphs.locality_order` (found
    once per Graph and cached on it), with q, k and v permuted into that order and the output back:
    for graphs with structure stored in a shuffled order (kNN points, meshes), and only where that
    order brings each destination's sources nearer (`graphs.locality_pays`, decided once per Graph;
    elsewhere the plain call); None: the graph's own order. Ignored inside torch.compile and
    torch.export traces."""

    csr_layout: Optional[str] = None
    dense_tile_bytes: Optional[int] = None
    triton_forward: Mapping[str, Any] = field(default_factory=dict)
    triton_backward: Mapping[str, Any] = field(default_factory=dict)
    node_order: Optional[str] = None

    def __post_init__(self) -> None:
        if self.node_order is not None and self.node_order not in NODE_ORDERS:
            raise ValueError(f"kernel_options node_order must be one of {NODE_ORDERS} or None, got {self.node_order!r}")
        if self.csr_layout is not None and self.csr_layout not in CSR_LAYOUTS:
            raise ValueError(f"kernel_options csr_layout must be one of {CSR_LAYOUTS} or None, got {self.csr_layout!r}")
        tile = self.dense_tile_bytes
        if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
            raise ValueError(f"kernel_options dense_tile_bytes must be a positive int or None, got {tile!r}")
        for name in ("triton_forward", "triton_backward"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"kernel_options {name} must be a mapping of launch settings, got {type(value).__name__}"
                )
            object.__setattr__(self, name, dict(value))

    def changed(self) -> Dict[str, Any]:
        """The fields that differ from a plain KernelOptions()."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(_PLAIN, f.name)}


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


__all__ = ["KernelOptions", "OptionsLike", "CSR_LAYOUTS", "NODE_ORDERS", "as_kernel_options", "kernel_options"]
