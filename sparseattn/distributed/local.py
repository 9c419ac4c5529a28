"""`local_shard`: a rank's Shard built from its own in-edges, with its peers, no rank holding the graph."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .._checks import check_edge_index
from . import agreement
from .partition import _positions
from .shard import LocalPart, Shard, local_part

OwnerPos = Callable[[Tensor], Tuple[Tensor, Tensor]]  # (n,) global ids -> their (n,) owners and positions there


def local_shard(
    edge_index: Tensor,
    *,
    ranges: Optional[Sequence[int]] = None,
    owner: Optional[Tensor] = None,
    group: Optional[Any] = None,
) -> Shard:
    """This rank's `Shard` built from its own in-edges only, collectively: no rank holds the whole graph.

    Every rank passes the edges into the destinations it owns (global ids; self-attention graphs)
    and how nodes are owned, as `ranges` (P + 1 offsets: rank r owns ids ranges[r] .. ranges[r+1] - 1)
    or `owner` ((N,) the rank of every node). The halo requests are traded in two
    `all_to_all_single` calls. The local edges keep the caller's order (`shard.edge_ids` is None).

    A rank whose own arguments are wrong (ranges, owner, an id out of range, an edge into a node
    another rank owns) does not leave its peers waiting: the first trade carries a failed flag
    beside each count, and every rank raises the same one-line ValueError naming the ranks that
    failed and their errors (`rank 1 of 2 could not build its shard (local_shard): rank 1: ...`).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("local_shard runs collectively: call dist.init_process_group first")
    num_parts, rank = dist.get_world_size(group), dist.get_rank(group)
    device = edge_index.device if isinstance(edge_index, Tensor) else torch.device("cpu")
    failed: Optional[Exception] = None
    try:
        nodes, owner_pos, num_nodes, part = _own_part(edge_index, ranges, owner, rank, num_parts)
    except Exception as error:
        if num_parts == 1:
            raise
        failed = error
    # tell each owner which of its rows this rank reads: counts first, each beside a failed flag, then the ids
    nccl = dist.get_backend(group) == "nccl"
    comm = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    recv_counts = part.recv_counts if failed is None else (0,) * num_parts
    recv = torch.tensor([[c, int(failed is not None)] for c in recv_counts], dtype=torch.long, device=comm)
    send = torch.empty_like(recv)  # (P, 2): from each peer, the rows it reads here and its flag
    dist.all_to_all_single(send, recv, group=group)
    counts_and_flags = send.tolist()
    if failed is not None or any(flag for _, flag in counts_and_flags):
        try:
            failure = None if failed is None else agreement.one_line(failed)
            agreement.raise_failures(failure, group, "build its shard (local_shard)")
        except ValueError as every_rank:
            raise every_rank from failed
    send_counts = tuple(c for c, _ in counts_and_flags)
    requested = torch.empty(sum(send_counts), dtype=torch.long, device=comm)
    dist.all_to_all_single(requested, part.halo.to(comm), list(send_counts), list(part.recv_counts), group=group)
    requested = requested.cpu()
    shard = Shard(
        rank=rank,
        num_parts=num_parts,
        nodes=nodes,
        src_nodes=nodes,
        halo=part.halo,
        graph=part.graph,
        edge_ids=None,
        send_index=owner_pos(requested)[1],
        send_counts=send_counts,
        recv_counts=part.recv_counts,
        num_nodes=num_nodes,
        num_src_nodes=num_nodes,
    )
    return shard.to(device) if device.type != "cpu" else shard


def _own_part(
    edge_index: Tensor, ranges: Optional[Sequence[int]], owner: Optional[Tensor], rank: int, num_parts: int
) -> Tuple[Tensor, OwnerPos, int, LocalPart]:
    """This rank's side of `local_shard`, with no collective: its (N_own,) nodes, where every node
    lives, the graph's node count and its local part. Raises for the rank's own wrong arguments."""
    edge_index = check_edge_index(edge_index).to(torch.long).cpu()
    if (ranges is None) == (owner is None):
        raise ValueError("pass exactly one of ranges= (contiguous ownership) and owner= (a rank per node)")
    if ranges is not None:
        bounds = torch.as_tensor(list(ranges), dtype=torch.long)
        if bounds.shape != (num_parts + 1,) or int(bounds[0]) != 0 or bool((bounds[1:] < bounds[:-1]).any()):
            raise ValueError(f"ranges must be {num_parts + 1} non-decreasing offsets from 0, got {list(ranges)}")
        num_nodes = int(bounds[-1])
        nodes = torch.arange(int(bounds[rank]), int(bounds[rank + 1]))

        def owner_pos(x: Tensor) -> Tuple[Tensor, Tensor]:
            o = torch.searchsorted(bounds, x, right=True) - 1
            return o, x - bounds[o]
    else:
        assert owner is not None
        if not isinstance(owner, Tensor) or owner.dim() != 1 or owner.dtype == torch.bool or owner.is_floating_point():
            raise ValueError("owner must be a 1-D integer tensor holding the rank of every node")
        owner = owner.cpu().long()
        if owner.numel() and (int(owner.min()) < 0 or int(owner.max()) >= num_parts):
            raise ValueError(f"owner holds ranks outside 0..{num_parts - 1}")
        num_nodes = owner.numel()
        pos, groups = _positions(owner, num_parts)
        nodes = groups[rank]
        owners = owner

        def owner_pos(x: Tensor) -> Tuple[Tensor, Tensor]:
            return owners[x], pos[x]

    src, dst = edge_index[0], edge_index[1]
    if src.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index holds node ids outside 0..{num_nodes - 1}")
    dst_owner, dst_pos = owner_pos(dst)
    foreign = dst_owner != rank
    if bool(foreign.any()):
        bad, other = int(dst[foreign][0]), int(dst_owner[foreign][0])
        raise ValueError(
            f"edge_index[1] (destinations) names node {bad}, owned by rank {other}, not by this rank ({rank}): "
            "pass only the in-edges of the nodes this rank owns"
        )
    src_owner, src_pos = owner_pos(src)
    part = local_part(src, dst_pos, src_owner, src_pos, rank, num_parts, nodes.numel(), nodes.numel(), num_nodes)
    return nodes, owner_pos, num_nodes, part
