import pytest
import torch
from torch import nn

from sparseattn import EdgeAttention, edge_attention, graphs


@pytest.mark.parametrize("kdim, vdim, bias", [(None, None, True), (None, None, False), (6, 10, True)])
def test_matches_multihead_attention_with_copied_weights(kdim, vdim, bias):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(12, 3, bias=bias, kdim=kdim, vdim=vdim, batch_first=True).double()
    ea = EdgeAttention(12, 3, bias=bias, kdim=kdim, vdim=vdim, clamp=None).double()
    ea.load_state_dict(mha.state_dict())
    n_dst, n_src = 5, 7
    x = torch.randn(n_dst, 12, dtype=torch.float64)
    xs = torch.randn(n_src, kdim or 12, dtype=torch.float64)
    xv = torch.randn(n_src, vdim or 12, dtype=torch.float64)
    expected, exp_w = mha(x[None], xs[None], xv[None], average_attn_weights=False)
    g = graphs.bipartite(n_src, n_dst)
    out, w = ea(x, g, xs, x_value=xv, return_weights=True)
    assert torch.allclose(out, expected[0], atol=1e-10)
    # MHA weights (1, H, N_dst, N_src); ours (E, H) destination-major over the complete bipartite graph
    assert torch.allclose(w.reshape(n_dst, n_src, 3).permute(2, 0, 1), exp_w[0], atol=1e-10)


def test_self_attention_with_causal_graph_matches_masked_mha():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    ea = EdgeAttention(8, 2, clamp=None).double()
    ea.load_state_dict(mha.state_dict())
    x = torch.randn(6, 8, dtype=torch.float64)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    expected, _ = mha(x[None], x[None], x[None], attn_mask=mask)
    assert torch.allclose(ea(x, graphs.causal(6)), expected[0], atol=1e-10)


def test_init_like_multihead_attention_and_shapes():
    ea = EdgeAttention(16, 4)
    assert ea.in_proj_weight.shape == (48, 16) and ea.head_dim == 4
    assert (ea.in_proj_bias == 0).all() and (ea.out_proj.bias == 0).all()
    bound = (6 / (16 + 48)) ** 0.5  # xavier_uniform on the packed (3E, E) weight, as in MHA
    assert ea.in_proj_weight.abs().max() <= bound
    g = graphs.batch([graphs.complete(3), graphs.complete(5)])
    x = torch.randn(8, 16, requires_grad=True)
    out = ea(x, g, edge_bias=torch.zeros(g.num_edges))
    assert out.shape == (8, 16)
    out.sum().backward()
    assert x.grad is not None and ea.in_proj_weight.grad is not None


def test_module_equals_functional_and_dropout_only_in_training():
    ea = EdgeAttention(8, 2, dropout=0.5).double()
    g = graphs.complete(6)
    x = torch.randn(6, 8, dtype=torch.float64)
    ea.eval()
    q, k, v = torch.nn.functional.linear(x, ea.in_proj_weight, ea.in_proj_bias).reshape(6, 3, 2, 4).unbind(1)
    expected = ea.out_proj(edge_attention(q, k, v, g).reshape(6, 8))
    assert torch.allclose(ea(x, g), expected)
    assert torch.equal(ea(x, g), ea(x, g))
    ea.train()
    assert not torch.allclose(ea(x, g), expected)
