import pytest
import torch

from sparseattn import Graph, edge_attention, graphs
from sparseattn.functional import as_graph
from sparseattn.graphs import Block


def edge_set(g):
    return set(map(tuple, g.edge_index.t().tolist()))


@pytest.mark.parametrize("n", [0, 1, 4])
def test_complete_and_causal(n):
    assert edge_set(graphs.complete(n)) == {(s, t) for s in range(n) for t in range(n)}
    assert edge_set(graphs.complete(n, self_loops=False)) == {(s, t) for s in range(n) for t in range(n) if s != t}
    assert edge_set(graphs.causal(n)) == {(s, t) for s in range(n) for t in range(n) if s <= t}
    assert edge_set(graphs.causal(n, self_loops=False)) == {(s, t) for s in range(n) for t in range(n) if s < t}


def test_bipartite_window_random():
    g = graphs.bipartite(7, 5)
    assert (g.num_src, g.num_dst, g.num_edges) == (7, 5, 35)
    w = graphs.window(10, 2)
    assert edge_set(w) == {(s, t) for s in range(10) for t in range(10) if abs(s - t) <= 2}
    wc = graphs.window(10, 2, causal=True)
    assert edge_set(wc) == {(s, t) for s in range(10) for t in range(10) if 0 <= t - s <= 2}
    r1, r2 = graphs.random(50, 40, 300, seed=3), graphs.random(50, 40, 300, seed=3)
    assert torch.equal(r1.edge_index, r2.edge_index) and r1.num_edges == 300
    assert not torch.equal(r1.edge_index, graphs.random(50, 40, 300, seed=4).edge_index)


@pytest.mark.parametrize(
    "g", [graphs.complete(5), graphs.causal(4), graphs.window(9, 2), graphs.random(6, 8, 30), graphs.bipartite(3, 4)]
)
def test_builders_are_destination_major_with_valid_blocks(g):
    """Builders promise destination-major order; recorded blocks must describe the edges exactly."""
    ei = g.edge_index
    key = ei[1] * g.num_src + ei[0]
    assert g.is_sorted_by_dst and torch.equal(key, torch.sort(key).values)
    for b in g.blocks or ():
        local = graphs.block_edges(b.kind, b.n_src, b.n_dst)
        got = ei[:, b.edge_start : b.edge_start + b.num_edges]
        assert torch.equal(got, local + torch.tensor([[b.src_start], [b.dst_start]]))


def test_batch_offsets_blocks_and_split():
    parts = [graphs.complete(3), graphs.causal(2), graphs.bipartite(4, 1)]
    g = graphs.batch(parts)
    assert (g.num_src, g.num_dst, g.num_edges, g.num_graphs) == (9, 6, 9 + 3 + 4, 3)
    assert g.src_ptr == (0, 3, 5, 9) and g.dst_ptr == (0, 3, 5, 6)
    assert [b.kind for b in g.blocks] == ["full", "causal", "full"]
    assert [b.edge_start for b in g.blocks] == [0, 9, 12]
    assert [x.shape[0] for x in g.split_dst(torch.zeros(6))] == [3, 2, 1]
    # a graph without blocks drops the block structure
    assert graphs.batch([graphs.complete(2), graphs.window(5, 1)]).blocks is None
    assert graphs.batch([]).num_edges == 0


def test_csr_and_csc_are_consistent_with_the_edges():
    ei = torch.tensor([[2, 0, 1, 2, 0], [1, 1, 0, 1, 2]])
    g = Graph(ei, num_src=3, num_dst=4)
    ptr, col, perm = g.csr()
    assert ptr.tolist() == [0, 1, 4, 5, 5]
    assert torch.equal(col, ei[0, perm]) and torch.equal(ei[1, perm], torch.tensor([0, 1, 1, 1, 2]))
    assert g.in_degree().tolist() == [1, 3, 1, 0]
    cptr, row, cperm = g.csc()
    assert cptr.tolist() == [0, 2, 3, 5]
    assert torch.equal(row, ei[1, cperm]) and torch.equal(ei[0, cperm], torch.tensor([0, 0, 1, 2, 2]))
    assert g.csr() is g.csr()  # cached


