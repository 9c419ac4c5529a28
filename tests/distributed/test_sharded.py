"""Sharded attention on 2 and 4 gloo processes against one process on the whole graph.

Each world size is one spawned run (`cases.run_all`, bounded in time) that every test below reads:
outputs, returned weights and the gradients of q, k, v and every edge term equal to `edge_attention`
on the whole graph (float64 <= 1e-10, float32 <= 1e-5), on window, causal window, random, power-law,
batched-block, bipartite and tiny graphs, with every backend, both clamp modes and METIS; the rows
each exchange sends equal the boundary sources counted from the whole graph; DDP training, the
module on a bipartite shard, `local_shard` and a wrongly assigned shard. A case whose backend or
METIS (pymetis) is missing here is skipped with the reason, and only that case."""

import functools

import pytest
import torch

from ..optional import backend_missing, module_missing, needs_module
from .cases import Case, all_cases
from .spawn import run_ranks

WORLDS = (2, 4)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
METIS_CASE = "power_law-metis-csr-clamp-float64-terms_none"


def missing(case: Case) -> list:
    """Why `case` cannot run here: its backend's or METIS's dependency missing (empty if it can)."""
    reasons = [backend_missing(case.backend), module_missing("pymetis") if case.method == "metis" else None]
    return [r for r in reasons if r is not None]


# a case whose dependency is missing is skipped with the reason and not run by the ranks
CASES = [
    pytest.param(c, marks=pytest.mark.skipif(bool(missing(c)), reason="; ".join(missing(c))), id=c.name)
    for c in all_cases()
]
RUNNABLE = [c.name for c in all_cases() if not missing(c)]


@pytest.fixture(scope="module")
def runs():
    from .cases import run_all

    return {world: run_ranks(functools.partial(run_all, names=RUNNABLE), world, timeout=600) for world in WORLDS}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", CASES)
def test_equal_to_one_process(runs, world, case):
    for rank, result in enumerate(runs[world]):
        r = result["cases"][case.name]
        for name, err in r["errors"].items():
            assert err <= TOLERANCE[case.dtype], f"rank {rank}: {name} differs by {err}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", CASES)
def test_halo_traffic_is_the_boundary_rows(runs, world, case):
    ranks = [result["cases"][case.name] for result in runs[world]]
    for rank, r in enumerate(ranks):
        assert r["halo_matches"], f"rank {rank}: halo ids are not the foreign sources of its in-edges"
        assert r["fwd_rows_received"] == r["halo_size"] == r["expected_halo_size"]
    # every row one rank receives, another sent: forward once, backward its gradient once
    sent = sum(r["fwd_rows_sent"] for r in ranks)
    assert sent == sum(r["expected_halo_size"] for r in ranks)
    assert sum(r["bwd_rows_sent"] for r in ranks) == sent


@pytest.mark.parametrize("world", WORLDS)
def test_cases_cover_what_they_claim(runs, world):
    """Edge cases the equality tests rely on do occur: an empty shard (4 ranks), a rank without
    halo while others have one, isolated destinations on a rank, shards with no halo at all."""
    cases = {name: [res["cases"][name] for res in runs[world]] for name in RUNNABLE}
    tiny = cases["tiny-contiguous-csr-clamp-float64-terms_none"]
    if world == 4:
        assert min(r["nodes"] for r in tiny) == 0
    causal = cases["window_causal-contiguous-csr-clamp-float64-terms_none"]
    assert causal[0]["halo_size"] == 0 and all(r["halo_size"] > 0 for r in causal[1:])
    assert all(r["halo_size"] == 0 for r in cases["aligned_blocks-contiguous-dense-clamp-float64-terms_none"])


@pytest.mark.parametrize("world", WORLDS)
@needs_module("pymetis")
def test_metis_parts_of_a_power_law_graph_all_have_a_halo(runs, world):
    assert all(res["cases"][METIS_CASE]["halo_size"] > 0 for res in runs[world])


@pytest.mark.parametrize("world", WORLDS)
def test_ddp_training_equals_one_process(runs, world):
    for result in runs[world]:
        assert result["training"]["param_err"] <= 1e-10
        assert result["training"]["exchange_calls"] == 3 * 2 * 2  # 3 steps, 2 layers, forward and backward


@pytest.mark.parametrize("world", WORLDS)
def test_module_cross_attention_on_bipartite_shard(runs, world):
    for result in runs[world]:
        assert result["bipartite_module"]["err"] <= 1e-10


@pytest.mark.parametrize("world", WORLDS)
def test_local_shard_equals_partition(runs, world):
    for result in runs[world]:
        assert all(result["local_shard"].values()), result["local_shard"]


@pytest.mark.parametrize("world", WORLDS)
def test_wrong_shard_is_refused_by_every_rank(runs, world):
    for rank, result in enumerate(runs[world]):
        message = result["wrong_shard"]["message"]
        assert message is not None and f"rank {rank} of {world}" in message and "shards[rank]" in message


@pytest.mark.parametrize("world", WORLDS)
def test_exchange_alone_moves_the_halo_rows_and_their_gradients(runs, world):
    results = [result["halo_rows"] for result in runs[world]]
    assert all(r["ids"] and r["grad"] for r in results), results
    assert sum(r["halo_size"] for r in results) > 0
