"""`partition` and `Shard` in one process: every edge lands in one shard, local graphs map back to
the whole graph, send lists match the peers' halos, weights balance, METIS cuts less than id ranges
on a shuffled mesh, and errors name the argument. One part needs no process group."""

import importlib.util
import sys

import pytest
import torch

from sparseattn import EdgeAttention, Graph, edge_attention, graphs
from sparseattn.distributed import HaloExchange, Shard, local_shard, partition, sharded_edge_attention

from .cases import build_graph, power_law

HAS_METIS = importlib.util.find_spec("pymetis") is not None


def shuffled_grid(side: int, seed: int = 0) -> Graph:
    """A side x side 4-neighbour grid with self-loops, node ids in random order."""
    ids = torch.arange(side * side).reshape(side, side)
    pairs = [(ids[:, :-1], ids[:, 1:]), (ids[:-1, :], ids[1:, :])]
    src = torch.cat([torch.cat([a.flatten(), b.flatten()]) for a, b in pairs] + [ids.flatten()])
    dst = torch.cat([torch.cat([b.flatten(), a.flatten()]) for a, b in pairs] + [ids.flatten()])
    perm = torch.randperm(side * side, generator=torch.Generator().manual_seed(seed))
    return Graph(torch.stack([perm[src], perm[dst]]), num_src=side * side, num_dst=side * side)


def global_edges(shard: Shard) -> torch.Tensor:
    """The shard's local edges in global ids."""
    src_ids = torch.cat([shard.src_nodes, shard.halo])
    return torch.stack([src_ids[shard.graph.src], shard.nodes[shard.graph.dst]])


GRAPHS = {
    "window": lambda: build_graph("window", 4),
    "power_law": lambda: power_law(64, 400, seed=2),
    "bipartite": lambda: build_graph("bipartite", 4),
    "tiny": lambda: build_graph("tiny", 4),
    "empty": lambda: Graph(torch.zeros(2, 0, dtype=torch.long), num_src=5, num_dst=5),
}


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("num_parts", [1, 3, 4, 7])
def test_shards_cover_the_graph(name, num_parts):
    g = GRAPHS[name]()
    shards = partition(g, num_parts)
    assert [s.rank for s in shards] == list(range(num_parts))
    # nodes: a disjoint cover, ascending within a shard
    for attr, total in (("nodes", g.num_dst), ("src_nodes", g.num_src)):
        owned = torch.cat([getattr(s, attr) for s in shards])
        assert torch.equal(owned.sort().values, torch.arange(total))
        assert all(bool((getattr(s, attr).diff() > 0).all()) for s in shards)
    # edges: each in exactly one shard, which owns its destination; local ids map back
    edge_ids = torch.cat([s.edge_ids for s in shards])
    assert torch.equal(edge_ids.sort().values, torch.arange(g.num_edges))
    for s in shards:
        assert torch.equal(global_edges(s), g.edge_index[:, s.edge_ids])
        assert s.graph.num_src == s.src_nodes.numel() + s.halo_size and s.graph.num_dst == s.nodes.numel()
        assert not set(s.halo.tolist()) & set(s.src_nodes.tolist())
    # what o sends p is exactly p's halo rows owned by o, in p's order
    for p in shards:
        start = 0
        for o in shards:
            count = p.recv_counts[o.rank]
            assert o.send_counts[p.rank] == count
            begin = sum(o.send_counts[: p.rank])
            sent = o.src_nodes[o.send_index[begin : begin + count]]
            assert torch.equal(sent, p.halo[start : start + count])
            start += count
        assert start == p.halo_size


def test_contiguous_balances_the_weights():
    g = graphs.window(100, 2)
    shards = partition(g, 4)
    assert [s.nodes.numel() for s in shards] == [25, 25, 25, 25]
    assert all(torch.equal(s.nodes, torch.arange(s.nodes[0], s.nodes[0] + s.nodes.numel())) for s in shards)
    weights = torch.zeros(100)
    weights[:20] = 1.0  # all the work in the first 20 nodes: 5 each, the rest on the last rank
    sizes = [s.nodes.numel() for s in partition(g, 4, node_weights=weights)]
    assert sizes[:3] == [5, 5, 5] and sizes[3] == 85


