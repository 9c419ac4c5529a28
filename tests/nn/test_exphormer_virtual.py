"""ExphormerAttention's virtual nodes and batch interface, as the original (`use_virt_nodes`,
`forward(batch)`): the virtual nodes join the graph as extra nodes with their own edges and edge
features, the real nodes' rows are the output, the virtual nodes' new states come back beside it
(and as batch.virt_h). Against the formula written out in float64."""

import math

import pytest
import torch

from sparseattn.nn import ExphormerAttention

from .helpers import assert_close

N, IN_DIM, OUT_DIM, HEADS, DIM_EDGE, N_VIRT = 6, 5, 6, 3, 4, 2


def formula(layer, h, edge_index, edge_attr):
    """Exphormer's propagate_attention over all nodes h (N + N_VIRT, in_dim): (rows, H * d)."""
    d = OUT_DIM // HEADS
    q, k, v = (lin(h).view(-1, HEADS, d) for lin in (layer.Q, layer.K, layer.V))
    src, dst = edge_index
    score = (k[src] * q[dst] / math.sqrt(d) * layer.E(edge_attr).view(-1, HEADS, d)).sum(-1, keepdim=True)
    score = torch.exp(score.clamp(-5, 5))
    wv = torch.zeros_like(v).index_add(0, dst, v[src] * score)
    z = score.new_zeros(h.shape[0], HEADS, 1).index_add(0, dst, score)
    return (wv / (z + 1e-6)).view(-1, OUT_DIM)


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N, (2, 10), generator=gen)
    real = torch.arange(N)
    virt = torch.arange(N, N + N_VIRT)
    a, b = real.repeat(N_VIRT), virt.repeat_interleave(N)
    virt_edge_index = torch.cat([torch.stack([a, b]), torch.stack([b, a])], dim=1)  # every real <-> virtual

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    return leaf(N, IN_DIM), edge_index, leaf(10, DIM_EDGE), leaf(N_VIRT, IN_DIM), virt_edge_index, leaf(24, DIM_EDGE)


def test_virtual_nodes_equal_the_formula_with_gradients():
    torch.manual_seed(0)
    layer = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=True, dim_edge=DIM_EDGE, use_virt_nodes=True).double()
    x, ei, ea, vh, vei, vea = inputs()
    out, virt_out = layer(x, ei, ea, virt_h=vh, virt_edge_index=vei, virt_edge_attr=vea)
    want = formula(layer, torch.cat([x, vh]), torch.cat([ei, vei], 1), torch.cat([ea, vea]))
    assert out.shape == (N, OUT_DIM) and virt_out.shape == (N_VIRT, OUT_DIM)
    assert_close(torch.cat([out, virt_out]), want, torch.float64, "virtual nodes vs formula", "Exphormer virtual")
    w = torch.randn_like(want)
    leaves = [x, ea, vh, vea, *layer.parameters()]
    got_g = torch.autograd.grad((torch.cat([out, virt_out]) * w).sum(), leaves)
    want_g = torch.autograd.grad((want * w).sum(), leaves)
    for a, b in zip(got_g, want_g):
        assert_close(a, b, torch.float64, "virtual nodes grads", "Exphormer virtual")


def test_the_batch_interface_sets_virt_h():
    data = pytest.importorskip("torch_geometric.data")
    torch.manual_seed(1)
    layer = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=False, dim_edge=DIM_EDGE, use_virt_nodes=True).double()
    x, ei, ea, vh, vei, vea = inputs(1)
    batch = data.Data(x=x, expander_edge_index=ei, expander_edge_attr=ea, virt_h=vh, virt_edge_index=vei)
    batch.virt_edge_attr = vea
    out = layer(batch)
    want_out, want_virt = layer(x, ei, ea, virt_h=vh, virt_edge_index=vei, virt_edge_attr=vea)
    assert torch.equal(out, want_out) and torch.equal(batch.virt_h, want_virt)
    plain = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=False, dim_edge=DIM_EDGE).double()
    assert torch.equal(plain(data.Data(x=x, expander_edge_index=ei, expander_edge_attr=ea)), plain(x, ei, ea))


def test_virtual_node_errors_name_the_arguments():
    x, ei, ea, vh, vei, vea = inputs(2)
    plain = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=False, dim_edge=DIM_EDGE).double()
    with pytest.raises(ValueError, match="need use_virt_nodes=True"):
        plain(x, ei, ea, virt_h=vh, virt_edge_index=vei, virt_edge_attr=vea)
    virt = ExphormerAttention(IN_DIM, OUT_DIM, HEADS, use_bias=False, dim_edge=DIM_EDGE, use_virt_nodes=True).double()
    with pytest.raises(ValueError, match="needs virt_h, virt_edge_index and virt_edge_attr"):
        virt(x, ei, ea)
    with pytest.raises(ValueError, match=r"virt_edge_attr must have shape \(E, dim_edge\) = \(24, 4\)"):
        virt(x, ei, ea, virt_h=vh, virt_edge_index=vei, virt_edge_attr=vea[:3])
    with pytest.raises(TypeError, match="a PyG batch with expander_edge_index"):
        virt(object())
