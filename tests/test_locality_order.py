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