def test_default_weights_follow_in_degree():
    """A hub destination with most of the edges gets a part to itself."""
    n = 40
    src = torch.cat([torch.arange(n), torch.arange(n).repeat(10)])
    dst = torch.cat([torch.arange(n), torch.full((10 * n,), n - 1)])
    shards = partition(Graph(torch.stack([src, dst]), num_src=n, num_dst=n), 2)
    assert shards[1].nodes.tolist() == [n - 1]


@pytest.mark.skipif(not HAS_METIS, reason="pip install pymetis")
def test_metis_cuts_less_than_id_ranges_on_a_shuffled_mesh():
    g = shuffled_grid(24)
    halo = {m: sum(s.halo_size for s in partition(g, 4, method=m)) for m in ("contiguous", "metis")}
    assert halo["metis"] * 4 < halo["contiguous"], halo
    again = partition(g, 4, method="metis")
    assert all(torch.equal(a.nodes, b.nodes) for a, b in zip(partition(g, 4, method="metis"), again))
    sizes = [s.nodes.numel() for s in again]
    assert max(sizes) <= 1.1 * g.num_dst / 4


def test_metis_without_pymetis_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)
    with pytest.raises(ImportError, match="pip install pymetis"):
        partition(graphs.window(10, 1), 2, method="metis")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_parts=0), ValueError, "num_parts must be an int >= 1"),
        (dict(num_parts=True), ValueError, "num_parts"),
        (dict(num_parts=2, method="spectral"), ValueError, "method must be one of 'contiguous', 'metis'"),
        (dict(num_parts=2, node_weights=torch.ones(3)), ValueError, r"node_weights must be a tensor of shape \(10,\)"),
        (dict(num_parts=2, node_weights=-torch.ones(10)), ValueError, "finite and >= 0"),
    ],
)
def test_partition_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        partition(graphs.window(10, 1), **kwargs)


def test_metis_refuses_a_bipartite_graph():
    with pytest.raises(ValueError, match="bipartite.*contiguous"):
        partition(graphs.bipartite(3, 4), 2, method="metis")


def test_a_raw_edge_index_is_accepted_with_its_node_count():
    g = graphs.window(10, 1)
    a, b = partition(g.edge_index, 2, num_nodes=10), partition(g, 2)
    assert all(torch.equal(x.graph.edge_index, y.graph.edge_index) for x, y in zip(a, b))
    c = partition(g.edge_index, 2, num_nodes=(10, 10))
    assert all(torch.equal(x.nodes, y.nodes) and not x.is_bipartite for x, y in zip(c, b))


def test_a_raw_edge_index_without_its_node_count_is_refused():
    with pytest.raises(ValueError, match=r"needs num_nodes= .* or a sparseattn.Graph"):
        partition(graphs.window(10, 1).edge_index, 2)


def test_trailing_isolated_nodes_are_owned():
    """Nodes 8 and 9 have no edge (isolated atoms, padding tokens): a rank owns each."""
    edge_index = graphs.window(8, 1).edge_index
    shards = partition(edge_index, 3, num_nodes=10)
    owned = torch.cat([s.nodes for s in shards])
    assert torch.equal(owned.sort().values, torch.arange(10))
    assert all(s.num_nodes == s.num_src_nodes == 10 for s in shards)


def test_self_attention_whose_last_node_sends_nothing_stays_self_attention():
    """Node 9 receives edges but sends none: still one node set (q, k, v of a node on one rank)."""
    g = graphs.window(10, 2)
    edge_index = g.edge_index[:, g.src != 9]
    shards = partition(edge_index, 2, num_nodes=10)
    assert not any(s.is_bipartite for s in shards)
    assert all(s.src_nodes is s.nodes for s in shards)
    bipartite = partition(edge_index, 2, num_nodes=(9, 10))
    assert all(s.is_bipartite and s.num_src_nodes == 9 for s in bipartite)


def test_an_edge_index_with_a_sparse_size_needs_no_node_count():
    pyg = pytest.importorskip("torch_geometric")
    g = graphs.window(8, 1)
    shards = partition(pyg.EdgeIndex(g.edge_index, sparse_size=(10, 10)), 2)
    assert torch.equal(torch.cat([s.nodes for s in shards]), torch.arange(10))


