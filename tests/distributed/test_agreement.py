"""Ranks that disagree (dtype, head dim, partition, shard place), or one whose own call is wrong (rows,
a per-edge argument, a keyword), all raise the same one-line ValueError before any row travels, on 2
and 3 gloo processes (a rank that raised alone left its peers waiting in the exchange); before the
header exchange a one-way dtype mismatch returned finite garbage, a head-dim mismatch aborted a
process inside gloo, and shards built from different ranges returned wrong rows or raised IndexError
on one rank while its peers waited. So do a rank whose local_shard arguments are wrong, whose shard
argument is not a shard (or a shard of another number of parts), whose group= comes with an
exchange, or whose named backend is missing there (a RuntimeError): each of those raised alone, or
returned, while its peers waited for the group's timeout; every rank now fails within seconds."""

import dataclasses
import time
from typing import Callable, Dict, Tuple

import pytest
import torch
import torch.distributed as dist

from sparseattn import edge_attention, graphs
from sparseattn.distributed import HaloExchange, agreement, local_shard, partition, sharded_edge_attention
from sparseattn.kernels import get_backend, register_backend

from .spawn import run_ranks

WORLDS = (2, 3)
PROMPT = 30.0  # seconds: a rank that waited for its peers would wait the group's timeout (120 s in spawn.py)


def _attend(shard, dtype=torch.float64, d=4, graph=None) -> float:
    """Sharded attention on a shard (or exchange) of a 12-node graph (default a window): its largest
    error against `edge_attention` on the whole graph."""
    g = graph if graph is not None else graphs.window(12, 2)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 2, d, generator=gen, dtype=torch.float64) for _ in range(3))
    s = shard.shard if isinstance(shard, HaloExchange) else shard
    rows, src = s.nodes, s.src_nodes
    out = sharded_edge_attention(q[rows].to(dtype), k[src].to(dtype), v[src].to(dtype), shard, clamp=None)
    return float((out.double() - edge_attention(q, k, v, g, clamp=None)[rows]).abs().max())


def _dtype(rank: int, world: int) -> float:  # rank 0 sends float32 rows to peers expecting float64
    causal = graphs.window(12, 2, causal=True)  # rows flow to higher ranks only: one way
    return _attend(partition(causal, world)[rank], torch.float32 if rank == 0 else torch.float64, graph=causal)


def _head_dim(rank: int, world: int) -> float:
    return _attend(partition(graphs.window(12, 2), world)[rank], d=5 if rank == world - 1 else 4)


def _ranges(rank: int, world: int) -> float:
    weights = torch.ones(12)
    weights[:4] = 10.0  # the last rank partitions with other weights: other ranges
    shards = partition(graphs.window(12, 2), world, node_weights=weights if rank == world - 1 else None)
    return _attend(shards[rank])


def _local_ranges(rank: int, world: int) -> float:
    ranges = [0, 2, 12] if world == 2 else [0, 2, 6, 12]
    if rank == world - 1:
        ranges = [0, 8, 12] if world == 2 else [0, 4, 8, 12]
    g = graphs.window(12, 2)
    mine = g.edge_index[:, (g.dst >= ranges[rank]) & (g.dst < ranges[rank + 1])]
    return _attend(local_shard(mine, ranges=ranges))


def _graph(rank: int, world: int) -> float:  # same nodes and ranges, other edges: other halos
    return _attend(partition(graphs.window(12, 3 if rank == world - 1 else 2), world)[rank])


def _part(rank: int, world: int) -> float:  # the last rank holds part 0 as well
    return _attend(partition(graphs.window(12, 2), world)[0 if rank == world - 1 else rank])


def _rows(rank: int, world: int) -> float:  # the last rank's q has a row too many: its own error
    shard = partition(graphs.window(12, 2), world)[rank]
    q = torch.zeros(shard.nodes.numel() + (rank == world - 1), 2, 4, dtype=torch.float64)
    k = v = torch.zeros(shard.src_nodes.numel(), 2, 4, dtype=torch.float64)
    return float(sharded_edge_attention(q, k, v, shard).abs().max())


def _exchanged_rows(rank: int, world: int) -> float:  # the same through a HaloExchange called directly
    exchange = HaloExchange(partition(graphs.window(12, 2), world)[rank])
    k = torch.zeros(exchange.shard.src_nodes.numel() - (rank == 0), 2, 4, dtype=torch.float64)
    return float(exchange(k)[0].abs().max())


def _local_arguments(rank: int, world: int) -> float:  # the last rank's bias has rows for no edge count
    shard = partition(graphs.window(12, 2), world)[rank]
    q = torch.zeros(shard.nodes.numel(), 2, 4, dtype=torch.float64)
    k = v = torch.zeros(shard.src_nodes.numel(), 2, 4, dtype=torch.float64)
    bias = torch.zeros(shard.graph.num_edges + (rank == world - 1), 2, dtype=torch.float64)
    return float(sharded_edge_attention(q, k, v, shard, bias=bias).abs().max())


