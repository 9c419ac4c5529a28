"""Attention over a graph partitioned by destination across processes (torch.distributed).

    shards = partition(graph, world_size, method="contiguous")   # or "metis"
    shard = shards[rank]                                         # q rows of shard.nodes live here
    out = sharded_edge_attention(q, k, v, shard)                 # this rank's destinations' outputs

Each rank owns some destinations, computes their outputs from their in-edges, and fetches the source
rows those edges read from other ranks (its halo) in one `all_to_all_single` per call, after a
header of a few ints that every rank checks (`HaloExchange(check_each_call=)`); backward sends
the halo rows' gradients back. Parameters are replicated (DistributedDataParallel); activations are
partitioned. `EdgeAttention` takes a `Shard` (or a `HaloExchange`) in place of a graph.
"""

from ..graphs.kinds import register_graph_kind
from .exchange import HaloExchange, sharded_edge_attention
from .local import local_shard
from .partition import METHODS, partition
from .shard import Shard

# `EdgeAttention(x, shard)` attends over a Shard or a HaloExchange as over a graph
register_graph_kind(Shard, "a shard", graph=lambda s: s.graph, attend=sharded_edge_attention)
register_graph_kind(HaloExchange, "a shard", graph=lambda h: h.shard.graph, attend=sharded_edge_attention)

__all__ = ["Shard", "partition", "local_shard", "HaloExchange", "sharded_edge_attention", "METHODS"]
