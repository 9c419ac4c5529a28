"""sparseattn.nn.to_hetero against torch_geometric.nn.to_hetero on PyG's own TransformerConv: a
two-node-type graph where one node type receives two edge types (summed or averaged per node type)."""

import pytest
import torch
from torch import nn

import sparseattn.nn as snn

from .helpers import assert_close

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_fx = pytest.importorskip("torch_geometric.nn.fx")
HeteroData = pytest.importorskip("torch_geometric.data").HeteroData


def two_type_graph() -> HeteroData:
    """Node types a (5) and b (3); a receives from b and from a, b from a; a's node 4 gets no edge."""
    gen = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["a"].x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    data["b"].x = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    data["a", "to", "b"].edge_index = torch.tensor([[0, 1, 3, 2], [0, 2, 2, 1]])
    data["b", "to", "a"].edge_index = torch.tensor([[0, 2, 1], [1, 3, 1]])
    data["a", "near", "a"].edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 0, 1]])
    for edge_type in data.edge_types:
        num_edges = data[edge_type].edge_index.shape[1]
        data[edge_type].edge_attr = torch.randn(num_edges, 2, generator=gen, dtype=torch.float64)
    return data


class Net(nn.Module):
    """Two layers of `conv` (PyG's or ours), bipartite-capable (lazy in_channels)."""

    def __init__(self, conv) -> None:
        super().__init__()
        self.conv1 = conv((-1, -1), 3, heads=2, edge_dim=2)  # C + edge_dim < H * C: the shared-row path
        self.conv2 = conv((-1, -1), 4, heads=1)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index)


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_to_hetero_aggregates_per_node_type_as_pyg(aggr):
    """Same state dict keys, same outputs (float64) per node type as PyG's to_hetero on PyG's layer."""
    data = two_type_graph()
    args = (data.x_dict, data.edge_index_dict, data.edge_attr_dict)
    theirs = pyg_nn.to_hetero(Net(pyg_nn.TransformerConv), data.metadata(), aggr=aggr).double()
    ours = snn.to_hetero(Net(snn.TransformerConv), data.metadata(), aggr=aggr).double()
    expected = theirs(*args)  # initializes the lazy widths
    ours(*args)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    got = ours(*args)
    assert sorted(got) == sorted(expected) == ["a", "b"]
    for node_type in expected:
        assert_close(got[node_type], expected[node_type], torch.float64, "to_hetero vs PyG")


def test_pyg_to_hetero_is_left_as_it_was():
    """sparseattn.nn.to_hetero widens PyG's message-passing test for its own call only: PyG's
    to_hetero afterwards still returns sparseattn layers' outputs keyed by edge type (why this
    function exists)."""
    data = two_type_graph()
    before = pyg_fx.is_message_passing_op
    snn.to_hetero(Net(snn.TransformerConv), data.metadata())
    assert pyg_fx.is_message_passing_op is before

    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = snn.TransformerConv((-1, -1), 3)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    out = pyg_nn.to_hetero(One(), data.metadata()).double()(data.x_dict, data.edge_index_dict)
    assert sorted(out) == sorted(data.edge_types)


def test_gnn_explainer_on_an_explainable_hetero_model_gives_pyg_s_masks_per_edge_type():
    """`explainable` after `to_hetero`: PyG's set_hetero_masks reaches each edge type's copy of our
    layer; the masks of every edge type equal those on PyG's to_hetero model (float64)."""
    explain = pytest.importorskip("torch_geometric.explain")
    from torch_geometric.explain.algorithm import GNNExplainer

    class Pick(nn.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, x, edge_index, edge_attr):
            return self.model(x, edge_index, edge_attr)["a"]

    data = two_type_graph()
    torch.manual_seed(0)
    theirs = pyg_nn.to_hetero(Net(pyg_nn.TransformerConv), data.metadata()).double()
    ours = snn.to_hetero(Net(snn.TransformerConv), data.metadata()).double()
    with torch.no_grad():  # lazy widths
        theirs(data.x_dict, data.edge_index_dict, data.edge_attr_dict)
        ours(data.x_dict, data.edge_index_dict, data.edge_attr_dict)
    ours.load_state_dict(theirs.state_dict())
    snn.explainable(ours)
    explanations = []
    for model in (Pick(theirs), Pick(ours)):
        torch.manual_seed(1)
        explainer = explain.Explainer(
            model, algorithm=GNNExplainer(epochs=10), explanation_type="model", edge_mask_type="object",
            model_config=dict(mode="regression", task_level="node", return_type="raw"),
        )  # fmt: skip
        explanations.append(explainer(data.x_dict, data.edge_index_dict, edge_attr=data.edge_attr_dict, index=1))
    for edge_type in data.edge_types:
        expected, got = (e[edge_type].edge_mask for e in explanations)
        assert got.abs().sum() > 0, edge_type
        assert_close(got, expected, torch.float64, f"hetero GNNExplainer {edge_type} vs PyG", "hetero")
