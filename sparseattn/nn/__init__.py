"""Layers of graph-learning libraries rebuilt on `edge_attention`, with the originals' parameter
names so state dicts load both ways: PyG's `TransformerConv`, `GATConv` and `GATv2Conv`,
Exphormer's attention, anemoi's `GraphTransformerConv`, GraphGPS's global attention over
batches of graphs (no padding) and PyG's `GPSConv` built on it; `to_hetero` for heterogeneous
graphs, and `attention_explainer` and `explainable` for PyG's explainers."""

from ..graphs import complete_per_graph
from .anemoi import GraphTransformerConv
from .exphormer import ExphormerAttention
from .explain import attention_explainer, explainable
from .gat import GATConv
from .gatv2 import GATv2Conv
from .global_attention import GlobalAttention
from .gps_conv import GPSConv
from .hetero import to_hetero
from .transformer_conv import TransformerConv

__all__ = [
    "TransformerConv",
    "GATConv",
    "GATv2Conv",
    "ExphormerAttention",
    "GraphTransformerConv",
    "GlobalAttention",
    "complete_per_graph",
    "GPSConv",
    "to_hetero",
    "attention_explainer",
    "explainable",
]
