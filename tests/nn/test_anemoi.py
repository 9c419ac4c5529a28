"""sparseattn.nn.GraphTransformerConv against anemoi's formula written as a PyG MessagePassing
(anemoi-models is not installed here): keys and values plus the edge features, exact softmax over
each destination's in-edges, scale 1/sqrt(C); float64 values and gradients on bipartite graphs."""

import pytest
import torch

from sparseattn import Graph
from sparseattn.nn import GraphTransformerConv

from .helpers import assert_close

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_utils = pytest.importorskip("torch_geometric.utils")

N_SRC, N_DST, H, C = 11, 7, 3, 8


class FormulaConv(pyg_nn.MessagePassing):
    """The operator as anemoi's docs state it, on PyG's softmax and sum aggregation."""

    def __init__(self, out_channels: int):
        super().__init__(aggr="add", node_dim=0)
        self.out_channels = out_channels

    def forward(self, query, key, value, edge_attr, edge_index):
        size = (key.shape[0], query.shape[0])
        return self.propagate(edge_index, size=size, query=query, key=key, value=value, edge_attr=edge_attr)

    def message(self, query_i, key_j, value_j, edge_attr, index, ptr, size_i):
        if edge_attr is not None:
            key_j, value_j = key_j + edge_attr, value_j + edge_attr
        alpha = (query_i * key_j).sum(-1) / self.out_channels**0.5
        alpha = pyg_utils.softmax(alpha, index, ptr, size_i)
        return value_j * alpha.unsqueeze(-1)


def inputs(seed: int, with_edges: bool):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N_SRC, (40,), generator=gen)
    dst = torch.cat([torch.arange(N_DST), torch.randint(0, N_DST, (33,), generator=gen)])  # every dst has one

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    q, k, v = leaf(N_DST, H, C), leaf(N_SRC, H, C), leaf(N_SRC, H, C)
    e = leaf(40, H, C) if with_edges else None
    return torch.stack([src, dst]), q, k, v, e


@pytest.mark.parametrize("with_edges", [True, False])
@pytest.mark.parametrize("as_graph", [True, False])
def test_equals_the_formula_in_values_and_gradients(with_edges, as_graph):
    edge_index, q, k, v, e = inputs(0, with_edges)
    graph = Graph(edge_index, num_src=N_SRC, num_dst=N_DST) if as_graph else edge_index
    ours = GraphTransformerConv(C)(q, k, v, e, graph, size=(N_SRC, N_DST))
    want = FormulaConv(C)(q, k, v, e, edge_index)
    assert_close(ours, want, torch.float64, "anemoi formula", "out")
    leaves = [t for t in (q, k, v, e) if t is not None]
    grad = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(ours, leaves, grad), torch.autograd.grad(want, leaves, grad)):
        assert_close(a, b, torch.float64, "anemoi formula", "grad")


def test_flat_edge_attr_alpha_and_dropout():
    edge_index, q, k, v, e = inputs(1, True)
    layer = GraphTransformerConv(C, dropout=0.5, keep_alpha=True).eval()
    out = layer(q, k, v, e.reshape(-1, H * C), edge_index)  # anemoi's blocks hand (E, H * C)
    assert_close(out, FormulaConv(C)(q, k, v, e, edge_index), torch.float64, "flat edge_attr", "out")
    assert layer.alpha is not None and layer.alpha.shape == (40, H)
    sums = torch.zeros(N_DST, H, dtype=torch.float64).index_add_(0, edge_index[1], layer.alpha.detach())
    assert torch.allclose(sums, torch.ones_like(sums))
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(q, k, v, e, edge_index), out)  # dropout on alpha in training


def test_errors_name_the_argument():
    edge_index, q, k, v, e = inputs(2, True)
    with pytest.raises(ValueError, match="out_channels must be a positive int"):
        GraphTransformerConv(0)
    with pytest.raises(ValueError, match=r"query must be \(N_dst, H, 4\)"):
        GraphTransformerConv(4)(q, k, v, e, edge_index)
    with pytest.raises(ValueError, match=r"size \(3, 7\) disagrees with key \(11 sources\)"):
        GraphTransformerConv(C)(q, k, v, e, edge_index, size=(3, 7))
    with pytest.raises(RuntimeError, match="torch.compile"):
        torch.jit.script(GraphTransformerConv(C))


@pytest.mark.parametrize("factored", [True, False])
def test_edge_attr_by_its_factors_equals_the_projected_edge_attr(factored, monkeypatch):
    """anemoi's blocks hand lin_edge(edge_features); given by its factors (EdgeProjection with
    lin_edge's weight and bias) the layer computes the same, factored (forced here: the test graph
    is "small") or built, values and the gradients of the features and of lin_edge."""
    import sparseattn.kernels.projected as projected
    from sparseattn import EdgeProjection

    monkeypatch.setattr(projected, "factor_edge_projection", lambda *args: factored)
    edge_index, q, k, v, _ = inputs(2, False)
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(40, 5, generator=gen, dtype=torch.float64).requires_grad_()
    lin_edge = torch.nn.Linear(5, H * C).double()
    layer = GraphTransformerConv(C)
    ours = layer(q, k, v, EdgeProjection(features, lin_edge.weight, lin_edge.bias), edge_index)
    want = FormulaConv(C)(q, k, v, lin_edge(features).view(-1, H, C), edge_index)
    assert_close(ours, want, torch.float64, "anemoi formula, edge_attr by its factors", "out")
    leaves = [q, k, v, features, lin_edge.weight, lin_edge.bias]
    grad = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(ours, leaves, grad), torch.autograd.grad(want, leaves, grad)):
        assert_close(a, b, torch.float64, "anemoi formula, edge_attr by its factors", "grad")
