"""sparseattn: multi-head attention over the edges of a graph, in pure PyTorch."""

from . import _start  # noqa: F401  before torch: Ctrl-C while `python -m sparseattn` imports it (_start.py)

# isort: split
from . import distributed, graphs, nn
from ._checks import max_clamp_bound
from .functional import edge_attention
from .graphs import Graph
from .kernels import backend_names
from .kernels.projected import EdgeProjection, QueryProjection
from .kv import KeyValue, KVCache, KVStore, NodeKV
from .modules import EdgeAttention
from .recording import AttentionRecord, record_attention

__version__ = "0.1.0"
__all__ = [
    "edge_attention",
    "EdgeAttention",
    "EdgeProjection",
    "QueryProjection",
    "Graph",
    "graphs",
    "nn",
    "distributed",
    "KeyValue",
    "KVStore",
    "KVCache",
    "NodeKV",
    "record_attention",
    "AttentionRecord",
    "backend_names",
    "max_clamp_bound",
    "__version__",
]
