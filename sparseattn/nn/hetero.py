"""`to_hetero`: PyG's `to_hetero` for models built with `sparseattn.nn` layers."""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .exphormer import ExphormerAttention
from .gat import GATConv
from .gatv2 import GATv2Conv
from .transformer_conv import TransformerConv

# layers that take an edge index and return one row per destination node, as PyG's MessagePassing
EDGE_LAYERS = (TransformerConv, GATConv, GATv2Conv, ExphormerAttention)


def to_hetero(
    module: nn.Module, metadata: Any, aggr: str = "sum", input_map: Optional[dict] = None, debug: bool = False
) -> nn.Module:
    """`torch_geometric.nn.to_hetero(module, metadata, aggr, input_map, debug)`, with the
    `sparseattn.nn` edge layers (TransformerConv, GATConv, GATv2Conv, ExphormerAttention) treated
    as PyG treats its MessagePassing layers: one copy per edge type, outputs summed (or `aggr`) per
    destination node type. The result and its state dict keys are those PyG's `to_hetero` gives for PyG's layers.

    PyG's own `to_hetero` recognizes message passing by `isinstance(layer, MessagePassing)` only, so
    on sparseattn layers it returns, without an error, outputs keyed by edge type instead of node
    type. This function widens that test for the duration of the call (PyG's module-level
    `torch_geometric.nn.fx.is_message_passing_op`, restored afterwards; it only adds these layers).
    Needs torch_geometric, imported here only.

    Args and return: as `torch_geometric.nn.to_hetero` (metadata = `data.metadata()`); the layers
    must take bipartite inputs for edge types between two node types (in_channels=(-1, -1)).
    """
    from torch_geometric.nn import fx as pyg_fx  # type: ignore[import-untyped]
    from torch_geometric.nn import to_hetero as pyg_to_hetero

    pyg_test = pyg_fx.is_message_passing_op

    def is_message_passing_op(root: nn.Module, op: str, target: str) -> bool:
        if op == "call_module" and isinstance(pyg_fx.get_submodule(root, target), EDGE_LAYERS):
            return True
        return pyg_test(root, op, target)

    pyg_fx.is_message_passing_op = is_message_passing_op
    try:
        return pyg_to_hetero(module, metadata, aggr=aggr, input_map=input_map, debug=debug)
    finally:
        pyg_fx.is_message_passing_op = pyg_test
