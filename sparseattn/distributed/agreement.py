"""What the ranks of a halo exchange must agree on, checked in one small collective before rows travel.

`all_to_all_single` trusts every rank's counts and row width: a rank whose shard, head dim or dtype
differs from its peers' makes the others read a half-filled buffer, abort inside gloo, or index
out of range. So before each forward exchange every rank contributes a header of a few ints:

- its shard: the part it holds, the partition's node counts, and the count and two modular sums of
  the node ids it owns (the parts of one partition cover 0..N-1 once);
- a digest of its exchange plan: a hash of the ids it sends each peer and one of the ids it expects
  from each peer, summed over peers (the plans agree when the sums over ranks match);
- the signature of the tensors it exchanges now: dtype and trailing shapes.

The plan's part is computed once per shard; a call costs one `all_gather` of about 14 int64 per
rank. Every rank reads the same gathered headers and so reaches the same verdict; when they differ,
the ranks gather a readable description of their sides and every rank raises the same one-line
ValueError naming what differs and on which ranks. A rank whose own call is wrong (a tensor with the
wrong number of rows, on the wrong device) still sends its header, marked failed, so that every rank
raises one line naming that rank and its error instead of its peers waiting for it; so does a rank
whose shard argument is not a shard at all (its header then carries its place in the group only).
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .shard import Shard

_P = 2**31 - 1  # id sums are taken mod this prime (its squares fit int64)
_M = 2**62  # plan digests are sums of 62-bit hashes mod this
FIELDS = (
    "part",
    "num_parts",
    "num_nodes",
    "num_src_nodes",
    "bipartite",
    "dst_count",
    "dst_sum",
    "dst_sq",
    "src_count",
    "src_sum",
    "src_sq",
    "sends",
    "expects",
    "signature",
    "failed",
)
_SAME = ("num_nodes", "num_src_nodes", "bipartite")
_PARTITION = "partition(graph, world_size)"
_FIX = f"give each rank shards[rank] of one {_PARTITION} call (or local_shard with the same ranges/owner)"


@dataclass(frozen=True)
class Plan:
    """One shard's side of the exchange, as ints: the header's plan fields and, per peer, the
    number and hash of the ids sent to it and expected from it."""

    fields: Tuple[int, ...]
    send_counts: Tuple[int, ...]
    recv_counts: Tuple[int, ...]
    send_hashes: Tuple[int, ...]
    recv_hashes: Tuple[int, ...]


_PLANS: "weakref.WeakKeyDictionary[Shard, Plan]" = weakref.WeakKeyDictionary()


def _hash(*parts: object) -> int:
    """A 62-bit hash of ints, strings and int64 id tensors, the same in every process."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        data = part.cpu().contiguous().numpy().astype("<i8").tobytes() if isinstance(part, Tensor) else repr(part)
        h.update(data if isinstance(data, bytes) else data.encode())
        h.update(b"|")
    return int.from_bytes(h.digest(), "little") % _M


def _id_sums(ids: Tensor) -> Tuple[int, int, int]:
    """(count, sum of ids mod P, sum of squares mod P) of (n,) int64 ids."""
    r = ids.cpu() % _P
    return ids.numel(), int(r.sum()) % _P, int((r * r % _P).sum()) % _P


