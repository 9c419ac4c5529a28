"""Edge terms and queries given by their factors (`kernels.projected.EdgeProjection`, `QueryProjection`):
values, weights and the gradients of every input (the projections' features, inputs, weights and bias
included) equal to the formula with the terms built here (`test_edge_terms.loop_attention`,
independent of the library), whichever form the kernels take (factored where one projection is both
edge terms, built otherwise), on the backends that take edge terms; which form a call takes; the
errors naming the argument; torch.compile."""

import pytest
import torch

import sparseattn.kernels.projected as projected
from sparseattn import EdgeAttention, edge_attention, graphs
from sparseattn.functional import check_arguments
from sparseattn.kernels.projected import EdgeProjection, QueryProjection

from ..optional import backend_params
from .test_edge_terms import MODES, _case, loop_attention

BACKENDS = backend_params(["auto", "reference", "csr", "scatter"])
FEATURES = 5


def built(p: EdgeProjection, heads: int) -> torch.Tensor:
    """The term a projection stands for, computed here: (E, H, C)."""
    c = p.weight.shape[0] // heads
    term = torch.einsum("ef,hcf->ehc", p.features, p.weight.view(heads, c, -1))
    return term if p.bias is None else term + p.bias.view(heads, c)


def projection(num_edges: int, heads: int, width: int, seed: int, bias: bool = False) -> EdgeProjection:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(num_edges, FEATURES, generator=gen, dtype=torch.float64).requires_grad_()
    weight = torch.randn(heads * width, FEATURES, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(heads * width, generator=gen, dtype=torch.float64).requires_grad_() if bias else None
    return EdgeProjection(features, weight, b)


@pytest.fixture
def forms(monkeypatch):
    """Force the kernels' choice (factored or not) and record which form each call took."""
    taken = []

    def force(factor: bool) -> None:
        monkeypatch.setattr(projected, "factor_edge_projection", lambda *args: factor)

    original = EdgeProjection.materialize

    def materialize(self, heads):
        taken.append("built")
        return original(self, heads)

    monkeypatch.setattr(EdgeProjection, "materialize", materialize)
    return force, taken


def query_projection(n_dst: int, heads: int, width: int, seed: int) -> QueryProjection:
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n_dst, 6, generator=gen, dtype=torch.float64).requires_grad_()
    weight = torch.randn(heads * width, 6, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.randn(heads * width, generator=gen, dtype=torch.float64).requires_grad_()
    return QueryProjection(inputs, weight, bias)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["clamp", "exact", "clamp-eps"])
@pytest.mark.parametrize("factor", [True, False], ids=["factored", "built"])
@pytest.mark.parametrize("roles", ["both", "key", "value"])
@pytest.mark.parametrize("lazy_query", [False, True], ids=["q", "QueryProjection"])
@pytest.mark.parametrize("edge_bias", [False, True], ids=["", "edge-bias"])
def test_projection_equals_the_formula_with_its_term_built(backend, mode, factor, roles, lazy_query, edge_bias, forms):
    force, taken = forms
    force(factor)
    clamp, eps = MODES[mode]
    ei, t = _case(torch.float64, d=4, dv=4)
    heads, c = t["q"].shape[1], t["q"].shape[2]
    p = projection(ei.shape[1], heads, c, seed=1, bias=edge_bias)
    key = p if roles in ("both", "key") else None
    value = p if roles in ("both", "value") else None
    qp = query_projection(t["q"].shape[0], heads, c, seed=8)
    q = qp if lazy_query else t["q"]
    q_built = (torch.einsum("ni,ki->nk", qp.inputs, qp.weight) + qp.bias).view(-1, heads, c) if lazy_query else q
    args = dict(clamp=clamp, eps=eps, bias=t["bias"], backend=backend, return_weights=True, scale=0.7)
    out, weights = edge_attention(q, t["k"], t["v"], ei, edge_key=key, edge_value=value, **args)
    term = built(p, heads)
    expected, expected_weights = loop_attention(
        q_built, t["k"], t["v"], ei, 0.7, clamp, eps, t["bias"], term if key is not None else None,
        term if value is not None else None, None,
    )  # fmt: skip
    assert taken == ([] if factor and roles == "both" and not eps else ["built"])  # one projection: built once
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-10, atol=1e-12)
    queries = [*qp] if lazy_query else [t["q"]]
    edge_leaves = [p.features, p.weight] + ([p.bias] if edge_bias else [])
    leaves = [*queries, t["k"], t["v"], t["bias"], *edge_leaves]
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum() + weights.sum(), leaves)
    want = torch.autograd.grad((expected * grad).sum() + expected_weights.sum(), leaves)
    names = (["inputs", "q.weight", "q.bias"] if lazy_query else ["q"]) + ["k", "v", "bias", "features", "weight"]
    names += ["edge bias"] if edge_bias else []
    for a, b, name in zip(got, want, names):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)


