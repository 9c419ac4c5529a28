"""`Shard`: the part of a graph one process owns, and how its local graph is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..graphs import Graph


@dataclass(frozen=True, eq=False)
class Shard:
    """The destinations one rank owns, their in-edges, and the rows it trades with the other ranks.

    A rank holds the q rows of `nodes` and the k and v rows of `src_nodes` (for self-attention the
    same tensor), in that order. Its local graph attends from `[src_nodes; halo]` into `nodes`:
    local source i < len(src_nodes) is `src_nodes[i]`, local source len(src_nodes) + j is `halo[j]`,
    a row owned elsewhere that `sharded_edge_attention` receives before each call.

    Attributes:
        rank: the rank this shard belongs to; num_parts: how many shards the graph has.
        nodes: (N_own,) int64 global ids of the destinations owned here, ascending.
        src_nodes: (N_src_own,) int64 global ids of the sources owned here (`nodes` for self-attention).
        halo: (N_halo,) int64 global ids of the sources owned elsewhere that edges into `nodes` read,
            grouped by owning rank (ranks ascending, ids ascending within a rank).
        graph: the local `Graph` (num_src = N_src_own + N_halo, num_dst = N_own).
        edge_ids: (E_local,) int64 global id of each local edge, in the local graph's order (slice
            per-edge tensors with it: `bias[shard.edge_ids]`); None for a shard built by
            `local_shard`, whose edges are the caller's own, in the caller's order.
        send_index: (N_send,) int64 local source rows sent to the other ranks, grouped by receiving rank.
        send_counts: rows sent to each rank (N_send in all); recv_counts: halo rows received from each rank.
        num_nodes, num_src_nodes: the global node counts.
    """

    rank: int
    num_parts: int
    nodes: Tensor
    src_nodes: Tensor
    halo: Tensor
    graph: Graph
    edge_ids: Optional[Tensor]
    send_index: Tensor
    send_counts: Tuple[int, ...]
    recv_counts: Tuple[int, ...]
    num_nodes: int
    num_src_nodes: int

    @property
    def halo_size(self) -> int:
        """Rows received per exchange: len(halo)."""
        return int(self.halo.numel())

    @property
    def num_sent(self) -> int:
        """Rows sent per exchange: len(send_index)."""
        return int(self.send_index.numel())

    @property
    def is_bipartite(self) -> bool:
        """True when sources and destinations are two node sets, partitioned separately."""
        return self.src_nodes is not self.nodes

    def to(self, device: "torch.device | str") -> "Shard":
        """The same shard with its tensors and local graph on `device` (nccl needs CUDA tensors)."""
        nodes = self.nodes.to(device)
        return Shard(
            self.rank,
            self.num_parts,
            nodes,
            nodes if not self.is_bipartite else self.src_nodes.to(device),
            self.halo.to(device),
            self.graph.to(device),
            None if self.edge_ids is None else self.edge_ids.to(device),
            self.send_index.to(device),
            self.send_counts,
            self.recv_counts,
            self.num_nodes,
            self.num_src_nodes,
        )

    def __repr__(self) -> str:
        kind = ", bipartite" if self.is_bipartite else ""
        return (
            f"Shard(rank={self.rank}/{self.num_parts}, nodes={self.nodes.numel()}, edges={self.graph.num_edges}, "
            f"halo={self.halo_size}, sent={self.num_sent}{kind})"
        )


@dataclass(frozen=True)
class LocalPart:
    """What one rank's shard holds before the send lists are known (`local_part`)."""

    graph: Graph
    halo: Tensor
    recv_counts: Tuple[int, ...]


def local_part(
    src: Tensor,
    dst_local: Tensor,
    src_owner: Tensor,
    src_pos: Tensor,
    rank: int,
    num_parts: int,
    num_dst: int,
    num_src_own: int,
    num_src_nodes: int,
) -> LocalPart:
    """The local graph and halo of a rank from its in-edges.

    src: (E,) global source ids; dst_local: (E,) local destination ids; src_owner, src_pos: (E,) the
    owning rank of each source and its position among that rank's sources.
    """
    foreign = src_owner != rank
    foreign_keys = src_owner[foreign] * num_src_nodes + src[foreign]  # sorts by owner, then id
    halo_keys = torch.unique(foreign_keys)  # sorted
    halo = halo_keys % num_src_nodes if num_src_nodes else halo_keys
    recv = torch.bincount(halo_keys // max(num_src_nodes, 1), minlength=num_parts) if halo_keys.numel() else None
    recv_counts = tuple(int(c) for c in recv.tolist()) if recv is not None else (0,) * num_parts
    local_src = src_pos.clone()
    local_src[foreign] = num_src_own + torch.searchsorted(halo_keys, foreign_keys)
    # an index built here: validated without another copy
    graph = Graph.borrowed(torch.stack([local_src, dst_local]), num_src=num_src_own + halo.numel(), num_dst=num_dst)
    return LocalPart(graph, halo, recv_counts)
