"""sparseattn.nn.attention_explainer on our layers against PyG's AttentionExplainer on PyG's layers
(float64, same parameters): equal edge masks, graph- and node-level; PyG's own explainer finds no
attention in our layers (it looks for MessagePassing), which is why the function exists."""

import pytest
import torch

import sparseattn.nn as snn

from .helpers import assert_close

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_explain = pytest.importorskip("torch_geometric.explain")
AttentionExplainer = pytest.importorskip("torch_geometric.explain.algorithm").AttentionExplainer

CONFIG = dict(mode="multiclass_classification", task_level="node", return_type="raw")
# 8 nodes, 14 edges: one self loop (3 -> 3), a repeated edge (0 -> 1), node 7 receives nothing
EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 3, 5, 0], [1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 1, 3, 1, 1]])


class Net(torch.nn.Module):
    def __init__(self, conv, want_weights=None) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(6, 4, heads=2), conv(8, 3)
        self.want_weights = want_weights

    def forward(self, x, edge_index):
        h = self.conv1(x, edge_index).relu()
        if self.want_weights is None:
            return self.conv2(h, edge_index)
        out, (_, alpha) = self.conv2(h, edge_index, return_attention_weights=True)
        assert alpha.shape[1] == 1
        return out


def explain(model, algorithm, index):
    explainer = pyg_explain.Explainer(
        model, algorithm=algorithm, explanation_type="model", edge_mask_type="object", model_config=CONFIG
    )
    return explainer(
        torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), EDGE_INDEX, index=index
    )


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
@pytest.mark.parametrize("index", [None, 2])
@pytest.mark.parametrize("want_weights", [None, True])
def test_attention_explainer_equals_pyg(name, index, want_weights):
    torch.manual_seed(0)
    theirs = Net(getattr(pyg_nn, name), want_weights).double()
    ours = Net(getattr(snn, name), want_weights).double()
    ours.load_state_dict(theirs.state_dict())
    for reduce in ("max", "mean"):
        expected = explain(theirs, AttentionExplainer(reduce=reduce), index).edge_mask
        got = explain(ours, snn.attention_explainer(reduce=reduce), index).edge_mask
        assert_close(got, expected, torch.float64, "attention explainer vs PyG", "explain")


def test_pyg_attention_explainer_finds_no_attention_in_our_layers():
    """PyG's explainers select layers by isinstance(module, MessagePassing)."""
    model = Net(snn.GATConv).double()
    with pytest.raises(ValueError, match="Could not collect any attention coefficients"):
        explain(model, AttentionExplainer(), None)
