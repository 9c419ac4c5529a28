"""Graphs for edge attention: the `Graph` wrapper and builders of common patterns."""

from .block import Block
from .builders import batch, bipartite, block_edges, causal, complete, from_blocks, from_row_pointers, random, window
from .exported import exported_module
from .graph import CSR, Graph
from .order import locality_order, locality_pays, locality_view, relabel, source_spread
from .pyg import complete_per_graph, from_pyg

__all__ = [
    "Graph",
    "Block",
    "CSR",
    "complete",
    "causal",
    "bipartite",
    "window",
    "random",
    "batch",
    "from_blocks",
    "from_row_pointers",
    "block_edges",
    "from_pyg",
    "complete_per_graph",
    "locality_order",
    "locality_view",
    "locality_pays",
    "source_spread",
    "relabel",
    "exported_module",
]