@pytest.mark.parametrize("presorted", [True, False])
def test_csc_orders_by_source_then_destination_and_keeps_duplicates_stable(presorted):
    """csc sorts by source alone when the edges come destination-major (a stable sort keeps each
    source's destinations in order), by the (source, destination) key otherwise: same result."""
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 7, (2, 60), generator=gen)
    key = ei[1] * 7 + ei[0]
    if presorted:
        ei = ei[:, torch.argsort(key, stable=True)]
    g = Graph(ei, num_src=7, num_dst=7)
    assert g.is_sorted_by_dst == presorted
    cptr, row, cperm = g.csc()
    want = torch.argsort(ei[0] * 7 + ei[1], stable=True)  # (source, destination), ties in edge order
    assert torch.equal(cperm, want) and torch.equal(row, ei[1, want])
    assert cptr.tolist() == [0, *torch.cumsum(torch.bincount(ei[0], minlength=7), 0).tolist()]


def test_subgraphs():
    g = graphs.complete(4)
    mask = torch.tensor([True, False, True, False])
    sub = g.dst_subgraph(mask)
    assert (sub.num_src, sub.num_dst) == (4, 4)
    assert set(sub.dst.tolist()) == {0, 2} and sub.num_edges == 8
    assert sub.in_degree().tolist() == [4, 0, 4, 0]
    e = g.edge_subgraph(g.src == 1)
    assert e.num_edges == 4 and (e.src == 1).all()


def test_graph_defaults_and_to():
    g = Graph(torch.tensor([[0, 3], [1, 1]]))
    assert (g.num_src, g.num_dst) == (4, 2)
    g.csr()
    assert g.to("cpu") is g
    gm = g.to("meta")
    assert gm.device.type == "meta" and gm.num_edges == 2 and gm.csr().ptr.device.type == "meta"
    assert "num_edges=2" in repr(g)


@pytest.mark.parametrize(
    "spec",
    [
        [("full", 5, 4), ("causal", 6, 6), ("full", 7, 7)],
        [("causal", 8, 8)] * 3,
        [("full", 1, 4), ("full", 3, 5)],  # one-source rows: equal ranges, a full block
    ],
)
def test_raw_destination_major_blocks_are_recognized(spec):
    built = graphs.from_blocks(spec)
    raw = Graph(built.edge_index)
    assert raw.is_sorted_by_dst and raw.blocks == built.blocks


class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _ops_of(fn) -> int:
    with _OpCounter() as counter:
        fn()
    return counter.ops


def test_from_blocks_equals_its_blocks_batched_one_by_one():
    """Every kind, empty and one-node blocks, rectangular full blocks: the edges, blocks and node
    offsets of `batch` over one graph per block."""
    gen = torch.Generator().manual_seed(0)
    kinds = ("full", "full_no_self", "causal", "causal_no_self")
    for _ in range(50):
        spec = []
        for _ in range(int(torch.randint(0, 7, (1,), generator=gen))):
            kind, n, m = (
                kinds[int(torch.randint(0, 4, (1,), generator=gen))],
                *torch.randint(0, 6, (2,), generator=gen).tolist(),
            )
            spec.append((kind, m if kind == "full" else n, n))
        built = graphs.from_blocks(spec)
        one_by_one = graphs.batch([graphs.from_blocks([s]) for s in spec])
        assert torch.equal(built.edge_index, one_by_one.edge_index), spec
        assert built.blocks == one_by_one.blocks and built.is_sorted_by_dst, spec
        assert (built.src_ptr, built.dst_ptr) == (one_by_one.src_ptr, one_by_one.dst_ptr), spec


def test_from_blocks_runs_as_many_tensor_ops_for_64_blocks_as_for_2():
    """A batch of many small graphs (`nn.complete_per_graph`) costs no tensor work per graph (before:
    a few ops per block and a concatenation)."""
    few = _ops_of(lambda: graphs.from_blocks([("full", 5, 5), ("full_no_self", 7, 7)]))
    many = _ops_of(
        lambda: graphs.from_blocks(
            [("full", 5 + i % 9, 5 + i % 9) if i % 2 else ("full_no_self", 6, 6) for i in range(64)]
        )
    )
    assert many == few


