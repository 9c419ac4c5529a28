"""sparseattn.nn.ExphormerAttention against Exphormer's formula written out here in float64
(gather, multiply, clamp, exp, index_add, wV / (Z + 1e-6)): values and gradients."""

import math
import re
from typing import Optional, Tuple

import pytest
import torch

import sparseattn
from sparseattn.nn import ExphormerAttention

from .helpers import assert_close, grads_of

N, IN_DIM, OUT_DIM, HEADS, DIM_EDGE = 7, 5, 6, 3, 4
# node 5 has no in-edges, (2 -> 0) repeats, edges unsorted, a self-loop on 4
EDGE_INDEX = torch.tensor(
    [
        [2, 0, 6, 1, 2, 4, 3, 5, 0, 6, 4, 1, 3],
        [0, 3, 1, 2, 0, 4, 6, 1, 2, 0, 3, 6, 4],
    ]
)


def exphormer_formula(
    layer: ExphormerAttention, x: torch.Tensor, edge_attr: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exphormer's propagate_attention + forward, from the layer's Q, K, V, E: (N, H * d), and the
    unclamped scores (E, H, 1)."""
    h, d = HEADS, OUT_DIM // HEADS
    q, k, v = (lin(x).view(-1, h, d) for lin in (layer.Q, layer.K, layer.V))
    src, dst = EDGE_INDEX
    score = k[src] * q[dst] / math.sqrt(d)  # (E, H, d)
    if edge_attr is not None:
        score = score * layer.E(edge_attr).view(-1, h, d)
    raw = score.sum(-1, keepdim=True)  # (E, H, 1)
    score = torch.exp(raw.clamp(-5, 5))
    wv = torch.zeros_like(v).index_add(0, dst, v[src] * score)
    z = score.new_zeros(x.shape[0], h, 1).index_add(0, dst, score)
    return (wv / (z + 1e-6)).view(-1, h * d), raw.detach()


@pytest.mark.parametrize("with_edges", [True, False], ids=["edge_attr", "no_edge_attr"])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("backend", ["auto", "reference", "csr", "scatter"])
def test_matches_the_formula(backend, use_bias, with_edges):
    if backend != "auto" and backend not in sparseattn.kernels.available_backends():
        pytest.skip(f"backend {backend!r} is not available here")
    layer = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias, DIM_EDGE, backend=backend).double()
    with torch.no_grad():
        layer.K.weight.mul_(8.0), layer.Q.weight.mul_(4.0)  # large scores: some clamp at +-5
    x = torch.randn(N, IN_DIM, dtype=torch.float64, requires_grad=True)
    leaves = {"x": x}
    edge_attr = None
    if with_edges:
        edge_attr = leaves["edge_attr"] = torch.randn(EDGE_INDEX.shape[1], DIM_EDGE, dtype=torch.float64)
        edge_attr.requires_grad_(True)
    expected, raw = exphormer_formula(layer, x, edge_attr)
    assert (raw.abs() > 5).any() and (raw.abs() < 5).any()  # both sides of the clamp are tested
    got = layer(x, EDGE_INDEX, edge_attr)
    assert_close(got, expected, torch.float64, "Exphormer output vs formula")
    assert torch.equal(got[5], torch.zeros_like(got[5]))  # no in-edges
    w = torch.randn_like(expected)
    params = dict(layer.named_parameters())
    g_ref = grads_of((expected * w).sum(), {**leaves, **params})
    g_got = grads_of((got * w).sum(), {**leaves, **params})
    for name in g_ref:
        assert_close(g_got[name], g_ref[name], torch.float64, f"grad of {name}", "Exphormer grads vs formula")


def test_parameters_follow_the_original():
    layer = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=False)
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        "Q.weight": (OUT_DIM, IN_DIM),
        "K.weight": (OUT_DIM, IN_DIM),
        "E.weight": (OUT_DIM, IN_DIM),  # dim_edge defaults to in_dim, as in the original
        "V.weight": (OUT_DIM, IN_DIM),
    }
    assert layer.out_dim == OUT_DIM // HEADS
    with pytest.raises(ValueError, match="divisible"):
        ExphormerAttention(IN_DIM, 7, HEADS, use_bias=True)


@pytest.mark.parametrize("graph", [False, True], ids=["edge_index", "Graph"])
@pytest.mark.parametrize("shape", [(13, 1), (13, DIM_EDGE + 1), (12, DIM_EDGE), (13,)])
def test_edge_attr_of_another_shape_is_refused_naming_it(shape, graph):
    """edge_attr must be (E, dim_edge); other shapes failed in a matmul or in edge_attention's
    check of edge_scale, neither naming edge_attr."""
    layer = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=True, dim_edge=DIM_EDGE)
    x = torch.randn(N, IN_DIM)
    expected = f"edge_attr must have shape (E, dim_edge) = (13, {DIM_EDGE}), one row per edge, got {shape}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        layer(x, sparseattn.Graph(EDGE_INDEX, N, N) if graph else EDGE_INDEX, torch.randn(shape))


def test_torch_sparse_adj_t_equals_its_edge_index():
    """PyG's adj_t (N, N), adj_t[dst, src] per edge, CSR: edge_attr in its stored order. Before, a
    TypeError about edge_index's dtype."""
    unique = torch.unique(EDGE_INDEX, dim=1)  # sorted by source, then destination
    adj_t = torch.sparse_coo_tensor(unique.flip(0), torch.ones(unique.shape[1]), (N, N)).coalesce()
    ordered = adj_t.indices().flip(0)  # (source, destination) in the stored (destination-major) order
    layer = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=True, dim_edge=DIM_EDGE).double()
    x = torch.randn(N, IN_DIM, dtype=torch.float64)
    edge_attr = torch.randn(unique.shape[1], DIM_EDGE, dtype=torch.float64)
    expected = layer(x, ordered, edge_attr)
    assert_close(layer(x, adj_t.to_sparse_csr(), edge_attr), expected, torch.float64, "adj_t vs its edge_index")
    assert_close(layer(x, adj_t, edge_attr), expected, torch.float64, "adj_t vs its edge_index")
