"""Kinds of graph beyond a `Graph` and a (2, E) tensor that attention layers take: objects that run
attention over themselves, such as a `distributed.Shard` of a partitioned graph (the rows it lacks
are fetched from other processes). The package that defines such a type registers it here when it
is imported, so `EdgeAttention` dispatches on it without importing that package.

    register_graph_kind(Shard, "a shard", graph=lambda s: s.graph, attend=sharded_edge_attention)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Union

from torch import Tensor

from .graph import Graph


class GraphKind(NamedTuple):
    """How a layer attends over an object of a registered type.

    name: what the object is, in error messages ("a shard").
    graph: obj -> the `Graph` whose edges the per-edge inputs and the returned weights follow (a
        shard's local graph); weight hooks receive it.
    attend: `attend(q, k, v, obj, **edge_attention_kwargs)`, returning what `edge_attention` returns.
    """

    name: str
    graph: Callable[[Any], Graph]
    attend: Callable[..., Union[Tensor, Tuple[Tensor, Tensor]]]


_KINDS: Dict[type, GraphKind] = {}


def register_graph_kind(
    cls: type,
    name: str,
    *,
    graph: Callable[[Any], Graph],
    attend: Callable[..., Union[Tensor, Tuple[Tensor, Tensor]]],
) -> None:
    """Let attention layers take instances of `cls` (and its subclasses) as their graph (see `GraphKind`)."""
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {type(cls).__name__}")
    _KINDS[cls] = GraphKind(name, graph, attend)


def graph_kind(obj: object) -> Optional[GraphKind]:
    """The registered kind of `obj` (by its class, then its base classes), or None."""
    for cls in type(obj).__mro__:
        kind = _KINDS.get(cls)
        if kind is not None:
            return kind
    return None


__all__ = ["GraphKind", "register_graph_kind", "graph_kind"]
