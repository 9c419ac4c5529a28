"""The forward API of GATConv, GATv2Conv and TransformerConv against PyG's own layers (float64):
GATConv's `size` argument (4th, before return_attention_weights), what None / False / True for
return_attention_weights return, GATConv's (x_src, None), a torch.sparse adj_t answered with sparse
weights, TransformerConv's `_alpha`, and edge_dim=-1 (a lazy lin_edge)."""

import pytest
import torch

import sparseattn.nn as snn

from .helpers import assert_close

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_utils = pytest.importorskip("torch_geometric.utils")

N_SRC, N_DST, C = 5, 3, 4
# sources 0..4 into destinations 0..2: 1 -> 1 is a self loop, destination 2 has no in-edge
EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 1], [0, 0, 1, 1, 0, 1]])
LAYERS = ["GATConv", "GATv2Conv", "TransformerConv"]


def pair(name: str, in_channels, **options):
    """PyG's layer and ours with PyG's parameters, in float64."""
    theirs = getattr(pyg_nn, name)(in_channels, C, **options).double()
    ours = getattr(snn, name)(in_channels, C, **options).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def features(rows: int, width: int = 6) -> torch.Tensor:
    return torch.randn(rows, width, dtype=torch.float64)


def adj_t(layout: str, num_src: int, num_dst: int) -> torch.Tensor:
    """PyG's adj_t (N_dst, N_src) of EDGE_INDEX as the tests of PyG build it."""
    if layout == "csr":  # to_torch_csc_tensor(...).t() is CSR
        return pyg_utils.to_torch_csc_tensor(EDGE_INDEX, size=(num_src, num_dst)).t()
    return pyg_utils.to_torch_coo_tensor(EDGE_INDEX, size=(num_src, num_dst)).t().coalesce()


@pytest.mark.parametrize("bipartite", [False, True])
def test_gatconv_takes_size_fourth_as_pyg(bipartite):
    """conv(x, edge_index, edge_attr, size, return_attention_weights) positionally, as PyG's."""
    torch.manual_seed(0)
    theirs, ours = pair("GATConv", (6, 6) if bipartite else 6, heads=2, edge_dim=2)
    x = (features(N_SRC), features(N_DST)) if bipartite else features(N_SRC)
    size = (N_SRC, N_DST) if bipartite else (N_SRC, N_SRC)
    edge_attr = torch.randn(EDGE_INDEX.shape[1], 2, dtype=torch.float64)
    out_t, (ei_t, alpha_t) = theirs(x, EDGE_INDEX, edge_attr, size, True)
    out_o, (ei_o, alpha_o) = ours(x, EDGE_INDEX, edge_attr, size, True)
    assert torch.equal(ei_o, ei_t)
    assert_close(out_o, out_t, torch.float64, "size argument vs PyG", "forward API")
    assert_close(alpha_o, alpha_t, torch.float64, "size argument alpha vs PyG", "forward API")
    with pytest.raises(ValueError, match="size"):  # PyG: "Encountered tensor with size ..."
        ours(x, EDGE_INDEX, edge_attr, (N_SRC + 1, size[1]))


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("flag", [None, False, True])
def test_return_attention_weights_returns_what_pyg_returns(name, flag):
    """GAT and GATv2 return a tuple for True only (PyG tests the value); TransformerConv for any
    bool (PyG tests the type)."""
    torch.manual_seed(1)
    theirs, ours = pair(name, 6, heads=2)
    x = features(N_SRC)
    got = ours(x, EDGE_INDEX, return_attention_weights=flag)
    expected = theirs(x, EDGE_INDEX, return_attention_weights=flag)
    assert type(got) is type(expected)
    if isinstance(expected, tuple):
        assert torch.equal(got[1][0], expected[1][0])
        assert_close(got[1][1], expected[1][1], torch.float64, "alpha vs PyG", "forward API")
        got, expected = got[0], expected[0]
    assert_close(got, expected, torch.float64, "output vs PyG", "forward API")


@pytest.mark.parametrize("residual", [False, True])
def test_gatconv_without_destination_features_as_pyg(residual):
    """(x_src, None): no destination term, no residual; N_dst from size, from an adj_t, else N_src."""
    torch.manual_seed(2)
    theirs, ours = pair("GATConv", (6, 7), heads=2, residual=residual)
    x = (features(N_SRC), None)
    for args in ((EDGE_INDEX, None, (N_SRC, N_DST)), (EDGE_INDEX,), (adj_t("csr", N_SRC, N_DST),)):
        assert_close(ours(x, *args), theirs(x, *args), torch.float64, "(x_src, None) vs PyG", "forward API")