def _keyword(rank: int, world: int) -> float:  # rank 0 misspells clamp
    shard = partition(graphs.window(12, 2), world)[rank]
    q = torch.zeros(shard.nodes.numel(), 2, 4, dtype=torch.float64)
    k = v = torch.zeros(shard.src_nodes.numel(), 2, 4, dtype=torch.float64)
    return float(sharded_edge_attention(q, k, v, shard, **{"clam" if rank == 0 else "clamp": None}).abs().max())


def _zeros(shard) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.zeros(shard.nodes.numel(), 2, 4, dtype=torch.float64)
    k = torch.zeros(shard.src_nodes.numel(), 2, 4, dtype=torch.float64)
    return q, k, k


def _own_edges(rank: int, world: int, ranges=None):
    ranges = ranges or ([0, 6, 12] if world == 2 else [0, 4, 8, 12])
    g = graphs.window(12, 2)
    return g.edge_index[:, (g.dst >= ranges[rank]) & (g.dst < ranges[rank + 1])], ranges


def _local_shard_ranges(rank: int, world: int) -> float:  # the last rank's ranges miss the final offset
    mine, ranges = _own_edges(rank, world)
    return _attend(local_shard(mine, ranges=ranges[:-1] if rank == world - 1 else ranges))


def _local_shard_edges(rank: int, world: int) -> float:  # the last rank passes edges into others' nodes
    mine, ranges = _own_edges(rank, world)
    return _attend(local_shard(graphs.window(12, 2).edge_index if rank == world - 1 else mine, ranges=ranges))


def _not_a_shard(rank: int, world: int) -> float:  # the last rank passes its shard's graph
    shard = partition(graphs.window(12, 2), world)[rank]
    q, k, v = _zeros(shard)
    return float(sharded_edge_attention(q, k, v, shard.graph if rank == world - 1 else shard).abs().max())


def _one_part(rank: int, world: int) -> float:  # the last rank holds the whole graph (it never communicated)
    shard = partition(graphs.window(12, 2), 1 if rank == world - 1 else world)[0 if rank == world - 1 else rank]
    q, k, v = _zeros(shard)
    return float(sharded_edge_attention(q, k, v, shard).abs().max())


def _group_with_exchange(rank: int, world: int) -> float:  # rank 0 passes group= beside an exchange
    shard = partition(graphs.window(12, 2), world)[rank]
    q, k, v = _zeros(shard)
    group = dist.group.WORLD if rank == 0 else None
    return float(sharded_edge_attention(q, k, v, HaloExchange(shard), group=group).abs().max())


def _backend_missing(rank: int, world: int) -> float:  # a backend whose dependency the last rank lacks
    shard = partition(graphs.window(12, 2), world)[rank]
    q, k, v = _zeros(shard)
    probe = (lambda: "its library is not installed here") if rank == world - 1 else (lambda: None)
    register_backend(dataclasses.replace(get_backend("csr", q, shard.graph), name="csr_elsewhere", probe=probe))
    return float(sharded_edge_attention(q, k, v, shard, backend="csr_elsewhere").abs().max())


SCENARIOS: Dict[str, Callable[[int, int], float]] = {
    "rows": _rows,
    "local_arguments": _local_arguments,
    "keyword": _keyword,
    "exchanged_rows": _exchanged_rows,
    "dtype": _dtype,
    "head_dim": _head_dim,
    "ranges": _ranges,
    "local_ranges": _local_ranges,
    "graph": _graph,
    "part": _part,
    "local_shard_ranges": _local_shard_ranges,
    "local_shard_edges": _local_shard_edges,
    "not_a_shard": _not_a_shard,
    "one_part": _one_part,
    "group_with_exchange": _group_with_exchange,
    "backend_missing": _backend_missing,
}


def run(rank: int, world: int) -> dict:
    """Each scenario on this rank: ("raised", type, message, seconds) or ("returned", error against
    the whole graph); then, on the same group, an exchange whose ranks agree, and how often it checks."""
    result: Dict[str, Tuple] = {}
    for name, scenario in SCENARIOS.items():
        start = time.monotonic()
        try:
            result[name] = ("returned", scenario(rank, world))
        except Exception as e:  # noqa: BLE001 - what each rank raised is the result
            result[name] = ("raised", type(e).__name__, str(e), time.monotonic() - start)
    calls = {"n": 0}
    check = agreement.check

    def counted(*args, **kwargs):
        calls["n"] += 1
        check(*args, **kwargs)

    agreement.check = counted
    try:
        shard = partition(graphs.window(12, 2), world)[rank]
        errors = [_attend(shard) for _ in range(2)]  # a Shard: a new exchange, checked, per call
        each, first = HaloExchange(shard), HaloExchange(shard, check_each_call=False)
        errors += [_attend(each) for _ in range(2)] + [_attend(first) for _ in range(3)]
    finally:
        agreement.check = check
    result["agree"] = ("returned", max(errors), calls["n"])
    return result


@pytest.fixture(scope="module")
def runs():
    return {world: run_ranks(run, world, timeout=300) for world in WORLDS}