def expected_sums(n: int) -> Tuple[int, int, int]:
    """What `_id_sums` gives summed over parts that own 0..n-1 once (exact, from the closed forms)."""
    q, r = divmod(n, _P)

    def sq(m: int) -> int:  # sum of j^2, j < m
        return (m - 1) * m * (2 * m - 1) // 6

    return n, (q * (_P * (_P - 1) // 2) + r * (r - 1) // 2) % _P, (q * sq(_P) + sq(r)) % _P


def plan(shard: Shard) -> Plan:
    """The shard's `Plan` (computed on first use, then kept while the shard lives)."""
    cached = _PLANS.get(shard)
    if cached is None:
        src_nodes, index = shard.src_nodes.cpu(), shard.send_index.cpu()
        # a shard built against other ranks' ownership may point past its rows (local_shard with
        # ranges that differ): such rows hash as id -1, so the peers, not an IndexError here, say so
        inside = (index >= 0) & (index < src_nodes.numel())
        ids = torch.full_like(index, -1)
        ids[inside] = src_nodes[index[inside]]
        sent = ids.split(list(shard.send_counts))
        expected = shard.halo.cpu().split(list(shard.recv_counts))
        send_hashes = tuple(_hash(shard.rank, peer, ids) for peer, ids in enumerate(sent))
        recv_hashes = tuple(_hash(peer, shard.rank, ids) for peer, ids in enumerate(expected))
        fields = (
            shard.rank,
            shard.num_parts,
            shard.num_nodes,
            shard.num_src_nodes,
            int(shard.is_bipartite),
            *_id_sums(shard.nodes),
            *_id_sums(src_nodes),
            sum(send_hashes) % _M,
            sum(recv_hashes) % _M,
        )
        cached = _PLANS[shard] = Plan(fields, shard.send_counts, shard.recv_counts, send_hashes, recv_hashes)
    return cached


def signature(xs: Sequence[Tensor]) -> Tuple[str, Tuple[Tuple[int, ...], ...]]:
    """What the peers must match of the tensors exchanged: dtype and each one's trailing shape."""
    return str(xs[0].dtype).replace("torch.", ""), tuple(tuple(x.shape[1:]) for x in xs)


def check(shard: Optional[Shard], xs: Sequence[Tensor], group: Optional[Any], failure: Optional[str] = None) -> None:
    """Collectively: raise the same ValueError on every rank of `group` unless all ranks hold shards
    of one partition, each in its rank's place, and exchange tensors of one dtype and trailing shape.
    failure: this rank's own error (`one_line`), which makes every rank raise (xs is then not read,
    and shard may be None: a rank that has none)."""
    world = dist.get_world_size(group)
    if shard is None:
        if failure is None:
            raise ValueError("agreement.check needs a shard unless this rank's call failed")
        mine = Plan((dist.get_rank(group), world) + (0,) * (len(FIELDS) - 4), (), (), (), ())
    else:
        mine = plan(shard)
    sig = signature(xs) if failure is None else ("failed", ())
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else None
    row = torch.tensor([*mine.fields, _hash(sig), int(failure is not None)], dtype=torch.long, device=device)
    rows = [torch.empty_like(row) for _ in range(world)]
    dist.all_gather(rows, row, group=group)
    headers = [dict(zip(FIELDS, r)) for r in torch.stack(rows).tolist()]
    if agree(headers):
        return
    details: List[Optional[Dict[str, Any]]] = [None] * world
    side: Dict[str, Any] = dict(zip(FIELDS, row.tolist()))
    side.update(plan=mine, dtype=sig[0], shapes=sig[1], failure=failure)
    dist.all_gather_object(details, side, group=group)
    raise ValueError(disagreement([d for d in details if d is not None]))


def agree(headers: Sequence[Dict[str, int]]) -> bool:
    """Whether the gathered headers (one per rank, in rank order) describe one consistent exchange."""
    world = len(headers)
    if any(h["failed"] for h in headers):
        return False
    if any((h["part"], h["num_parts"]) != (r, world) for r, h in enumerate(headers)):
        return False
    if any(h[key] != headers[0][key] for h in headers for key in (*_SAME, "signature")):
        return False
    if not (_covers(headers, "dst", headers[0]["num_nodes"]) and _covers(headers, "src", headers[0]["num_src_nodes"])):
        return False
    return sum(h["sends"] for h in headers) % _M == sum(h["expects"] for h in headers) % _M


def _covers(headers: Sequence[Dict[str, Any]], prefix: str, n: int) -> bool:
    """Whether the ranks' "dst" (or "src") id sums are those of parts that own 0..n-1 once."""
    got = [sum(h[f"{prefix}_{s}"] for h in headers) for s in ("count", "sum", "sq")]
    return (got[0], got[1] % _P, got[2] % _P) == expected_sums(n)


def one_line(error: BaseException) -> str:
    """An error as one line, "TypeName: message": what a failed rank tells its peers."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def could_not(doing: str, failures: Sequence[Optional[str]]) -> str:
    """The line every rank raises when some ranks failed: failures holds, per rank in rank order,
    its error (`one_line`) or None. 'rank 1 of 2 could not {doing}: rank 1: ValueError: ...'."""
    failed = [(r, message) for r, message in enumerate(failures) if message]
    errors = _listed([f"rank {r}: {message}" for r, message in failed])
    return f"{_ranks([r for r, _ in failed])} of {len(failures)} could not {doing}: {errors}"


def raise_failures(failure: Optional[str], group: Optional[Any], doing: str) -> NoReturn:
    """Collectively, once every rank of `group` knows that some rank failed: gather the ranks' errors
    (`one_line`, None where a rank did not fail) and raise the same ValueError (`could_not`) on each."""
    failures: List[Optional[str]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(failures, failure, group=group)
    raise ValueError(could_not(doing, failures))


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _by_value(values: Sequence[str]) -> str:
    """'a on ranks 0, 2 vs b on rank 1' for values [a, b, a]; '' when all are equal."""
    groups: Dict[str, List[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return " vs ".join(f"{value} on {_ranks(ranks)}" for value, ranks in groups.items()) if len(groups) > 1 else ""


def _listed(items: Sequence[str], most: int = 4) -> str:
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return "; ".join(items[:most]) + more


def disagreement(details: Sequence[Dict[str, Any]]) -> str:
    """The one line every rank raises, from each rank's side (`check`): the first of the shards'
    places, the partition, the exchange plan and the tensors that differs between ranks; before all
    of them, the ranks whose own call failed."""
    world = len(details)
    if any(d.get("failure") for d in details):
        return could_not("take part in the halo exchange", [d.get("failure") for d in details])
    wrong = [
        f"rank {r} of {world} holds part {d['part']} of {d['num_parts']}"
        for r, d in enumerate(details)
        if (d["part"], d["num_parts"]) != (r, world)
    ]
    if wrong:
        return f"the shards do not match the ranks of the group: {_listed(wrong)}; pass shards[rank] of {_PARTITION}"
    for key in _SAME:
        what = _by_value([f"{key}={bool(d[key]) if key == 'bipartite' else d[key]}" for d in details])
        if what:
            return f"the ranks hold shards of different graphs: {what}; {_FIX}"
    for prefix, key, n in (
        ("dst", "nodes", details[0]["num_nodes"]),
        ("src", "src_nodes", details[0]["num_src_nodes"]),
    ):
        if not _covers(details, prefix, n):
            counts = ", ".join(str(d[f"{prefix}_count"]) for d in details)
            return (
                f"the ranks' shards come from different partitions: their {key} do not cover the graph's {n} "
                f"once (ranks 0..{world - 1} own {counts}); {_FIX}"
            )
    pairs = []
    for sender, d in enumerate(details):
        for receiver, e in enumerate(details):
            sent, hashed = d["plan"].send_counts[receiver], d["plan"].send_hashes[receiver]
            expected, want = e["plan"].recv_counts[sender], e["plan"].recv_hashes[sender]
            if sent != expected:
                pairs.append(f"rank {sender} sends rank {receiver} {sent} rows, rank {receiver} expects {expected}")
            elif hashed != want:
                pairs.append(f"rank {sender} sends rank {receiver} {sent} rows other than the ones it expects")
    if pairs:
        return f"the ranks' exchange plans differ (shards of different graphs or partitions): {_listed(pairs)}; {_FIX}"
    what = _by_value([f"{d['dtype']} rows {' + '.join(map(str, d['shapes']))}" for d in details])
    if what:
        return (
            f"the ranks exchange different tensors: {what} (dtype and trailing shapes must match: "
            "the same heads and head dims on every rank)"
        )
    return "the ranks' halo exchange headers differ"  # a hash collision the other way round: not seen
