"""graphs.locality_order and graphs.relabel: a permutation that gives a shuffled graph with
structure its locality back, and a relabeled graph on which attention over permuted rows is the
original attention, permuted."""

import pytest
import torch

from sparseattn import Graph, edge_attention, graphs

from .tolerances import assert_close


def grid(side: int) -> torch.Tensor:
    """(2, E) edges of a side x side grid, 4 neighbours each way, ids row by row."""
    ids = torch.arange(side * side).view(side, side)
    pairs = [(ids[:, :-1], ids[:, 1:]), (ids[:-1, :], ids[1:, :])]
    a = torch.cat([p[0].reshape(-1) for p in pairs])
    b = torch.cat([p[1].reshape(-1) for p in pairs])
    return torch.stack([torch.cat([a, b]), torch.cat([b, a])])


def shuffled(edge_index: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[edge_index]


def bandwidth(edge_index: torch.Tensor) -> int:
    return int((edge_index[0] - edge_index[1]).abs().max())


def test_order_is_a_permutation_that_restores_a_shuffled_grids_bandwidth():
    side = 30
    n = side * side
    g = Graph(shuffled(grid(side), n), n, n)
    order = graphs.locality_order(g)
    assert torch.equal(torch.sort(order).values, torch.arange(n))
    assert bandwidth(g.edge_index) > n // 2  # shuffled: neighbours far apart
    assert bandwidth(graphs.relabel(g, order).edge_index) <= 2 * side  # breadth first: within ~2 rows


def test_components_isolated_nodes_and_an_empty_graph_are_numbered():
    edges = torch.tensor([[0, 1, 5, 6], [1, 0, 6, 5]])  # components {0,1}, {5,6}; 2, 3, 4 isolated
    order = graphs.locality_order(Graph(edges, 7, 7))
    assert sorted(order.tolist()) == list(range(7))
    assert graphs.locality_order(Graph(torch.zeros(2, 0, dtype=torch.long), 3, 3)).tolist() == [0, 1, 2]
    assert graphs.locality_order(Graph(torch.zeros(2, 0, dtype=torch.long), 0, 0)).numel() == 0


def test_attention_on_the_relabeled_graph_is_the_original_permuted():
    torch.manual_seed(0)
    n = 64
    g = Graph(shuffled(grid(8), n, seed=3), n, n)
    order = graphs.locality_order(g)
    h = graphs.relabel(g, order)
    q, k, v = (torch.randn(n, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(g.num_edges, 2, dtype=torch.float64)  # per edge: the edge order is kept
    want = edge_attention(q, k, v, g, bias=bias, clamp=None)
    rank = torch.argsort(order)
    got = edge_attention(*(x.index_select(0, order) for x in (q, k, v)), h, bias=bias, clamp=None).index_select(0, rank)
    assert_close(got, want, torch.float64, "relabeled")
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    wants = torch.autograd.grad(want.sum(), (q, k, v))
    for a, b in zip(grads, wants):
        assert_close(a, b, torch.float64, "relabeled grads")


def test_errors_name_the_problem():
    g = Graph(torch.tensor([[0], [1]]), 3, 2)
    with pytest.raises(ValueError, match="one node set"):
        graphs.locality_order(g)
    sq = Graph(torch.tensor([[0], [1]]), 3, 3)
    with pytest.raises(ValueError, match="permutation of the 3 node ids"):
        graphs.relabel(sq, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"order must be an integer tensor of shape \(3,\)"):
        graphs.relabel(sq, torch.tensor([0, 1]))


@pytest.mark.parametrize("backend", ["reference", "csr", "auto"])
@pytest.mark.parametrize("clamp", [None, (-2.0, 2.0)], ids=["exact", "clamp"])
def test_node_order_option_equals_the_call_in_the_given_order(backend, clamp):
    """kernel_options node_order="locality": values, weights (caller's edge order) and every gradient
    equal the plain call, with bias, edge terms, grouped kv heads and dropout (same seed, same mask);
    the order is found once and cached on the Graph; against the independent dense attention too."""
    from .dense import dense_attention

    n = 81
    g = Graph(shuffled(grid(9), n, seed=5), n, n)
    assert graphs.locality_pays(g)  # so the call below permutes
    gen = torch.Generator().manual_seed(0)
    t = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()  # noqa: E731
    q, k, v = t(n, 4, 8), t(n, 2, 8), t(n, 2, 5)
    per_edge = dict(bias=t(g.num_edges, 4), edge_key=t(g.num_edges, 4, 8), edge_value=t(g.num_edges, 1, 5))
    if backend == "auto":
        per_edge = {}  # auto on the plain call may pick a backend without edge terms; keep it comparable
    leaves = (q, k, v, *per_edge.values())
    results = []
    for options in (None, {"node_order": "locality"}):
        torch.manual_seed(7)
        out, w = edge_attention(
            q, k, v, g, clamp=clamp, backend=backend, dropout_p=0.2, return_weights=True, kernel_options=options,
            **per_edge,
        )  # fmt: skip
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum() + (w * w).sum()
        results.append((out, w, torch.autograd.grad(loss, leaves)))
    (out, w, grads), (out_o, w_o, grads_o) = results
    assert_close(out_o, out, torch.float64, "out")
    assert_close(w_o, w, torch.float64, "weights")
    for name, a, b in zip(["q", "k", "v", *per_edge], grads_o, grads):
        assert_close(a, b, torch.float64, f"d{name}")
    assert "locality_view" in g._cache
    order, rank, local = graphs.locality_view(g)
    assert torch.equal(order[rank], torch.arange(n)) and bandwidth(local.edge_index) < bandwidth(g.edge_index)
    if not per_edge:  # the independent dense masked attention (no dropout)
        plain = edge_attention(q, k, v, g, clamp=clamp, backend=backend, kernel_options={"node_order": "locality"})
        want = dense_attention(
            q.detach(),
            k.detach().repeat_interleave(2, 1),
            v.detach().repeat_interleave(2, 1),
            g.edge_index,
            clamp=clamp,
        )
        assert_close(plain.detach(), want, torch.float64, "vs dense")


def test_node_order_gradients_are_gathers_and_differentiate_again():
    """The permutation's backward gathers (no scatter-add) and is itself differentiable: double
    backward through the reordered call equals the plain call's."""
    n = 36
    g = Graph(shuffled(grid(6), n, seed=1), n, n)
    assert graphs.locality_pays(g)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(n, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    outs = []
    for options in (None, {"node_order": "locality"}):
        out = edge_attention(q, k, v, g, clamp=None, backend="reference", kernel_options=options)
        (gq,) = torch.autograd.grad((out * out).sum(), q, create_graph=True)
        outs.append(torch.autograd.grad(gq.square().sum(), (q, k, v)))
    for a, b in zip(*outs):
        assert_close(a, b, torch.float64, "double backward")
    assert torch.autograd.gradcheck(
        lambda q, k, v: edge_attention(q, k, v, g, clamp=None, kernel_options={"node_order": "locality"}),
        (q, k, v),
        fast_mode=True,
    )


def test_node_order_errors_name_the_option():
    with pytest.raises(ValueError, match="node_order must be one of"):
        edge_attention(
            *(torch.randn(3, 1, 2) for _ in range(3)), torch.tensor([[0], [1]]), kernel_options={"node_order": "bfs"}
        )
    x = torch.randn(3, 1, 2)
    with pytest.warns(UserWarning, match="raw edge_index searches for the order in every call"):
        edge_attention(x, x, x, torch.tensor([[0, 1], [1, 2]]), kernel_options={"node_order": "locality"})


def test_node_order_reaches_layers_through_the_default_block():
    """`kernels.kernel_options(node_order="locality")` around a layer's call: the layer's
    edge_attention takes the order (it is found and cached on the graph) and its output equals the
    plain call's."""
    from sparseattn import EdgeAttention
    from sparseattn.kernels import kernel_options

    n = 49
    g = Graph(shuffled(grid(7), n, seed=2), n, n)
    torch.manual_seed(0)
    layer = EdgeAttention(16, 2).double()
    x = torch.randn(n, 16, dtype=torch.float64)
    want = layer(x, g)
    assert "locality_view" not in g._cache
    with kernel_options(node_order="locality"):
        got = layer(x, g)
    assert "locality_view" in g._cache and graphs.locality_pays(g)  # the call permuted
    assert_close(got, want, torch.float64, "layer")


def test_node_order_runs_calls_over_two_node_sets_plainly(monkeypatch):
    """Cross attention and a KV cache's keys (num_src != num_dst): one permutation cannot order two node
    sets, so such calls run plainly, and a whole model (the README's GraphTransformer, EdgeAttention
    decoding with a KVCache) runs under the option and equals its plain run."""
    import sparseattn.kernels.auto as auto
    from sparseattn import EdgeAttention, KVCache
    from sparseattn.kernels import kernel_options
    from sparseattn.models import GraphPool, GraphTransformer

    torch.manual_seed(0)
    model = GraphTransformer(12, 12, num_layers=1, d_model=16, num_heads=2, d_ff=16).double().eval()
    batch = GraphPool().batch([[3, 4, 5, 6], [7, 8]], [[3, 4, 5], [6, 7, 8, 9]], bos=1, eos=2)
    want = model(batch).logits
    calls = []
    monkeypatch.setattr(auto, "locality_pays", lambda g: calls.append(g) or False)
    with kernel_options(node_order="locality"):
        got = model(batch).logits
    assert calls and all(g.num_src == g.num_dst for g in calls)  # self-attention asked; cross attention did not
    assert_close(got, want, torch.float64, "GraphTransformer")

    attn = EdgeAttention(16, 2).double()
    steps = [torch.randn(2, 16, dtype=torch.float64) for _ in range(3)]

    def decode():
        cache = KVCache()
        return torch.cat([attn(x, cache.step_graph(2), cache=cache) for x in steps])

    want = decode()
    with kernel_options(node_order="locality"):
        got = decode()
    assert_close(got, want, torch.float64, "KV cache")


def test_node_order_permutes_only_where_the_order_brings_sources_nearer(monkeypatch):
    """`graphs.locality_pays`: a shuffled grid's sources come ~3x nearer in locality order; a grid in
    row order, a window and a random graph gain nothing (already local, or no order helps). There
    the option runs the plain call: no permutation, the same values."""
    import sparseattn.functional as functional

    n = 900
    assert graphs.locality_pays(Graph(shuffled(grid(30), n), n, n))
    plain = {
        "grid in row order": Graph(grid(30), n, n),
        "window": graphs.window(n, 4),
        "random": graphs.random(n, n, 8 * n, seed=0),
    }

    def no_permutation(*args):
        raise AssertionError("permuted a graph the order does not help")

    monkeypatch.setattr(functional, "permute_rows", no_permutation)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    for name, g in plain.items():
        assert not graphs.locality_pays(g), name
        got = edge_attention(q, k, v, g, clamp=None, kernel_options={"node_order": "locality"})
        assert_close(got, edge_attention(q, k, v, g, clamp=None), torch.float64, name)