EXPECTED = {
    "rows": (
        "of {world} could not take part in the halo exchange: rank {last}: ValueError: q must have one row per node",
        {},
    ),
    "local_arguments": (
        "rank {last} of {world} could not take part in the halo exchange: rank {last}: ValueError: bias must have",
        {},
    ),
    "keyword": (
        "rank 0 of {world} could not take part in the halo exchange: rank 0: TypeError: edge_attention() got "
        "unexpected keyword arguments: clam",
        {},
    ),
    "exchanged_rows": (
        "rank 0 of {world} could not take part in the halo exchange: rank 0: ValueError: an exchanged tensor",
        {},
    ),
    # (the phrase, what names the odd rank out) for world 2 and 3
    "dtype": (
        "the ranks exchange different tensors",
        {
            2: "float32 rows (2, 4) + (2, 4) on rank 0 vs float64 rows (2, 4) + (2, 4) on rank 1",
            3: "on rank 0 vs float64 rows (2, 4) + (2, 4) on ranks 1, 2",
        },
    ),
    "head_dim": (
        "the ranks exchange different tensors",
        {
            2: "float64 rows (2, 4) + (2, 4) on rank 0 vs float64 rows (2, 5) + (2, 5) on rank 1",
            3: "(2, 4) + (2, 4) on ranks 0, 1 vs float64 rows (2, 5) + (2, 5) on rank 2",
        },
    ),
    "ranges": ("the ranks' shards come from different partitions: their nodes do not cover the graph's 12 once", {}),
    "local_ranges": ("the ranks' shards come from different partitions: their nodes do not cover", {}),
    "graph": (
        "the ranks' exchange plans differ",
        {2: "rank 0 sends rank 1 2 rows, rank 1 expects 3", 3: "rank 1 sends rank 2 2 rows, rank 2 expects 3"},
    ),
    "part": (
        "the shards do not match the ranks of the group",
        {2: "rank 1 of 2 holds part 0 of 2", 3: "rank 2 of 3 holds part 0 of 3"},
    ),
    "local_shard_ranges": (
        "rank {last} of {world} could not build its shard (local_shard): rank {last}: ValueError: ranges must be "
        "{world_1} non-decreasing offsets from 0",
        {},
    ),
    "local_shard_edges": (
        "rank {last} of {world} could not build its shard (local_shard): rank {last}: ValueError: edge_index[1] "
        "(destinations) names node 0, owned by rank 0, not by this rank ({last})",
        {},
    ),
    "not_a_shard": (
        "rank {last} of {world} could not take part in the halo exchange: rank {last}: TypeError: shard must be a "
        "sparseattn.distributed Shard or HaloExchange, got Graph",
        {},
    ),
    "one_part": (
        "rank {last} of {world} could not take part in the halo exchange: rank {last}: ValueError: the shard is part "
        "0 of 1 but the group has {world} ranks",
        {},
    ),
    "group_with_exchange": (
        "rank 0 of {world} could not take part in the halo exchange: rank 0: ValueError: pass group= to the "
        "HaloExchange, not with one",
        {},
    ),
    "backend_missing": (
        "rank {last} of {world} could not take part in the halo exchange: rank {last}: RuntimeError: backend "
        "'csr_elsewhere' is not available: its library is not installed here",
        {},
    ),
}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_rank_raises_the_same_line(runs, world, name):
    outcomes = [result[name] for result in runs[world]]
    assert all(o[0] == "raised" and o[1] == "ValueError" for o in outcomes), outcomes
    messages = {o[2] for o in outcomes}
    assert len(messages) == 1, messages
    (message,) = messages
    phrase, names = EXPECTED[name]
    phrase = phrase.format(world=world, last=world - 1, world_1=world + 1)
    assert phrase in message and "\n" not in message, message
    assert names.get(world, "") in message, message
    slowest = max(o[3] for o in outcomes)
    assert slowest < PROMPT, f"a rank took {slowest:.0f} s to raise: it waited for its peers"


@pytest.mark.parametrize("world", WORLDS)
def test_the_group_works_after_the_errors_and_checks_as_asked(runs, world):
    for result in runs[world]:
        _, err, checks = result["agree"]
        assert err <= 1e-12
        assert checks == 2 + 2 + 1  # every call of a Shard and of an exchange checking each call; then once


def test_id_sums_of_a_cover_match_the_closed_form(monkeypatch):
    """The ownership fingerprint, also past the modulus (a small prime here, as for graphs of 2^31 nodes)."""
    for prime in (7, agreement._P):
        monkeypatch.setattr(agreement, "_P", prime)
        for n in (0, 1, 6, 7, 8, 20, 50):
            parts = torch.randperm(n).split(3)
            got = [agreement._id_sums(p) for p in parts]
            total = (sum(g[0] for g in got), sum(g[1] for g in got) % prime, sum(g[2] for g in got) % prime)
            assert total == agreement.expected_sums(n)
            if 1 < n <= prime:  # a node owned twice and one by no part: caught (ids below the prime)
                dup = torch.cat([torch.arange(n - 1), torch.tensor([0])])
                assert agreement._id_sums(dup) != agreement.expected_sums(n)
