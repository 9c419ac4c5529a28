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


class EdgeNet(torch.nn.Module):
    """Two layers with edge features (edge_dim=3), which PyG's explainers pass through as a keyword."""

    def __init__(self, conv) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(6, 4, heads=2, edge_dim=3), conv(8, 3, edge_dim=3)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


def mask_explanation(model, algorithm, index, **kwargs):
    explainer = pyg_explain.Explainer(
        model, algorithm=algorithm, explanation_type="model", edge_mask_type="object",
        node_mask_type="attributes", model_config=CONFIG,
    )  # fmt: skip
    torch.manual_seed(1)  # GNNExplainer's masks start random
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    explanation = explainer(x, EDGE_INDEX, index=index, **kwargs)
    return explanation, pyg_explain.metric.fidelity(explainer, explanation)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
@pytest.mark.parametrize("edge_attr", [False, True])
@pytest.mark.parametrize("index", [2, None])
def test_gnn_explainer_explains_explainable_layers_as_pyg_s(name, edge_attr, index):
    """GNNExplainer trains its edge and feature masks through the layers' gradients: the same masks
    and fidelity as on PyG's layers, self loops (GAT's) and a repeated edge included."""
    from torch_geometric.explain.algorithm import GNNExplainer

    net = EdgeNet if edge_attr else Net
    torch.manual_seed(0)
    theirs = net(getattr(pyg_nn, name)).double()
    ours = net(getattr(snn, name)).double()
    ours.load_state_dict(theirs.state_dict())
    assert snn.explainable(ours) is ours
    kwargs = {"edge_attr": torch.rand(EDGE_INDEX.shape[1], 3, dtype=torch.float64)} if edge_attr else {}
    expected, expected_fidelity = mask_explanation(theirs, GNNExplainer(epochs=15), index, **kwargs)
    got, got_fidelity = mask_explanation(ours, GNNExplainer(epochs=15), index, **kwargs)
    assert got.edge_mask.abs().sum() > 0
    assert_close(got.edge_mask, expected.edge_mask, torch.float64, "GNNExplainer edge mask vs PyG", "explain")
    assert_close(got.node_mask, expected.node_mask, torch.float64, "GNNExplainer node mask vs PyG", "explain")
    assert got_fidelity == pytest.approx(expected_fidelity, abs=1e-12)


def test_explainable_layers_compute_as_before_outside_an_explanation():
    import pickle

    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    torch.manual_seed(0)
    theirs = Net(pyg_nn.GATConv).double()
    model = Net(snn.GATConv).double()
    model.load_state_dict(theirs.state_dict())
    x = torch.randn(8, 6, dtype=torch.float64)
    before, keys = model(x, EDGE_INDEX), sorted(model.state_dict())
    snn.explainable(snn.explainable(model))  # a second call adds nothing
    assert sum(type(m).__name__ == "ExplainMasks" for m in model.modules()) == 2
    assert sorted(model.state_dict()) == keys
    torch.testing.assert_close(model(x, EDGE_INDEX), before, rtol=0, atol=0)
    mask = torch.rand(EDGE_INDEX.shape[1], dtype=torch.float64)
    for m in (model, theirs):  # PyG's own set_masks, without sigmoid: the messages times mask
        set_masks(m, mask, EDGE_INDEX, apply_sigmoid=False)
    masked = model(x, EDGE_INDEX)
    assert (masked - before).abs().max() > 0.1
    torch.testing.assert_close(masked, theirs(x, EDGE_INDEX), rtol=1e-12, atol=1e-12)
    clear_masks(model)
    torch.testing.assert_close(model(x, EDGE_INDEX), before, rtol=0, atol=0)
    copy = pickle.loads(pickle.dumps(model))
    torch.testing.assert_close(copy(x, EDGE_INDEX), before, rtol=0, atol=0)


def test_gnn_explainer_without_explainable_names_the_edges_it_could_not_reach():
    from torch_geometric.explain.algorithm import GNNExplainer

    with pytest.raises(ValueError, match="Could not compute gradients for edges"):
        mask_explanation(Net(snn.TransformerConv).double(), GNNExplainer(epochs=2), 2)


