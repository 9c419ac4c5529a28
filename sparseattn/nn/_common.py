"""Constructor checks shared by the `sparseattn.nn` layers."""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor

from .._checks import check_dropout as _check_dropout
from ..graphs import Graph
from ..kernels import backend_names


def check_backend(backend: str) -> str:
    """A backend name `edge_attention` takes ("auto" or a registered one); ValueError otherwise."""
    if backend not in backend_names():
        raise ValueError(f"unknown backend {backend!r}; valid names are {', '.join(map(repr, backend_names()))}")
    return backend


def check_dropout(p: float, name: str = "dropout") -> float:
    """An attention dropout probability in [0, 1) (the layers name it `dropout`)."""
    return _check_dropout(p, name)


def edge_count(edge_index: Union[Tensor, Graph]) -> Optional[int]:
    """E of a Graph or a (2, E) tensor, the rows edge_attr must have; None for anything else
    (edge_attention then says what is wrong with it)."""
    if isinstance(edge_index, Graph):
        return edge_index.num_edges
    if isinstance(edge_index, Tensor) and edge_index.dim() == 2 and edge_index.shape[0] == 2:
        return edge_index.shape[1]
    return None
