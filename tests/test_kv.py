"""EdgeAttention's reuse features against its plain forward: keys/values projected once (kv=),
incremental decoding with a KVCache (== teacher forcing on the causal graph), selected destination
rows (== full forward, then select), NodeKV updates, and weight hooks / record_attention."""

import pytest
import torch

from sparseattn import EdgeAttention, Graph, KeyValue, KVCache, NodeKV, graphs, record_attention
from sparseattn.kernels import choose_auto
from sparseattn.models import GraphPool, GraphTransformer

D, H = 16, 4


def _attn(**kw):
    torch.manual_seed(0)
    return EdgeAttention(D, H, **kw).double().eval()


def test_projected_kv_equals_passing_the_sources():
    attn = _attn()
    g = graphs.bipartite(7, 5)
    x, memory = torch.randn(5, D, dtype=torch.float64), torch.randn(7, D, dtype=torch.float64)
    kv = attn.project_kv(memory)
    assert kv.k.shape == (7, H, D // H) and kv.v.shape == (7, H, D // H)
    torch.testing.assert_close(attn(x, g, kv=kv), attn(x, g, memory))
    with pytest.raises(ValueError, match="either kv or x_src"):
        attn(x, g, memory, kv=kv)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
def test_kv_cache_decoding_equals_the_causal_forward(clamp):
    attn = _attn(clamp=clamp)
    b, t = 3, 6
    x = torch.randn(b, t, D, dtype=torch.float64)  # sequence-major tokens
    full = attn(x.reshape(b * t, D), graphs.batch([graphs.causal(t)] * b)).reshape(b, t, D)
    cache = KVCache()
    for step in range(t):
        graph = cache.step_graph(b)
        assert graph.num_src == b * (step + 1) and graph.num_dst == b
        out = attn(x[:, step], graph, cache=cache)  # (B, D): each sequence's newest token
        torch.testing.assert_close(out, full[:, step])
    assert cache.length == t


@pytest.mark.parametrize("b, t", [(1, 0), (1, 4), (3, 0), (3, 5), (64, 7)])
def test_step_graph_equals_the_validated_graph_with_from_blocks_blocks(b, t):
    """step_graph is built without validation: its edges are what Graph validates and its blocks
    what graphs.from_blocks records for one (T + 1) x 1 "full" block per sequence."""
    cache = KVCache()
    if t:
        cache.k = cache.v = torch.zeros(b, t, H, D // H)
    g = cache.step_graph(b)
    checked = Graph(torch.stack([torch.arange(b * (t + 1)), torch.arange(b).repeat_interleave(t + 1)]))
    built = graphs.from_blocks([("full", t + 1, 1)] * b)
    for ref in (checked, built):
        assert torch.equal(g.edge_index, ref.edge_index)
        assert (g.num_src, g.num_dst, g.is_sorted_by_dst) == (ref.num_src, ref.num_dst, ref.is_sorted_by_dst)
    assert g.blocks == built.blocks
    assert checked.blocks is None  # too few rows per block for detection; recorded, they take "dense"
    assert choose_auto(torch.zeros(1, 512, 512), g) == "dense"  # with heads wide enough not to be "small"


def test_kv_cache_reorder_keeps_the_chosen_sequences():
    attn = _attn()
    cache = KVCache()
    x = torch.randn(3, 2, D, dtype=torch.float64)
    for step in range(2):
        attn(x[:, step], cache.step_graph(3), cache=cache)
    cache.reorder(torch.tensor([2, 2, 0]))
    kept = KVCache()
    for step in range(2):
        attn(x[[2, 2, 0], step], kept.step_graph(3), cache=kept)
    assert torch.equal(cache.k, kept.k) and torch.equal(cache.v, kept.v)
    with pytest.raises(ValueError, match="dst_rows"):
        attn(x[:, 0], cache.step_graph(3), cache=cache, dst_rows=torch.arange(3))


@pytest.mark.parametrize("backend", ["reference", "csr", "auto"])
def test_selected_rows_equal_full_forward_then_select(backend):
    attn = _attn(backend=backend)
    g = graphs.batch([graphs.complete(5), graphs.window(9, 2)])
    x = torch.randn(g.num_dst, D, dtype=torch.float64)
    full = attn(x, g)
    rows = torch.tensor([0, 3, 6, 13])
    part, weights = attn(x[rows], g, kv=attn.project_kv(x), dst_rows=rows, return_weights=True)
    torch.testing.assert_close(part, full[rows])
    assert weights.shape[0] == int(g.in_degree()[rows].sum())  # only the edges into the rows


def test_node_kv_keeps_the_rows_of_halted_nodes():
    attn = _attn()
    g = graphs.complete(6)
    x0, x1 = torch.randn(6, D, dtype=torch.float64), torch.randn(6, D, dtype=torch.float64)
    store = NodeKV()
    attn(x0, g, cache=store, dst_rows=torch.arange(6))
    rows = torch.tensor([1, 4])
    out = attn(x1[rows], g, cache=store, dst_rows=rows)
    # nodes 1 and 4 read every node's latest keys/values: their own from x1, the others' from x0
    mixed = x0.clone()
    mixed[rows] = x1[rows]
    kv = attn.project_kv(mixed)
    torch.testing.assert_close(store.kv.k, kv.k)
    torch.testing.assert_close(out, attn(x1[rows], g, kv=kv, dst_rows=rows))


def test_weights_hook_sees_the_returned_weights_until_removed():
    attn = _attn()
    g = graphs.causal(5)
    x = torch.randn(5, D, dtype=torch.float64)
    seen = []
    handle = attn.register_weights_hook(lambda module, graph, w: seen.append((module, graph, w)))
    out, w = attn(x, g, return_weights=True)
    assert len(seen) == 1 and seen[0][0] is attn and seen[0][1] is g and torch.equal(seen[0][2], w)
    handle.remove()
    attn(x, g)
    assert len(seen) == 1


def test_record_attention_collects_every_layer_of_a_model():
    torch.manual_seed(0)
    model = GraphTransformer(10, 10, num_layers=2, d_model=16, num_heads=2, d_ff=16, dropout=0.0).eval()
    batch = GraphPool().batch([[3, 4, 5], [6, 7]], [[3, 4], [5, 6, 7]])
    with record_attention(model) as records:
        logits = model(batch).logits
    names = [r.name for r in records]
    assert sorted(names) == sorted(
        [
            "encoder.0.self_attn",
            "encoder.1.self_attn",
            "decoder.0.self_attn",
            "decoder.0.cross_attn",
            "decoder.1.self_attn",
            "decoder.1.cross_attn",
        ]
    )
    for r in records:
        assert isinstance(r.graph, Graph) and not r.weights.requires_grad
        sums = torch.zeros(r.graph.num_dst, r.weights.shape[1]).index_add_(0, r.graph.dst, r.weights)
        torch.testing.assert_close(sums, torch.ones_like(sums))  # normalized per destination
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, logits)  # recording changes nothing
    model(batch)
    assert len(records) == 6  # hooks are gone after the block


def test_dst_rows_must_be_int64_ids_matching_the_inputs():
    attn = _attn()
    g = graphs.complete(4)
    x = torch.randn(4, D, dtype=torch.float64)
    kv = attn.project_kv(x)
    with pytest.raises(TypeError, match="dst_rows"):
        attn(x[:2], g, kv=kv, dst_rows=[0, 1])
    with pytest.raises(ValueError, match="dst_rows has 3 ids but x_dst has 2 rows"):
        attn(x[:2], g, kv=kv, dst_rows=torch.tensor([0, 1, 2]))
    assert isinstance(kv, KeyValue)


@pytest.mark.parametrize("raw", [False, True], ids=["Graph", "raw edge_index"])
def test_dst_rows_out_of_range_or_repeated_are_refused(raw):
    """A negative id once indexed from the end (row -1 = the last destination) and a repeated id
    silently gave one row of x_dst the other's result."""
    attn = _attn()
    g = graphs.complete(4)
    graph = g.edge_index if raw else g
    x = torch.randn(4, D, dtype=torch.float64)
    kv = attn.project_kv(x)
    with pytest.raises(IndexError, match=r"dst_rows contains a negative node id \(-1\)"):
        attn(x[:2], graph, kv=kv, dst_rows=torch.tensor([0, -1]))
    if not raw:  # a raw index has as many destinations as it or dst_rows names
        with pytest.raises(IndexError, match="dst_rows contains node id 4, out of range for 4 nodes"):
            attn(x[:2], graph, kv=kv, dst_rows=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="dst_rows must not repeat a destination"):
        attn(x[:2], graph, kv=kv, dst_rows=torch.tensor([2, 2]))


def test_selected_rows_on_a_raw_edge_index_may_name_destinations_without_edges():
    attn = _attn()
    edge_index = torch.tensor([[0, 1, 2], [0, 0, 1]])  # destinations 0 and 1 have edges, 3 has none
    x = torch.randn(4, D, dtype=torch.float64)
    rows = torch.tensor([1, 3])
    out = attn(x[rows], edge_index, kv=attn.project_kv(x[:3]), dst_rows=rows)
    full = attn(x, Graph(edge_index, num_src=3, num_dst=4), kv=attn.project_kv(x[:3]))
    torch.testing.assert_close(out, full[rows])