@pytest.mark.parametrize("name", ["GATConv", "TransformerConv"])
def test_pg_explainer_reads_the_layers_outputs_and_explains_as_on_pyg_s(name):
    """PGExplainer trains on the layers' outputs (PyG's get_embeddings hooks MessagePassing modules:
    the layers relay theirs through `explain_masks`) and masks their edges: PyG's masks."""
    from torch_geometric.explain.algorithm import PGExplainer

    torch.manual_seed(0)
    theirs = Net(getattr(pyg_nn, name)).double()
    ours = snn.explainable(Net(getattr(snn, name)).double())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    masks = []
    for model in (theirs, ours):
        torch.manual_seed(1)
        algorithm = PGExplainer(epochs=3, lr=0.003).double()
        explainer = pyg_explain.Explainer(
            model, algorithm=algorithm, explanation_type="phenomenon", edge_mask_type="object", model_config=CONFIG
        )
        target = model(x, EDGE_INDEX).argmax(-1)
        for epoch in range(3):
            algorithm.train(epoch, model, x, EDGE_INDEX, target=target, index=2)
        masks.append(explainer(x, EDGE_INDEX, target=target, index=2).edge_mask)
    assert masks[1].abs().sum() > 0
    assert_close(masks[1], masks[0], torch.float64, "PGExplainer edge mask vs PyG", "explain")


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
@pytest.mark.parametrize("method", ["IntegratedGradients", "Saliency"])
def test_captum_explainer_attributes_edges_as_on_pyg_s(name, method):
    pytest.importorskip("captum")  # in the test extra
    from torch_geometric.explain.algorithm import CaptumExplainer

    torch.manual_seed(0)
    theirs = Net(getattr(pyg_nn, name)).double()
    ours = snn.explainable(Net(getattr(snn, name)).double())
    ours.load_state_dict(theirs.state_dict())
    expected, _ = mask_explanation(theirs, CaptumExplainer(method), 2)
    got, _ = mask_explanation(ours, CaptumExplainer(method), 2)
    assert got.edge_mask.abs().sum() > 0
    assert_close(got.edge_mask, expected.edge_mask, torch.float64, "Captum edge mask vs PyG", "explain")
    assert_close(got.node_mask, expected.node_mask, torch.float64, "Captum node mask vs PyG", "explain")


def test_gnn_explainer_explains_a_gps_model_as_pyg_s():
    """A graph-level GPSConv model: the explainer masks the local TransformerConv's edges (PyG's
    global attention, an nn.MultiheadAttention, takes no edge mask; ours neither)."""
    from torch_geometric.explain.algorithm import GNNExplainer

    class GPS(torch.nn.Module):
        def __init__(self, lib) -> None:
            super().__init__()
            self.gps = lib.GPSConv(8, lib.TransformerConv(8, 4, heads=2), heads=2, norm=None)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x, edge_index, batch):
            return self.head(self.gps(x, edge_index, batch).sum(0, keepdim=True))

    torch.manual_seed(0)
    theirs = GPS(pyg_nn).double().eval()
    ours = snn.explainable(GPS(snn).double().eval())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    config = dict(mode="regression", task_level="graph", return_type="raw")
    masks = []
    for model in (theirs, ours):
        torch.manual_seed(1)
        explainer = pyg_explain.Explainer(
            model, algorithm=GNNExplainer(epochs=10), explanation_type="model", edge_mask_type="object",
            node_mask_type="attributes", model_config=config,
        )  # fmt: skip
        explanation = explainer(x, EDGE_INDEX, batch=torch.zeros(8, dtype=torch.long))
        masks.append((explanation.edge_mask, explanation.node_mask))
    assert masks[1][0].abs().sum() > 0
    assert_close(masks[1][0], masks[0][0], torch.float64, "GPS edge mask vs PyG", "explain")
    assert_close(masks[1][1], masks[0][1], torch.float64, "GPS node mask vs PyG", "explain")


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_compiled_explainable_layer_masks_edges_as_pyg_s(name):
    """Under torch.compile a GAT layer keeps the graph's own self loops in place (scored -inf) and appends
    its loops after them (`_gat_common.AttentionEdges.dropped`): PyG's edge mask still lands on the
    caller's edges and the appended loops get 1, as PyG's explain_message gives them; outputs and the
    mask's gradient (what GNNExplainer trains) equal PyG's layer's (EDGE_INDEX has a self loop, 3 -> 3;
    aot_eager: the trace is what is tested)."""
    from torch_geometric.explain.algorithm.utils import set_masks

    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(6, 4, heads=2).double()
    ours = snn.explainable(getattr(snn, name)(6, 4, heads=2).double())
    ours.load_state_dict(theirs.state_dict())
    compiled = torch.compile(ours, dynamic=True, backend="aot_eager")
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logits = torch.randn(EDGE_INDEX.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (theirs, compiled):
        mask = torch.nn.Parameter(logits.clone())
        set_masks(model, mask, EDGE_INDEX, apply_sigmoid=True)
        out = model(x, EDGE_INDEX.clone())
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append((out, mask.grad))
    (expected, expected_grad), (got, got_grad) = results
    assert expected_grad.abs().sum() > 0
    if name != "TransformerConv":  # PyG's GAT layers drop the graph's own loop with its mask
        assert expected_grad[11] == 0 and got_grad[11] == 0
    assert_close(got, expected, torch.float64, "compiled explained layer vs PyG", "explain")
    assert_close(got_grad, expected_grad, torch.float64, "compiled explained layer's mask gradient vs PyG", "explain")
