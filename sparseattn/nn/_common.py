"""Constructor checks shared by the `sparseattn.nn` layers."""

from __future__ import annotations

from .._checks import check_dropout as _check_dropout
from ..kernels import backend_names


def check_backend(backend: str) -> str:
    """A backend name `edge_attention` takes ("auto" or a registered one); ValueError otherwise."""
    if backend not in backend_names():
        raise ValueError(f"unknown backend {backend!r}; valid names are {', '.join(map(repr, backend_names()))}")
    return backend


def check_dropout(p: float, name: str = "dropout") -> float:
    """An attention dropout probability in [0, 1) (the layers name it `dropout`)."""
    return _check_dropout(p, name)
