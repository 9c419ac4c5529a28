"""`record_attention(model)`: the attention weights of every `EdgeAttention` in a model, for plots
and inspection, without threading anything through the model's forward."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, NamedTuple, Union

from torch import Tensor, nn

from .graphs import Graph
from .modules import EdgeAttention


class AttentionRecord(NamedTuple):
    """One call of one module: name (its path in the model, e.g. "decoder.1.cross_attn"), call (the
    how-manieth call of that module inside the block, from 0: the ACT step of a shared layer), graph
    (the edges attended along) and weights (E, H), detached, in that graph's edge order."""

    name: str
    call: int
    graph: Union[Graph, Tensor]
    weights: Tensor


@contextmanager
def record_attention(model: nn.Module) -> Iterator[List[AttentionRecord]]:
    """Inside the block every EdgeAttention of `model` appends an `AttentionRecord` per call to
    the yielded list (weights are computed only while recording):

        with record_attention(model) as records:
            model(batch)
        for r in records: ...
    """
    records: List[AttentionRecord] = []
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, EdgeAttention):

            def hook(mod, graph, weights, name=name):
                call = sum(r.name == name for r in records)
                records.append(AttentionRecord(name, call, graph, weights.detach()))

            handles.append(module.register_weights_hook(hook))
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()