def test_a_query_projection_alone_is_its_queries():
    ei, t = _case(torch.float64, d=4, dv=4)
    qp = query_projection(t["q"].shape[0], 2, 4, seed=9)
    q = qp.materialize(4)
    torch.testing.assert_close(q, (qp.inputs @ qp.weight.T + qp.bias).view(-1, 2, 4))
    for clamp in (None, (-5.0, 5.0)):
        got = edge_attention(qp, t["k"], t["v"], ei, clamp=clamp)
        torch.testing.assert_close(got, edge_attention(q, t["k"], t["v"], ei, clamp=clamp), rtol=0, atol=0)
    gqa = edge_attention(qp, t["k"][:, :1], t["v"][:, :1], ei)  # H = 2 query heads over one kv head
    torch.testing.assert_close(gqa, edge_attention(q, t["k"][:, :1], t["v"][:, :1], ei), rtol=0, atol=0)


def test_default_scale_is_of_the_query_width_in_the_factored_form(forms):
    """The factored call attends with C + F channels; its scale stays 1/sqrt(C)."""
    force, _ = forms
    ei, t = _case(torch.float64, d=4, dv=4)
    p = projection(ei.shape[1], 2, 4, seed=2)
    force(True)
    factored = edge_attention(t["q"], t["k"], t["v"], ei, edge_key=p, edge_value=p, clamp=None)
    force(False)
    plain = edge_attention(t["q"], t["k"], t["v"], ei, edge_key=p, edge_value=p, clamp=None)
    torch.testing.assert_close(factored, plain, rtol=1e-12, atol=1e-12)


def test_factored_only_where_one_projection_is_both_terms(forms):
    force, taken = forms
    force(True)
    ei, t = _case(torch.float64, d=4, dv=4)
    a, b = projection(ei.shape[1], 2, 4, seed=3), projection(ei.shape[1], 2, 4, seed=4)
    edge_attention(t["q"], t["k"], t["v"], ei, edge_key=a, edge_value=b)  # two projections: both built
    assert taken == ["built", "built"]
    taken.clear()
    edge_attention(t["q"], t["k"], t["v"], ei, edge_key=a, edge_value=a, edge_scale=t["edge_scale"][..., :4])
    assert taken == ["built"]  # edge_scale multiplies the built key per channel; one tensor as both terms
    taken.clear()
    kv = t["k"][:, :1], t["v"][:, :1]  # grouped-query heads
    edge_attention(t["q"], *kv, ei, edge_key=a, edge_value=a, backend="reference")
    assert taken == ["built"]
    taken.clear()
    edge_attention(t["q"], t["k"], t["v"], ei, edge_key=a, edge_value=a)
    assert taken == []


def test_the_kernels_decide_by_the_graph_s_size():
    """Unforced: a small graph attends with the built term ("small" gathers it), a large one factored."""
    ei, t = _case(torch.float64, d=4, dv=4)
    small = projection(ei.shape[1], 2, 4, seed=5)
    assert not projected.factor_edge_projection(ei.shape[1], 2, 4, FEATURES)
    assert projected.factor_edge_projection(1 << 16, 4, 16, FEATURES)  # a narrower row, many edges
    assert not projected.factor_edge_projection(1 << 16, 2, 4, FEATURES)  # C + F wider than H * C
    out = edge_attention(t["q"], t["k"], t["v"], ei, edge_key=small, edge_value=small)
    term = built(small, 2)
    torch.testing.assert_close(out, edge_attention(t["q"], t["k"], t["v"], ei, edge_key=term, edge_value=term))