@pytest.mark.parametrize(
    "graph, num_nodes, match",
    [
        (graphs.window(10, 1), 12, r"num_nodes=12 but the Graph has num_src=10, num_dst=10"),
        (graphs.window(10, 1).edge_index, -1, "num_nodes must be an int >= 0 or a pair"),
        (graphs.window(10, 1).edge_index, (10, 10, 10), "num_nodes must be an int >= 0 or a pair"),
        (graphs.window(10, 1).edge_index, 8, r"edge_index\[0\] holds source id 9, out of range for num_nodes=8"),
        (graphs.window(10, 1).edge_index, (10, 9), r"edge_index\[1\] holds destination id 9, .* num_nodes=\(10, 9\)"),
    ],
)
def test_node_count_errors(graph, num_nodes, match):
    with pytest.raises((ValueError, IndexError), match=match):
        partition(graph, 2, num_nodes=num_nodes)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
def test_one_part_needs_no_process_group(clamp):
    g = power_law(30, 120, seed=0)
    (shard,) = partition(g, 1)
    q, k, v = (torch.randn(30, 2, 4, dtype=torch.float64) for _ in range(3))
    out = sharded_edge_attention(q, k, v, shard, clamp=clamp)
    torch.testing.assert_close(out, edge_attention(q, k, v, g, clamp=clamp), rtol=0, atol=1e-12)
    attn = EdgeAttention(8, 2).double()
    x = torch.randn(30, 8, dtype=torch.float64)
    torch.testing.assert_close(attn(x, shard), attn(x, g), rtol=0, atol=1e-12)
    torch.testing.assert_close(attn(x, HaloExchange(shard)), attn(x, g), rtol=0, atol=1e-12)


def test_several_parts_without_a_process_group_say_so():
    shard = partition(graphs.window(10, 1), 2)[0]
    q = torch.randn(5, 2, 4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        sharded_edge_attention(q, q, q, shard)
    with pytest.raises(RuntimeError, match="init_process_group"):
        local_shard(graphs.window(10, 1).edge_index, ranges=[0, 5, 10])


def test_rows_must_match_the_shard():
    shard = partition(graphs.window(10, 1), 2)[0]
    q = torch.randn(5, 2, 4)
    with pytest.raises(ValueError, match=r"q must have one row per node of the shard \(5\), got 6"):
        sharded_edge_attention(torch.randn(6, 2, 4), q, q, shard)
    with pytest.raises(ValueError, match=r"k and v must have one row per source of the shard \(5\), got 4"):
        sharded_edge_attention(q, q[:4], q[:4], shard)
    with pytest.raises(ValueError, match="not with one"):
        sharded_edge_attention(q, q, q, HaloExchange(shard), group=object())
    with pytest.raises(TypeError, match="Shard"):
        HaloExchange(graphs.window(10, 1))  # type: ignore[arg-type]


def test_module_refuses_what_a_shard_cannot_do():
    shard = partition(graphs.window(10, 1), 1)[0]
    attn = EdgeAttention(8, 2)
    x = torch.randn(10, 8)
    with pytest.raises(ValueError, match="dst_rows= does not apply to attention on a shard"):
        attn(x[:2], shard, dst_rows=torch.tensor([0, 1]))


def test_shard_to_and_repr():
    s = partition(graphs.window(10, 1), 2)[1]
    moved = s.to("cpu")
    assert moved.src_nodes is moved.nodes and torch.equal(moved.halo, s.halo)
    assert repr(s) == "Shard(rank=1/2, nodes=5, edges=14, halo=1, sent=1)"
    b = partition(graphs.random(6, 4, 12), 2)[0]
    assert b.is_bipartite and "bipartite" in repr(b) and b.to("cpu").is_bipartite


def test_a_shard_on_another_device_is_named():
    shard = partition(graphs.window(10, 1), 1)[0]
    q = torch.randn(10, 2, 4, device="meta")  # any device but the shard's
    with pytest.raises(ValueError, match="shard.to"):
        sharded_edge_attention(q, q, q, shard)


def test_int32_and_transposed_edge_index_give_the_same_shards():
    """An edge_index as users hold it: int32, or (E, 2) pairs viewed as (2, E) (not contiguous)."""
    g = power_law(64, 400, seed=2)
    want = partition(g, 3)
    for edge_index in (g.edge_index.int(), g.edge_index.t().contiguous().t()):
        got = partition(edge_index, 3, num_nodes=64)
        for a, b in zip(got, want):
            assert torch.equal(a.graph.edge_index, b.graph.edge_index) and torch.equal(a.halo, b.halo)
            assert torch.equal(a.send_index, b.send_index) and torch.equal(a.edge_ids, b.edge_ids)
