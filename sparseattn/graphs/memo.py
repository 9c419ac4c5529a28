"""Facts the library has established about a caller's tensor (an edge_index's ids are in range, a batch
vector's graph sizes), remembered for as long as that tensor lives unmodified: the raw edge_index and
batch vector a model hands to each of its layers are checked and planned by the first layer alone.

Entries are keyed by the tensor's identity, hold its version counter (an in-place edit forgets them)
and disappear with the tensor; a value must not refer to the tensor itself (it would keep it alive).
Nothing is remembered inside a torch.compile trace or for inference-mode tensors (no version counter).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Optional, Tuple

from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from .._tracing import tracing

_FACTS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> (version, {key: value})


def _version(t: Tensor) -> Optional[int]:
    """t's version counter, or None where facts about t cannot be kept: inside a trace, for an
    inference-mode tensor, or a tensor of a function transform without a counter of its own."""
    if tracing() or t.is_inference():
        return None
    try:
        return t._version
    except (RuntimeError, AttributeError):
        return None


def recall(t: Tensor, key: Hashable, compute: Callable[[], Any]) -> Any:
    """compute()'s value for (t, key): remembered from an earlier call while t is alive and unmodified,
    else computed now (and remembered). compute's exceptions propagate and nothing is remembered."""
    version = _version(t)
    if version is None:
        return compute()
    entry: Tuple[int, Dict[Hashable, Any]] = _FACTS.get(t)
    if entry is not None and entry[0] == version and key in entry[1]:
        return entry[1][key]
    value = compute()
    if entry is None or entry[0] != version:
        entry = (version, {})
        _FACTS[t] = entry
    entry[1][key] = value
    return value


__all__ = ["recall"]