def test_blocks_are_not_claimed_where_edges_do_not_decompose():
    g = graphs.from_blocks([("full", 6, 6)] * 2)
    assert Graph(g.edge_index.flip(1)).blocks is None  # not destination-major: no detection
    assert not Graph(g.edge_index.flip(1)).is_sorted_by_dst
    dup = torch.cat([g.edge_index[:, :1], g.edge_index], 1)
    assert Graph(dup).is_sorted_by_dst and Graph(dup).blocks is None  # a duplicate edge
    holes = g.edge_index[:, torch.arange(g.num_edges) != 3]  # destination 0 misses source 3
    assert Graph(holes).blocks is None
    assert Graph(graphs.window(40, 2).edge_index).blocks is None  # one-row runs: not worth a block
    mixed = graphs.from_blocks([("causal", 4, 4)]).edge_index  # rows [0,0] [0,1] [0,2] [0,3], then [0,3] again
    mixed = torch.cat([mixed, torch.tensor([[0, 1, 2, 3], [4, 4, 4, 4]])], 1)
    assert Graph(mixed).blocks is None


def test_raw_tensor_takes_dense_and_matches_reference():
    from sparseattn.kernels import choose_auto

    g = graphs.from_blocks([("full", 6, 5), ("causal", 7, 7)])
    q = torch.randn(g.num_dst, 2, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(g.num_src, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    wide = torch.zeros(1, 64, 64)  # heads wide enough not to be "small": the blocks are found in the raw index
    assert choose_auto(wide, Graph(g.edge_index)) == "dense"
    from sparseattn import edge_attention

    out = edge_attention(q, k, v, g.edge_index)
    ref = edge_attention(q, k, v, g, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12)
    ga, gb = (torch.autograd.grad(o.sum(), (q, k, v)) for o in (out, ref))
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(ga, gb))


def test_sortedness_check_sees_steps_across_its_chunks(monkeypatch):
    """Graph checks destination-major order in chunks of edges; a step down (or a duplicate)
    exactly at a chunk boundary must still be seen."""
    from sparseattn.graphs import structure

    monkeypatch.setattr(structure, "_CHUNK", 5)
    ei = graphs.from_blocks([("full", 4, 4)] * 2).edge_index  # destination-major, no duplicates: 32 edges
    assert Graph(ei).is_sorted_by_dst and Graph(ei).blocks is not None
    for boundary in (5, 10, 15, 30):
        swapped = ei.clone()
        swapped[:, [boundary - 1, boundary]] = ei[:, [boundary, boundary - 1]]
        assert not Graph(swapped).is_sorted_by_dst
        duplicated = ei.clone()
        duplicated[:, boundary] = ei[:, boundary - 1]
        g = Graph(duplicated, num_src=8, num_dst=8)
        assert g.is_sorted_by_dst and g.blocks is None  # sorted, but duplicates rule out blocks


@pytest.mark.parametrize("validate", [True, False])
def test_from_row_pointers_equals_the_validated_graph(validate):
    """Rows given as CSR build the graph a validated edge_index does: edges, counts, order and
    blocks (two full blocks of 4 rows, then a causal one; a row without sources in between)."""
    rows = [[0, 1, 2]] * 4 + [[]] + [[3, 4]] * 4 + [[5], [5, 6], [5, 6, 7], [5, 6, 7, 8]]
    ptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    src = torch.tensor([s for r in rows for s in r])
    g = graphs.from_row_pointers(ptr, src, num_src=9, validate=validate)
    dst = torch.arange(len(rows)).repeat_interleave(ptr.diff())
    ref = Graph(torch.stack([src, dst]), num_src=9, num_dst=len(rows))
    assert torch.equal(g.edge_index, ref.edge_index)
    assert (g.num_src, g.num_dst, g.is_sorted_by_dst) == (ref.num_src, ref.num_dst, True)
    assert g.blocks == ref.blocks and [b.kind for b in g.blocks] == ["full", "full", "causal"]
    assert torch.equal(g.in_degree(), ref.in_degree()) and torch.equal(g.csr().idx, ref.csr().idx)


def test_from_row_pointers_names_bad_arguments():
    src = torch.tensor([0, 1, 1])
    with pytest.raises(ValueError, match="ptr must start at 0 and end at E = 3"):
        graphs.from_row_pointers(torch.tensor([0, 2]), src, num_src=2)
    with pytest.raises(ValueError, match="non-decreasing"):
        graphs.from_row_pointers(torch.tensor([0, 2, 1, 3]), src, num_src=2)
    with pytest.raises(ValueError, match="1-D integer tensor of row pointers"):
        graphs.from_row_pointers(torch.tensor([0.0, 3.0]), src, num_src=2)
    with pytest.raises(IndexError, match="out of range for 1 nodes"):
        graphs.from_row_pointers(torch.tensor([0, 3]), src, num_src=1)


# ---- ownership, copies, pickles, saves -------------------------------------------------------------
def _same_graph(a, b):
    assert torch.equal(a.edge_index, b.edge_index) and (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
    assert a.blocks == b.blocks and a.src_ptr == b.src_ptr and a.dst_ptr == b.dst_ptr
    assert a.is_sorted_by_dst == b.is_sorted_by_dst and repr(a) == repr(b)


def test_graph_owns_a_contiguous_copy_of_its_index():
    pairs = graphs.window(6, 1).edge_index.t().contiguous()
    g = Graph(pairs.t())  # a strided (2, E) view
    assert g.edge_index.is_contiguous() and g.edge_index.dtype == torch.long
    assert g.edge_index.data_ptr() != pairs.data_ptr()
    assert g.csr().idx.is_contiguous() and g.csc().idx.is_contiguous()
    pairs.zero_()
    assert torch.equal(g.edge_index, graphs.window(6, 1).edge_index)


GRAPHS = {
    "raw destination-major": lambda: Graph(graphs.from_blocks([("full", 3, 3), ("causal", 4, 4)]).edge_index),
    "batch of blocks": lambda: graphs.from_blocks([("full", 3, 2), ("causal_no_self", 4, 4)]),
    "unsorted with duplicates": lambda: Graph(torch.tensor([[3, 0, 0, 2], [1, 1, 1, 0]]), num_src=5, num_dst=3),
    "empty": lambda: Graph(torch.empty(2, 0, dtype=torch.long), num_src=2, num_dst=0),
}


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("how", ["deepcopy", "copy", "pickle", "torch.save weights_only"])
def test_copies_pickles_and_saves_keep_the_graph(name, how, tmp_path):
    """A copy drops the cached structure and rebuilds it; blocks (recorded or still to be found)
    and batch offsets survive. Once `_UNKNOWN`, an object() sentinel, was copied into a new
    object and `blocks`/`repr` raised TypeError."""
    import copy
    import pickle

    g = GRAPHS[name]()
    g.csr()  # cached structure must not travel
    if how == "deepcopy":
        c = copy.deepcopy(g)
    elif how == "copy":
        c = copy.copy(g)
    elif how == "pickle":
        c = pickle.loads(pickle.dumps(g))
    else:
        torch.save({"graph": g}, tmp_path / "g.pt")
        c = torch.load(tmp_path / "g.pt", weights_only=True)["graph"]
    _same_graph(c, g)
    assert torch.equal(c.csr().idx, g.csr().idx) and torch.equal(c.csc().perm, g.csc().perm)


class _GraphSet(torch.utils.data.Dataset):
    """Graph i: a batch of two blocks whose sizes depend on i, built as a batch or from its raw
    index (module level: workers unpickle it)."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        if i % 2:  # blocks still to be found (the sentinel that once failed to pickle)
            return Graph(graphs.from_blocks([("full", i + 1, i + 2), ("causal", 3, 3)]).edge_index)
        return graphs.from_blocks([("full", i + 1, i + 2), ("causal", 3, 3)])


def test_dataloader_workers_send_graphs():
    got = list(torch.utils.data.DataLoader(_GraphSet(), batch_size=None, num_workers=1))
    assert len(got) == 3
    for i, g in enumerate(got):
        _same_graph(g, _GraphSet()[i])


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda s: s.update(edge_index=torch.tensor([[0, 9], [0, 1]])), "out of range"),
        (lambda s: s.update(edge_index=torch.tensor([[0.0], [1.0]])), "integer dtype"),
        (lambda s: s.update(num_src=-1), "num_src"),
        (lambda s: s.update(blocks=[("full", 0, 0, 9, 9, 0)]), "reaches outside"),
        (lambda s: s.update(blocks=[("weird", 0, 0, 1, 1, 0)]), "is not"),
        (lambda s: s.update(dst_ptr=[0, 7]), "dst_ptr"),
        (lambda s: s.clear(), "not the state"),
    ],
)
def test_a_corrupted_saved_graph_is_refused(edit, match, tmp_path):
    state = graphs.from_blocks([("full", 2, 2)]).__getstate__()
    edit(state)
    g = Graph.__new__(Graph)
    with pytest.raises((ValueError, TypeError, IndexError), match=match):
        g.__setstate__(state)


@pytest.mark.parametrize("num_src", [2**40, 2**62, 2**63 - 1])
def test_huge_node_counts_sort_without_overflow(num_src):
    """The (destination, source) sort key dst * num_src + src overflowed int64: with num_src =
    2**63 - 1 an unsorted index was taken as sorted and csr paired destination 0 with source 3."""
    ei = torch.tensor([[0, 3, 1], [0, 1, 2]])
    g = Graph(ei, num_src=num_src)
    assert g.is_sorted_by_dst
    assert torch.equal(g.csr().idx, torch.tensor([0, 3, 1])) and torch.equal(g.csr().ptr, torch.tensor([0, 1, 2, 3]))
    unsorted = Graph(torch.tensor([[5, 3, 1, 2], [1, 0, 1, 0]]), num_src=num_src)
    assert not unsorted.is_sorted_by_dst
    assert torch.equal(unsorted.csr().idx, torch.tensor([2, 3, 1, 5]))
    assert torch.equal(unsorted.csr().perm, torch.tensor([3, 1, 2, 0]))


@pytest.mark.parametrize("bad", [2**63, -1, 2.0, True])
def test_node_counts_must_fit_int64(bad):
    with pytest.raises(ValueError, match=r"num_src must be a non-negative int below 2\*\*63"):
        Graph(torch.tensor([[0], [0]]), num_src=bad)


def test_to_names_its_argument():
    g = graphs.window(4, 1)
    with pytest.raises(TypeError, match=r"Graph.to takes a device .* got torch.float64") as info:
        g.to(torch.float64)
    assert "\n" not in str(info.value)


# ---- what library code builds graphs with ---------------------------------------------------------
def test_borrowed_validates_and_keeps_the_callers_index():
    ei = graphs.window(6, 1).edge_index.clone()
    g = Graph.borrowed(ei, num_src=6, num_dst=6)
    assert g.edge_index.data_ptr() == ei.data_ptr() and not g.one_call  # not copied
    assert g.is_sorted_by_dst and g.blocks == Graph(ei).blocks  # validated and examined as Graph(...) is
    assert Graph.borrowed(ei, 6, 6, one_call=True).one_call
    with pytest.raises(IndexError, match="edge_index.0. .sources. contains node id 5, out of range for 5 nodes"):
        Graph.borrowed(ei, num_src=5, num_dst=6)


def test_unchecked_takes_the_index_and_its_description_as_given():
    ei = torch.tensor([[0, 1, 2], [0, 0, 1]])
    block = Block("full", 0, 0, 2, 1, 0)
    ptr = torch.tensor([0, 2, 3])
    g = Graph.unchecked(ei, 3, 2, blocks=[block], src_ptr=[0, 2, 3], dst_ptr=[0, 1, 2], sorted_by_dst=True, row_ptr=ptr)
    assert g.edge_index is ei and g.blocks == (block,) and g.num_graphs == 2 and g.src_ptr == (0, 2, 3)
    assert g.is_sorted_by_dst and not g.one_call and torch.equal(g.in_degree(), torch.tensor([2, 1]))
    assert Graph.unchecked(torch.tensor([[7], [0]]), 3, 1).num_edges == 1  # no check: the caller vouches


def test_for_one_call_marks_a_new_graph_sharing_the_structure():
    g = graphs.from_blocks([("full", 3, 3), ("causal", 2, 2)])
    csr = g.csr()
    once = g.for_one_call()
    assert once.one_call and not g.one_call and once is not g and once.for_one_call() is once
    assert once.edge_index is g.edge_index and once.csr() is csr and once.blocks == g.blocks
    q = torch.randn(5, 2, 4, dtype=torch.float64)
    torch.testing.assert_close(edge_attention(q, q, q, once), edge_attention(q, q, q, g), rtol=0, atol=0)


def test_edge_attention_wraps_a_raw_index_as_a_one_call_graph():
    ei = graphs.window(5, 1).edge_index
    assert as_graph(ei, num_src=5, num_dst=5).one_call
    g = Graph(ei)
    assert as_graph(g, num_src=5, num_dst=5) is g and not g.one_call
