"""Every backend against the independent dense reference and the reference backend: values and
gradients of q, k, v and bias, on random graphs, for every dtype, plus the invariances."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from sparseattn import Graph, edge_attention, graphs
from sparseattn.kernels import backends_for

from .dense import dense_attention
from .optional import backend_params
from .strategies import block_cases, graph_cases, laid_out
from .tolerances import assert_close, assert_within_reference_error

HALF = [torch.float16, torch.bfloat16]
# every backend that takes CPU tensors, each skipped with the reason where its dependency is missing
BACKENDS = backend_params()
# "dense" runs only on graphs that record dense blocks; the raw-edge-index tests skip it with this
# reason and the block tests at the end of this file run it (and every other backend) instead.
BLOCK_ONLY = {"dense": "dense needs a Graph with recorded blocks; covered by the *_on_blocks tests"}
EDGE_BACKENDS = backend_params(skip=BLOCK_ONLY)


def run(case, backend, dtype=torch.float64, magnitude=1.0):
    """Run one backend and the dense reference; return outputs and the four input gradients."""
    q, k, v, table = case.tensors(dtype, magnitude=magnitude)
    ei = case.edge_index
    bias = table[ei[1], ei[0]] if case.use_bias else None  # (E, H): duplicates share a bias value
    out = edge_attention(q, k, v, case.graph(), scale=case.scale, clamp=case.clamp, bias=bias, backend=backend)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(case.seed + 1), dtype=torch.float64)
    out.backward(grad_out.to(dtype))
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v, table)]
    return out.detach(), grads, grad_out


def dense_run(case, grad_out, magnitude=1.0):
    q, k, v, table = case.tensors(torch.float64, magnitude=magnitude)
    out = dense_attention(
        q, k, v, case.edge_index, scale=case.scale, clamp=case.clamp, bias_table=table if case.use_bias else None
    )
    out.backward(grad_out)
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v, table)]
    if not case.use_bias:
        grads[3] = torch.zeros_like(table)
    return out.detach(), grads


def check_against_dense(case, backend, dtype):
    """Values and the q, k, v, bias gradients of `backend` in `dtype` against the float64 dense reference."""
    out, grads, grad_out = run(case, backend, dtype)
    gold, gold_grads = dense_run(case, grad_out)
    assert out.dtype == dtype
    assert_close(out, gold, dtype, "out")
    for name, g, gg in zip("q k v bias".split(), grads, gold_grads):
        assert_close(g, gg, dtype, f"d{name}")


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(case=graph_cases())
def test_matches_dense_float64(backend, case):
    check_against_dense(case, backend, torch.float64)


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(case=graph_cases(max_nodes=8, max_edges=32))
def test_matches_dense_float32(backend, case):
    check_against_dense(case, backend, torch.float32)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(case=graph_cases(max_nodes=8, max_edges=32))
def test_half_precision_within_reference_error(backend, dtype, case):
    out, grads, grad_out = run(case, backend, dtype)
    ref, ref_grads, _ = run(case, "reference", dtype)
    gold, gold_grads = dense_run(case, grad_out.to(dtype).double())
    assert out.dtype == dtype
    assert_within_reference_error(out, ref, gold, 2.0, "out")
    for name, g, rg, gg in zip("q k v bias".split(), grads, ref_grads, gold_grads):
        assert_within_reference_error(g, rg, gg, 3.0, f"d{name}")


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(case=graph_cases(max_nodes=8, max_edges=32, bipartite=True), magnitude=st.sampled_from([30.0, 100.0]))
def test_exact_softmax_equals_sdpa_at_large_scores(backend, case, magnitude):
    """clamp=None must match masked SDPA even when scores reach ~1e4 (no overflow)."""
    ei = torch.unique(case.edge_index, dim=1)  # SDPA's boolean mask cannot express duplicates
    q, k, v, _ = case.tensors(torch.float64, magnitude=magnitude)
    out = edge_attention(q, k, v, ei, clamp=None, backend=backend)
    mask = torch.zeros(case.n_dst, case.n_src, dtype=torch.bool)
    mask[ei[1], ei[0]] = True
    sdpa = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    ).transpose(0, 1)
    has_in = mask.any(1)
    assert torch.isfinite(out).all()
    assert_close(out[has_in], sdpa[has_in], torch.float64, "out vs SDPA")
    assert (out[~has_in] == 0).all()


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(cases=st.lists(graph_cases(max_nodes=6, max_edges=20), min_size=1, max_size=4))
def test_batched_equals_one_by_one(backend, cases):
    heads, d, dv = 2, 4, 3
    parts = [Graph(c.edge_index, c.n_src, c.n_dst) for c in cases]
    g = graphs.batch(parts)
    q = torch.randn(g.num_dst, heads, d, dtype=torch.float64)
    k = torch.randn(g.num_src, heads, d, dtype=torch.float64)
    v = torch.randn(g.num_src, heads, dv, dtype=torch.float64)
    out = edge_attention(q, k, v, g, backend=backend)
    for part, o, qq, kk, vv in zip(parts, g.split_dst(out), g.split_dst(q), g.split_src(k), g.split_src(v)):
        assert_close(o, edge_attention(qq, kk, vv, part, backend=backend), torch.float64, "batched")


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(case=graph_cases())
def test_edge_order_and_node_labels_do_not_matter(backend, case):
    q, k, v, table = case.tensors(torch.float64)
    q, k, v, table = (t.detach() for t in (q, k, v, table))
    ei = case.edge_index
    bias = table[ei[1], ei[0]]
    out, w = edge_attention(q, k, v, ei, bias=bias, clamp=case.clamp, backend=backend, return_weights=True)
    gen = torch.Generator().manual_seed(case.seed)
    perm = torch.randperm(ei.shape[1], generator=gen)
    out_p, w_p = edge_attention(
        q,
        k,
        v,
        laid_out(ei[:, perm], case.layout),
        bias=bias[perm],
        clamp=case.clamp,
        backend=backend,
        return_weights=True,
    )
    assert_close(out_p, out, torch.float64, "edge permutation: out")
    assert_close(w_p, w[perm], torch.float64, "edge permutation: weights")
    # relabel nodes: new id of old source s is ps_inv[s]
    ps, pd = torch.randperm(case.n_src, generator=gen), torch.randperm(case.n_dst, generator=gen)
    ps_inv, pd_inv = torch.argsort(ps), torch.argsort(pd)
    ei_r = torch.stack([ps_inv[ei[0]], pd_inv[ei[1]]])
    out_r = edge_attention(q[pd], k[ps], v[ps], ei_r, bias=bias, clamp=case.clamp, backend=backend)
    assert_close(out_r, out[pd], torch.float64, "node relabeling")


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@given(case=graph_cases())
def test_weights_sum_to_one(backend, case):
    q, k, v, _ = case.tensors(torch.float64)
    ei = case.edge_index
    out, w = edge_attention(q, k, v, case.graph(), clamp=case.clamp, backend=backend, return_weights=True)
    assert w.shape == (ei.shape[1], case.heads)
    sums = torch.zeros(case.n_dst, case.heads, dtype=torch.float64).index_add_(0, ei[1], w.detach())
    has_in = torch.bincount(ei[1], minlength=case.n_dst) > 0
    assert torch.allclose(sums[has_in], torch.ones_like(sums[has_in]))
    assert (sums[~has_in] == 0).all()
    # out is the weighted sum of the source values
    recon = torch.zeros_like(out).index_add_(0, ei[1], w[..., None] * v[ei[0]])
    assert_close(out, recon, torch.float64, "out vs weights @ v")


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
def test_isolated_destinations_get_zero_and_zero_grad(backend, clamp):
    ei = torch.tensor([[0, 1, 1], [0, 0, 2]])  # destinations 1 and 3 have no in-edges
    q = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 5, dtype=torch.float64, requires_grad=True)
    out = edge_attention(q, k, v, ei, clamp=clamp, backend=backend)
    assert (out[[1, 3]] == 0).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert (q.grad[[1, 3]] == 0).all()


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF])
def test_empty_graph(backend, dtype):
    q = torch.randn(3, 2, 4, dtype=dtype, requires_grad=True)
    k = torch.randn(5, 2, 4, dtype=dtype, requires_grad=True)
    v = torch.randn(5, 2, 6, dtype=dtype, requires_grad=True)
    bias = torch.zeros(0, 2, dtype=dtype, requires_grad=True)
    out, w = edge_attention(
        q, k, v, torch.empty(2, 0, dtype=torch.long), bias=bias, backend=backend, return_weights=True
    )
    assert out.shape == (3, 2, 6) and out.dtype == dtype and (out == 0).all()
    assert w.shape == (0, 2)
    out.sum().backward()
    assert (q.grad == 0).all() and (k.grad == 0).all() and (v.grad == 0).all()
    # no source nodes at all
    out = edge_attention(q, k[:0], v[:0], torch.empty(2, 0, dtype=torch.long), backend=backend)
    assert out.shape == (3, 2, 6) and (out == 0).all()


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
@pytest.mark.parametrize("heads, d, dv", [(0, 4, 3), (2, 0, 3), (2, 4, 0), (0, 0, 0)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_heads_or_head_dims_with_edges(backend, heads, d, dv, clamp, use_bias):
    """H, D or Dv = 0 with E > 0 gives the formula's result, (N_dst, H, Dv) (with D = 0 every score
    is 0, so out is the mean of v over the in-edges), and gradients shaped like the inputs."""
    g = graphs.from_blocks([("causal_no_self", 3, 3), ("full", 2, 3)])  # recorded blocks: dense runs too
    gen = torch.Generator().manual_seed(0)
    shapes = [(g.num_dst, heads, d), (g.num_src, heads, d), (g.num_src, heads, dv), (g.num_dst, g.num_src, heads)]
    q, k, v, table = (torch.randn(*s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes)
    bias = table[g.dst, g.src] if use_bias else None
    kw = dict(scale=0.5, clamp=clamp)
    out, w = edge_attention(q, k, v, g, bias=bias, backend=backend, return_weights=True, **kw)
    gold = dense_attention(q, k, v, g.edge_index, bias_table=table if use_bias else None, **kw)
    assert out.shape == (g.num_dst, heads, dv) and w.shape == (g.num_edges, heads)
    assert_close(out, gold, torch.float64, "out")
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad((out * grad_out).sum() + w.square().sum(), (q, k, v), allow_unused=True)
    ref_w = edge_attention(q, k, v, g, bias=bias, backend="reference", return_weights=True, **kw)[1]
    want = torch.autograd.grad((gold * grad_out).sum() + ref_w.square().sum(), (q, k, v), allow_unused=True)
    for name, t, a, b in zip("qkv", (q, k, v), got, want):
        a = torch.zeros_like(t) if a is None else a
        b = torch.zeros_like(t) if b is None else b
        assert a.shape == t.shape
        assert_close(a, b, torch.float64, f"d{name}")


@pytest.mark.parametrize("backend", EDGE_BACKENDS)
def test_graph_and_tensor_spellings_agree(backend):
    g = graphs.window(20, 3)
    q, k, v = (torch.randn(20, 2, 8, dtype=torch.float64) for _ in range(3))
    assert_close(
        edge_attention(q, k, v, g, backend=backend),
        edge_attention(q, k, v, g.edge_index, backend=backend),
        torch.float64,
        "Graph vs tensor",
    )


def test_hand_computed_two_edges():
    """One destination, two sources, D=1: out = (e^a v0 + e^b v1) / (e^a + e^b) with a, b clamped."""
    q = torch.tensor([[[2.0]]], dtype=torch.float64)
    k = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64)  # scores 2 and 8 -> clamped to 2 and 5
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64)
    ei = torch.tensor([[0, 1], [0, 0]])
    out = edge_attention(q, k, v, ei, scale=1.0, backend="reference")
    wa, wb = math.exp(2.0), math.exp(5.0)
    assert out.item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)
    out_exact = edge_attention(q, k, v, ei, scale=1.0, clamp=None, backend="reference")
    wa, wb = math.exp(2.0 - 8.0), 1.0
    assert out_exact.item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)


def test_duplicate_edges_count_once_each():
    q = torch.zeros(1, 1, 2, dtype=torch.float64)  # all scores 0 -> equal weights per edge
    k = torch.randn(2, 1, 2, dtype=torch.float64)
    v = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64)
    ei = torch.tensor([[0, 1, 1], [0, 0, 0]])  # source 1 twice
    assert edge_attention(q, k, v, ei, backend="reference").item() == pytest.approx((1 + 4 + 4) / 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_is_deterministic_under_a_seed_and_unbiased(backend):
    g = graphs.complete(16)
    q, k, v = (torch.randn(16, 2, 4, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(1)
    a = edge_attention(q, k, v, g, dropout_p=0.3, backend=backend)
    torch.manual_seed(1)
    b = edge_attention(q, k, v, g, dropout_p=0.3, backend=backend)
    assert torch.equal(a, b)
    plain = edge_attention(q, k, v, g, backend=backend)
    assert not torch.allclose(a, plain)
    mean = torch.stack([edge_attention(q, k, v, g, dropout_p=0.3, backend=backend) for _ in range(400)]).mean(0)
    assert (mean - plain).abs().max() < 0.25  # unbiased: E[drop(w)] = w


def test_dropout_matches_reference_mask_across_backends():
    g = graphs.window(30, 4)
    q, k, v = (torch.randn(30, 2, 4, dtype=torch.float64) for _ in range(3))
    outs = []
    for backend in [b for b in backends_for("cpu") if b not in BLOCK_ONLY]:  # those that run here
        torch.manual_seed(7)
        outs.append(edge_attention(q, k, v, g, dropout_p=0.5, backend=backend))
    for o in outs[1:]:
        assert_close(o, outs[0], torch.float64, "dropout across backends")


# ---- graphs built from dense blocks: every backend, "dense" included --------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@given(case=block_cases())
def test_matches_dense_float64_on_blocks(backend, case):
    check_against_dense(case, backend, torch.float64)


@pytest.mark.parametrize("backend", BACKENDS)
@given(case=block_cases(max_size=5))
def test_matches_dense_float32_on_blocks(backend, case):
    check_against_dense(case, backend, torch.float32)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", BACKENDS)
@given(case=block_cases(max_size=5))
def test_half_precision_within_reference_error_on_blocks(backend, dtype, case):
    out, grads, grad_out = run(case, backend, dtype)
    ref, ref_grads, _ = run(case, "reference", dtype)
    gold, gold_grads = dense_run(case, grad_out.to(dtype).double())
    assert out.dtype == dtype
    assert_within_reference_error(out, ref, gold, 2.0, "out")
    for name, g, rg, gg in zip("q k v bias".split(), grads, ref_grads, gold_grads):
        assert_within_reference_error(g, rg, gg, 3.0, f"d{name}")


@pytest.mark.parametrize("backend", BACKENDS)
@given(case=block_cases())
def test_weights_and_dropout_match_reference_on_blocks(backend, case):
    q, k, v, table = (t.detach() for t in case.tensors(torch.float64))
    g, ei = case.graph(), case.edge_index
    bias = table[ei[1], ei[0]] if case.use_bias else None
    kw = dict(scale=case.scale, clamp=case.clamp, bias=bias, return_weights=True)
    out, w = edge_attention(q, k, v, g, backend=backend, **kw)
    ref, ref_w = edge_attention(q, k, v, g, backend="reference", **kw)
    assert_close(out, ref, torch.float64, "out")
    assert_close(w, ref_w, torch.float64, "weights")
    torch.manual_seed(case.seed)
    out = edge_attention(q, k, v, g, backend=backend, dropout_p=0.4, **kw)[0]
    torch.manual_seed(case.seed)
    ref = edge_attention(q, k, v, g, backend="reference", dropout_p=0.4, **kw)[0]
    assert_close(out, ref, torch.float64, "dropout")


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_leaves_each_backend_its_own_precision(backend):
    """Under torch.autocast (bf16) an EdgeAttention layer gives every backend bf16 q, k, v from its
    projections; inside the kernel autocast is off, so the result equals the same layer fed the
    projections' bf16 outputs without autocast, for every backend."""
    from sparseattn import EdgeAttention

    torch.manual_seed(0)
    g = graphs.batch([graphs.complete(n) for n in (5, 3, 7)])  # with blocks, so "dense" runs too
    attn = EdgeAttention(16, 4, backend=backend, clamp=None)
    x = torch.randn(g.num_dst, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x, g)
    out.float().square().sum().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(x.grad).all()
    with torch.no_grad():
        q, k, v = (
            torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()).view(-1, 4, 4)
            for w, b in zip(attn.in_proj_weight.chunk(3), attn.in_proj_bias.chunk(3))
        )
        ref = edge_attention(q, k, v, g, clamp=None, backend="reference").reshape(-1, 16)
        ref = torch.nn.functional.linear(ref, attn.out_proj.weight.bfloat16(), attn.out_proj.bias.bfloat16())
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        full = attn(x, g)  # float32
    torch.testing.assert_close(out.float(), full, rtol=5e-2, atol=5e-2)
