"""Attention within each graph of a PyG-style batch (every node attends to every node of its own graph,
GraphGPS's global attention), decided here rather than in the layers: the batch's graphs packed into
padded rows and one SDPA with a mask that keeps each graph to itself (`kernels.padded`, no graph
built), or `edge_attention` over the batch's block-diagonal complete graph (`graphs.complete_per_graph`).
Either way the plan of a batch vector (its graph sizes, the padded slot of each node, or the Graph) is
made once per batch and shared by every layer that receives the same tensor (`graphs.memo`).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .._tracing import exporting, tracing
from ..graphs import Graph
from ..graphs.memo import recall
from ..graphs.pyg import complete_per_graph
from .auto import choose_packing, choose_padding
from .contract import AttentionInputs
from .guard import checked
from .padded import PaddedBatch, graph_sizes, padded_attention, plan_padding, rows_cost


def padded_batch(batch: Optional[Tensor], ptr: Optional[Tensor], n: int, dtype: torch.dtype) -> Optional[PaddedBatch]:
    """The padded plan of a batch of n nodes where `auto.choose_padding` takes it, else None (also for a
    batch that is not a valid sorted one, or a ptr that does not span the n nodes: the graph path then
    names what is wrong); graphs packed several to a row where `auto.choose_packing` says so, else one
    per row."""
    sizes = graph_sizes(batch, ptr, n)
    if sizes is None:
        return None
    counts = sizes.tolist()  # the one host read of the sizes; the plan and its checks use this list
    if min(counts) < 0 or sum(counts) != n or n == 0:
        return None
    plan = plan_padding(counts, dtype, sizes.device, packing=choose_packing(sizes.device))
    return plan if choose_padding(rows_cost(plan.rows, plan.length), sum(c * c for c in counts)) else None


def attention_within_graphs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    batch: Optional[Tensor] = None,
    ptr: Optional[Tensor] = None,
    *,
    clamp: Optional[Tuple[float, float]] = None,
    dropout_p: float = 0.0,
    bias: Optional[Tensor] = None,
    backend: str = "auto",
    return_weights: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Every node attends to every node of its own graph: q, k, v (N, H, D), the graphs given by ptr
    (B + 1,) offsets, else a sorted batch (N,) vector of graph ids, else all N nodes as one graph.
    Returns what `edge_attention` returns over `graphs.complete_per_graph(batch, ptr)`'s edges (bias
    (E, H) or (E,) in its edge order; weights likewise)."""
    from ..functional import edge_attention

    n = q.shape[0]
    if exporting() and (batch is not None or ptr is not None):
        # the graphs' sizes are batch's (or ptr's) values, which an exported program cannot branch on
        raise ValueError(
            "torch.export cannot attend within the graphs of a batch or ptr tensor (their sizes are the "
            "tensor's values): export with graph=graphs.complete_per_graph(batch) as an input instead (a Graph "
            "is a pytree input; dynamic_shapes=Graph.dynamic_shapes()), built outside the exported program"
        )
    padded_ok = backend == "auto" and clamp is None and bias is None and not return_weights
    if padded_ok and (ptr is not None or batch is not None):
        # traced, run eagerly as a whole: its plan comes from host reads, and a packed row's check
        # (`guard.checked`) reads its result back, neither of which a trace can hold; the compiled
        # code around it keeps the projections (wrapped here, not at import, which would import
        # torch._dynamo into every eager process)
        padded = torch.compiler.disable(padded_within_graphs) if tracing() else padded_within_graphs
        out = padded(q, k, v, batch, ptr, dropout_p)
        if out is not None:
            return out
    # traced: built eagerly (its sizes come from host reads), as torch.compiler.disable does
    build = torch.compiler.disable(within_graphs_graph) if tracing() else within_graphs_graph
    graph = build(batch, ptr, n)
    return edge_attention(
        q, k, v, graph, clamp=clamp, dropout_p=dropout_p, bias=bias, backend=backend, return_weights=return_weights
    )


def padded_within_graphs(
    q: Tensor, k: Tensor, v: Tensor, batch: Optional[Tensor], ptr: Optional[Tensor], dropout_p: float
) -> Optional[Tensor]:
    """`attention_within_graphs` over the batch's padded plan (made once per batch or ptr tensor),
    or None where `auto.choose_padding` does not take it."""
    n = q.shape[0]
    given: Tensor = ptr if ptr is not None else batch  # type: ignore[assignment]
    plan = recall(given, ("padded batch", n, q.dtype, q.device), lambda: padded_batch(batch, ptr, n, q.dtype))
    return None if plan is None else _padded(q, k, v, plan, dropout_p)


def _padded(q: Tensor, k: Tensor, v: Tensor, plan: PaddedBatch, dropout_p: float) -> Tensor:
    """`padded.padded_attention` over the plan; where a row packs several graphs, its result checked
    (`guard.checked`): an output or gradient holding a non-finite value comes from the plan with one
    graph per row, so that a NaN of one graph reaches no other, as over the block graph."""
    if not plan.packed:
        return padded_attention(q, k, v, plan.slot, plan.mask, dropout_p)

    def packed(inputs: AttentionInputs) -> Tuple[Tensor, None]:
        return padded_attention(inputs.q, inputs.k, inputs.v, plan.slot, plan.mask, dropout_p), None

    def alone(inputs: AttentionInputs) -> Tuple[Tensor, None]:
        separate = plan.alone()
        return padded_attention(inputs.q, inputs.k, inputs.v, separate.slot, separate.mask, dropout_p), None

    # the guard reads q, k, v (and bias: None) of the inputs; the graph is the plan's
    inputs = AttentionInputs(q, k, v, None, 1.0, None, None, None, False)  # type: ignore[arg-type]
    return checked(packed, alone)(inputs)[0]


def within_graphs_graph(batch: Optional[Tensor], ptr: Optional[Tensor], n: int) -> Graph:
    """`complete_per_graph(batch, ptr, n)` for one model step: built once per batch tensor (`graphs.memo`);
    csr skips the indexes that pay off only over many steps. Never traced (`attention_within_graphs`
    runs it eagerly under torch.compile): its sizes come from host reads of batch or ptr, which would
    break a trace three times a call and be redone by every layer; run eagerly it is one break, and
    the model's later layers recall it (GPS model on FreeSolv: 8-9 compiled graphs instead of 17)."""
    given = ptr if ptr is not None else batch
    build = lambda: complete_per_graph(batch, ptr, num_nodes=n).for_one_call()  # noqa: E731
    return build() if given is None else recall(given, ("complete per graph", n, ptr is not None), build)


__all__ = ["attention_within_graphs", "padded_batch", "padded_within_graphs", "within_graphs_graph"]
