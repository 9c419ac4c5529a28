import ast
import pathlib

import pytest
import torch
from torch import nn

import sparseattn.modules
from sparseattn import EdgeAttention, NodeKV, edge_attention, graphs
from sparseattn.graphs.kinds import register_graph_kind


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


def trained_like_mha(embed_dim=8, num_heads=2, **kw):
    """An nn.MultiheadAttention whose query/key weights are scaled up, as training leaves them, so
    that scaled scores reach far beyond the default clamp (-5, 5)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(embed_dim, num_heads, **kw).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.normal_()
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight"):
            w = getattr(mha, name)
            if w is not None:
                w[: 2 * embed_dim if name == "in_proj_weight" else None] *= 4.0
    return mha


@pytest.mark.parametrize(
    "kw", [{}, {"bias": False}, {"kdim": 6, "vdim": 10}, {"batch_first": True}, {"dropout": 0.3, "batch_first": True}]
)
def test_from_multihead_attention_equals_it_where_clamp_mode_does_not(kw):
    mha = trained_like_mha(**kw).eval()
    ea = EdgeAttention.from_multihead_attention(mha)
    assert ea.clamp is None and not ea.training and ea.dropout == mha.dropout
    assert ea.out_proj.weight.dtype == torch.float64
    kdim, vdim = kw.get("kdim", 8), kw.get("vdim", 8)
    x = torch.randn(6, 8, dtype=torch.float64)
    xs, xv = torch.randn(6, kdim, dtype=torch.float64), torch.randn(6, vdim, dtype=torch.float64)
    batched = (lambda t: t[None]) if kw.get("batch_first") else (lambda t: t[:, None])  # (1, L, E) or (L, 1, E)
    unbatch = (lambda t: t[0]) if kw.get("batch_first") else (lambda t: t[:, 0])
    expected = unbatch(mha(batched(x), batched(xs), batched(xv))[0])
    assert torch.allclose(ea(x, graphs.complete(6), xs, x_value=xv), expected, atol=1e-10)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    expected = unbatch(mha(batched(x), batched(xs), batched(xv), attn_mask=mask)[0])
    assert torch.allclose(ea(x, graphs.causal(6), xs, x_value=xv), expected, atol=1e-10)
    # the same weights in clamp mode give other outputs: these scores do leave (-5, 5)
    clamped = EdgeAttention(8, 2, bias=kw.get("bias", True), kdim=kdim, vdim=vdim).double()
    with pytest.warns(UserWarning, match="no record of an EdgeAttention's clamp"):
        clamped.load_state_dict(mha.state_dict())
    assert not torch.allclose(clamped.eval()(x, graphs.causal(6), xs, x_value=xv), expected, atol=1e-3)


def test_a_batch_first_batch_is_one_graph_of_sequences():
    mha = trained_like_mha(batch_first=True).eval()
    ea = EdgeAttention.from_multihead_attention(mha)
    x = torch.randn(3, 5, 8, dtype=torch.float64)  # (B, L, E)
    g = graphs.batch([graphs.complete(5)] * 3)
    assert torch.allclose(ea(x.reshape(15, 8), g), mha(x, x, x)[0].reshape(15, 8), atol=1e-10)


def test_extra_key_rows_of_multihead_attention_are_refused():
    with pytest.raises(ValueError, match="mha.add_zero_attn is True: .*no extra key row"):
        EdgeAttention.from_multihead_attention(nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with_bias_kv = nn.MultiheadAttention(8, 2, add_bias_kv=True)
    with pytest.raises(ValueError, match=r"mha.bias_k/bias_v exist \(add_bias_kv=True\)"):
        EdgeAttention.from_multihead_attention(with_bias_kv)
    for strict in (True, False):
        with pytest.raises(ValueError, match="'bias_k' comes from an nn.MultiheadAttention with add_bias_kv=True"):
            EdgeAttention(8, 2, clamp=None).load_state_dict(with_bias_kv.state_dict(), strict=strict)
    with pytest.raises(TypeError, match="mha must be an nn.MultiheadAttention, got EdgeAttention"):
        EdgeAttention.from_multihead_attention(EdgeAttention(8, 2))


def test_loading_warns_only_where_the_clamp_changes_results(tmp_path):
    import io
    import warnings

    saved = EdgeAttention(8, 2)
    mha = nn.MultiheadAttention(8, 2)

    def loads_silently(module, state):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            module.load_state_dict(state)

    loads_silently(EdgeAttention(8, 2), saved.state_dict())  # round trip, same clamp
    buf = io.BytesIO()
    torch.save({"model": nn.Sequential(saved).state_dict()}, buf)  # nested, through a file
    buf.seek(0)
    loads_silently(nn.Sequential(EdgeAttention(8, 2)), torch.load(buf, weights_only=True)["model"])
    loads_silently(EdgeAttention(8, 2, clamp=None), mha.state_dict())  # exact mode equals MHA
    loads_silently(EdgeAttention(8, 2, clamp=None), EdgeAttention(8, 2, clamp=None).state_dict())
    loads_silently(mha, saved.state_dict())  # EdgeAttention -> MHA stays strict-loadable
    with pytest.warns(UserWarning, match=r"no record .* clamp=\(-5.0, 5.0\) .*from_multihead_attention"):
        EdgeAttention(8, 2).load_state_dict(mha.state_dict())
    loads_silently(EdgeAttention(8, 2), dict(mha.state_dict()))  # a plain dict: no metadata, origin unknown
    with pytest.warns(UserWarning, match=r"saved with clamp=\(-5.0, 5.0\) load into a module with clamp=None"):
        EdgeAttention(8, 2, clamp=None).load_state_dict(saved.state_dict())
    with pytest.warns(UserWarning, match=r"saved with clamp=None load into a module with clamp=\(-3.0, 3.0\)"):
        EdgeAttention(8, 2, clamp=(-3, 3)).load_state_dict(EdgeAttention(8, 2, clamp=None).state_dict())


def test_edge_terms_and_eps_pass_through_to_edge_attention():
    torch.manual_seed(0)
    ea = EdgeAttention(8, 2, eps=0.5).double()
    g = graphs.window(7, 2)
    e = g.num_edges
    x = torch.randn(7, 8, dtype=torch.float64)
    terms = {n: torch.randn(e, 2, 4, dtype=torch.float64) for n in ("edge_key", "edge_value", "edge_scale")}
    bias = torch.randn(e, 2, dtype=torch.float64)
    q, k, v = torch.nn.functional.linear(x, ea.in_proj_weight, ea.in_proj_bias).reshape(7, 3, 2, 4).unbind(1)
    expected = ea.out_proj(edge_attention(q, k, v, g, bias=bias, eps=0.5, **terms).reshape(7, 8))
    assert torch.allclose(ea(x, g, edge_bias=bias, **terms), expected, atol=1e-12)
    flat = {n: t.reshape(e, 8) for n, t in terms.items()}  # (E, embed_dim): split into heads
    assert torch.allclose(ea(x, g, edge_bias=bias, **flat), expected, atol=1e-12)
    # dst_rows: per-edge inputs of the whole graph, or of the edges into those rows
    rows = torch.tensor([1, 4, 5])
    kv = ea.project_kv(x)
    part = ea(x[rows], g, kv=kv, dst_rows=rows, edge_bias=bias, **terms)
    assert torch.allclose(part, expected[rows], atol=1e-12)
    keep = torch.isin(g.dst, rows)
    part = ea(x[rows], g, kv=kv, dst_rows=rows, edge_bias=bias[keep], **{n: t[keep] for n, t in terms.items()})
    assert torch.allclose(part, expected[rows], atol=1e-12)
    weight = torch.rand(e, dtype=torch.float64)  # multipliers of the normalized weights, per edge too
    expected = ea.out_proj(edge_attention(q, k, v, g, bias=bias, eps=0.5, edge_weight=weight, **terms).reshape(7, 8))
    assert not torch.allclose(ea(x, g, edge_bias=bias, **terms), expected, atol=1e-3)
    assert torch.allclose(ea(x, g, edge_bias=bias, edge_weight=weight, **terms), expected, atol=1e-12)
    part = ea(x[rows], g, kv=kv, dst_rows=rows, edge_bias=bias, edge_weight=weight, **terms)
    assert torch.allclose(part, expected[rows], atol=1e-12)
    assert "eps=0.5" in repr(ea) and "eps" not in repr(EdgeAttention(8, 2))
    with pytest.raises(ValueError, match="eps > 0 needs clamp mode"):
        EdgeAttention(8, 2, clamp=None, eps=1e-6)
    with pytest.raises(ValueError, match=r"edge_key must have shape \(E, H, D\)"):
        ea(x, g, edge_key=torch.randn(e, 6, dtype=torch.float64))


class Doubled:
    """A toy graph kind: attention over `graph` with doubled values."""

    def __init__(self, graph):
        self.graph = graph


def _attend_doubled(q, k, v, obj, **kwargs):
    return edge_attention(q, k, 2 * v, obj.graph, **kwargs)


register_graph_kind(Doubled, "a doubled graph", graph=lambda d: d.graph, attend=_attend_doubled)


def test_a_registered_graph_kind_attends_over_itself():
    """EdgeAttention takes any kind registered in graphs.kinds (as distributed registers Shard and
    HaloExchange): the kind's attend runs the call, hooks and weights follow the kind's graph."""
    torch.manual_seed(0)
    attn = EdgeAttention(8, 2, bias=False).double()
    g = graphs.window(6, 1)
    x = torch.randn(6, 8, dtype=torch.float64)
    seen = []
    attn.register_weights_hook(lambda module, graph, weights: seen.append((graph, weights)))
    out, weights = attn(x, Doubled(g), return_weights=True)
    ref_out, ref_weights = attn(x, g, return_weights=True)
    torch.testing.assert_close(out, 2 * ref_out, rtol=0, atol=1e-12)  # no biases: the output is linear in v
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=0)
    assert all(graph is g for graph, _ in seen) and len(seen) == 2
    with pytest.raises(
        ValueError, match=r"dst_rows= does not apply to attention on a doubled graph \(graph is a Doubled\)"
    ):
        attn(x[:2], Doubled(g), dst_rows=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="cache= does not apply to attention on a doubled graph"):
        attn(x, Doubled(g), cache=NodeKV())


def test_the_module_layer_does_not_import_distributed():
    """modules.py dispatches on graph kinds through graphs.kinds, so it imports no distributed code."""
    tree = ast.parse(pathlib.Path(sparseattn.modules.__file__).read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if "distributed" in name]