def test_errors_name_the_argument():
    ei, t = _case(torch.float64, d=4, dv=4)
    q, k, v = t["q"], t["k"], t["v"]
    p = projection(ei.shape[1], 2, 4, seed=6)
    with pytest.raises(ValueError, match=r"edge_key.weight must have shape \(H \* D, F\) = \(8, 5\)"):
        edge_attention(q, k, v, ei, edge_key=EdgeProjection(p.features, p.weight[:6]))
    with pytest.raises(ValueError, match=r"edge_value.weight must have shape \(H \* Dv, F\)"):
        edge_attention(q, k, v[..., :3], ei, edge_value=p)
    with pytest.raises(ValueError, match=r"edge_key.bias must have shape \(H \* D,\) = \(8,\)"):
        edge_attention(q, k, v, ei, edge_key=EdgeProjection(p.features, p.weight, p.weight[:, 0][:5]))
    with pytest.raises(TypeError, match="edge_key.features must be a 2-D floating-point tensor"):
        edge_attention(q, k, v, ei, edge_key=EdgeProjection(p.features[:, 0], p.weight))
    with pytest.raises(ValueError, match="edge_key must have shape"):  # one row per edge
        edge_attention(q, k, v, ei, edge_key=EdgeProjection(p.features[:-1], p.weight))
    qp = query_projection(q.shape[0], 2, 4, seed=10)
    with pytest.raises(ValueError, match=r"q.weight must have shape \(H \* D, in\) with D=4"):
        edge_attention(QueryProjection(qp.inputs, qp.weight[:7], None), k, v, ei)
    with pytest.raises(TypeError, match="q.inputs must be a 2-D floating-point tensor"):
        edge_attention(QueryProjection(qp.inputs[:, 0], qp.weight, qp.bias), k, v, ei)
    with pytest.raises(ValueError, match=r"q.bias must have shape \(H \* D,\) = \(8,\)"):
        edge_attention(QueryProjection(qp.inputs, qp.weight, qp.bias[:4]), k, v, ei)
    with pytest.raises(TypeError, match="k must be a \\(N_src, H_kv, D\\) tensor"):
        edge_attention(qp, k[0], v, ei)
    with pytest.raises(IndexError, match="destinations"):  # one row per destination, as for q itself
        edge_attention(QueryProjection(qp.inputs[:2], qp.weight, qp.bias), k, v, ei)
    check_arguments(qp, k, v, ei, edge_key=p, edge_value=p)
    with pytest.raises(ValueError, match="q.weight"):
        check_arguments(QueryProjection(qp.inputs, qp.weight[:7], None), k, v, ei)
    check_arguments(q, k, v, ei, edge_key=p, edge_value=p)
    with pytest.raises(ValueError, match="edge_key must have shape"):
        check_arguments(q, k, v, ei, edge_key=EdgeProjection(p.features[:-1], p.weight))
    with pytest.raises(ValueError, match="edge_value.weight"):
        check_arguments(q, k, v, ei, edge_value=EdgeProjection(p.features, p.weight[:4]))


@pytest.mark.parametrize("factor", [True, False], ids=["factored", "built"])
def test_compiles_as_one_graph_and_equals_eager(factor, forms):
    force, _ = forms
    force(factor)
    ei, t = _case(torch.float64, d=4, dv=4)
    p = projection(ei.shape[1], 2, 4, seed=7)

    qp = query_projection(t["q"].shape[0], 2, 4, seed=11)

    def attend(inputs, q_weight, q_bias, k, v, features, weight, edge_index):
        term = EdgeProjection(features, weight)
        q = QueryProjection(inputs, q_weight, q_bias)
        return edge_attention(q, k, v, edge_index, edge_key=term, edge_value=term, clamp=None)

    args = (*qp, t["k"], t["v"], p.features, p.weight, ei)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(attend)(*args)
    assert explained.graph_count == 1, explained.break_reasons
    compiled = torch.compile(attend, dynamic=True, backend="aot_eager")
    got, expected = compiled(*args), attend(*args)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    leaves = args[:7]
    for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(expected.sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("factor", [True, False], ids=["factored", "built"])
def test_a_graph_without_edges_gives_zeros(factor, forms):
    force, _ = forms
    force(factor)
    q = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    p = EdgeProjection(torch.randn(0, FEATURES, dtype=torch.float64), torch.randn(8, FEATURES, dtype=torch.float64))
    out = edge_attention(q, q, q, torch.zeros(2, 0, dtype=torch.long), edge_key=p, edge_value=p)
    assert out.shape == (3, 2, 4) and not out.any()


@pytest.mark.parametrize("factor", [True, False], ids=["factored", "built"])
@pytest.mark.parametrize("edge_bias", [False, True], ids=["", "edge-bias"])
def test_edge_attention_module_takes_a_projection(factor, edge_bias, forms):
    """EdgeAttention given an EdgeProjection as edge_key and edge_value equals the module given the
    term built here ((E, embed_dim)), in either form, on the whole graph and with dst_rows (the
    projection's feature rows of the kept edges taken), values and the gradients of x, the module's
    parameters and the projection's factors."""
    force, taken = forms
    force(factor)
    torch.manual_seed(3)
    module = EdgeAttention(8, 2, clamp=None).double()
    g = graphs.random(9, 9, 40, seed=2)
    x = torch.randn(9, 8, dtype=torch.float64, requires_grad=True)
    p = projection(g.num_edges, 2, 4, seed=4, bias=edge_bias)
    leaves = [x, *module.parameters(), p.features, p.weight] + ([p.bias] if edge_bias else [])
    rows = torch.tensor([0, 3, 4, 8])
    for dst_rows in (None, rows):
        x_dst = x if dst_rows is None else x[dst_rows]
        got = module(x_dst, g, x, dst_rows=dst_rows, edge_key=p, edge_value=p)
        term = built(p, 2).reshape(g.num_edges, 8)
        assert taken == ([] if factor else ["built"])
        taken.clear()
        want = module(x_dst, g, x, dst_rows=dst_rows, edge_key=term, edge_value=term)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        grad = torch.randn_like(got)
        grads = [torch.autograd.grad((out * grad).sum(), leaves, retain_graph=True) for out in (got, want)]
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