@pytest.mark.parametrize("name", ["GATv2Conv", "TransformerConv"])
def test_other_layers_refuse_missing_destination_features(name):
    """PyG's GATv2Conv asserts and its TransformerConv fails in lin_query; ours say why."""
    theirs, ours = pair(name, (6, 6))
    with pytest.raises((AssertionError, TypeError)):
        theirs((features(N_SRC), None), EDGE_INDEX)
    with pytest.raises(ValueError, match=r"\(x_src, None\) is not supported"):
        ours((features(N_SRC), None), EDGE_INDEX)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("bipartite", [False, True])
def test_sparse_adj_t_gets_sparse_weights_as_pyg(name, layout, add_self_loops, bipartite):
    """With a torch.sparse adj_t, return_attention_weights=True gives (weights, alpha): weights a
    sparse (N_dst, N_src, H) tensor in adj_t's layout (self loops added), alpha its values, with
    PyG's gradients."""
    torch.manual_seed(3)
    theirs, ours = pair(name, (6, 6) if bipartite else 6, heads=2, add_self_loops=add_self_loops)
    num_dst = N_DST if bipartite else N_SRC
    x_src = features(N_SRC).requires_grad_()
    x = (x_src, features(N_DST)) if bipartite else x_src
    adj = adj_t(layout, N_SRC, num_dst)
    out_t, (weights_t, alpha_t) = theirs(x, adj, return_attention_weights=True)
    out_o, (weights_o, alpha_o) = ours(x, adj, return_attention_weights=True)
    proj = torch.randn_like(alpha_t)
    (grad_t,) = torch.autograd.grad((alpha_t * proj).sum(), x_src)
    (grad_o,) = torch.autograd.grad((alpha_o * proj).sum(), x_src)
    assert_close(grad_o, grad_t, torch.float64, "d alpha / d x_src vs PyG", "forward API")
    assert weights_o.layout == weights_t.layout == adj.layout
    assert weights_o.shape == weights_t.shape == (num_dst, N_SRC, 2)
    if layout == "csr":
        assert torch.equal(weights_o.crow_indices(), weights_t.crow_indices())
        assert torch.equal(weights_o.col_indices(), weights_t.col_indices())
    else:
        assert weights_o.is_coalesced()
        assert torch.equal(weights_o.indices(), weights_t.indices())
    assert_close(weights_o.values(), weights_t.values(), torch.float64, "sparse weights vs PyG", "forward API")
    assert_close(alpha_o, alpha_t, torch.float64, "sparse alpha vs PyG", "forward API")
    assert_close(out_o, out_t, torch.float64, "sparse output vs PyG", "forward API")


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_csc_adj_t_gets_csc_weights(name):
    """PyG refuses a CSC adj_t; ours answers it with CSC weights equal to the CSR answer."""
    torch.manual_seed(4)
    _, ours = pair(name, 6, heads=2)
    x = features(N_SRC)
    csr = adj_t("csr", N_SRC, N_SRC)
    csc = csr.to_dense().to_sparse_csc()
    out_r, (weights_r, _) = ours(x, csr, return_attention_weights=True)
    out_c, (weights_c, alpha_c) = ours(x, csc, return_attention_weights=True)
    assert weights_c.layout == torch.sparse_csc
    assert torch.equal(weights_c.values(), alpha_c)
    assert_close(weights_c.to_dense(), weights_r.to_dense(), torch.float64, "CSC vs CSR weights", "forward API")
    assert_close(out_c, out_r, torch.float64, "CSC vs CSR output", "forward API")


def test_transformer_conv_alpha_is_none_outside_a_call_as_pyg():
    """PyG's message() stores the weights in _alpha and forward clears it before returning."""
    theirs, ours = pair("TransformerConv", 6, heads=2)
    assert ours._alpha is None and theirs._alpha is None
    for flag in (None, True):
        theirs(features(N_SRC), EDGE_INDEX, return_attention_weights=flag)
        ours(features(N_SRC), EDGE_INDEX, return_attention_weights=flag)
        assert ours._alpha is None and theirs._alpha is None


@pytest.mark.parametrize("name", LAYERS)
def test_lazy_edge_dim_as_pyg(name):
    """edge_dim=-1: the same state-dict keys as PyG's before and after the first call, lin_edge's
    width taken from edge_attr, and PyG's parameters load into it."""
    torch.manual_seed(5)
    theirs = getattr(pyg_nn, name)(6, C, heads=2, edge_dim=-1).double()
    ours = getattr(snn, name)(6, C, heads=2, edge_dim=-1).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x, edge_attr = features(N_SRC), torch.randn(EDGE_INDEX.shape[1], 3, dtype=torch.float64)
    theirs(x, EDGE_INDEX, edge_attr)
    ours(x, EDGE_INDEX, edge_attr)
    assert ours.lin_edge.weight.shape == theirs.lin_edge.weight.shape == (2 * C, 3)
    ours.load_state_dict(theirs.state_dict())
    expected = theirs(x, EDGE_INDEX, edge_attr)
    assert_close(ours(x, EDGE_INDEX, edge_attr), expected, torch.float64, "lazy edge_dim vs PyG", "forward API")
