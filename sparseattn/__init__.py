"""sparseattn: multi-head attention over the edges of a graph, in pure PyTorch."""
from . import graphs
from .functional import edge_attention
from .graphs import Graph
from .modules import EdgeAttention

__version__ = "0.1.0"
__all__ = ["edge_attention", "EdgeAttention", "Graph", "graphs", "__version__"]
