"""Double backward (create_graph=True, e.g. a gradient penalty) is correct for every CPU backend and
"auto": float64 gradgradcheck in both clamp modes with a bias, and a gradient penalty against the
reference backend and the independent dense reference. The triton backend's test is in test_triton.py."""

import pytest
import torch

import sparseattn.kernels.reference as reference
from sparseattn import Graph, edge_attention, graphs
from sparseattn.kernels import choose_auto
from sparseattn.kernels.contract import AttentionInputs
from sparseattn.kernels.csr import csr_attention
from sparseattn.kernels.dense import dense_attention as dense_kernel

from ..dense import dense_attention
from ..optional import backend_param, backend_params

CLAMPS = [(-5.0, 5.0), None]
BACKENDS = backend_params(exclude=["reference"]) + [backend_param("auto")]


def small_graph(backend):
    """dense needs recorded blocks: a causal block without self-loops (its first destination has no
    in-edges) and a 2 -> 3 cross block. The others get unsorted edges with a duplicate (1 -> 1 twice)
    and destination 3 without in-edges."""
    if backend == "dense":
        return graphs.from_blocks([("causal_no_self", 3, 3), ("full", 2, 3)])
    return Graph(torch.tensor([[0, 2, 1, 1, 3, 0], [1, 0, 1, 1, 2, 4]]), num_src=4, num_dst=5)


def inputs(g, heads=2, d=3, dv=2, seed=0):
    """float64 leaves q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv) and a bias table
    (N_dst, N_src, H); an edge's bias is table[t, s], so duplicate edges share it (as in tests/dense.py)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(g.num_dst, heads, d), (g.num_src, heads, d), (g.num_src, heads, dv), (g.num_dst, g.num_src, heads)]
    return [torch.randn(*s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]


def test_auto_takes_the_small_path_on_these_graphs():
    assert choose_auto(torch.zeros(1, 1, 1), small_graph("auto")) == "small"


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradgradcheck(backend, clamp):
    g = small_graph(backend)
    q, k, v, table = inputs(g)
    bias = table[g.dst, g.src].detach().requires_grad_()  # (E, H)

    def f(q, k, v, bias):
        return edge_attention(q, k, v, g, scale=0.7, clamp=clamp, bias=bias, backend=backend, return_weights=True)

    assert torch.autograd.gradgradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", [csr_attention, dense_kernel])
def test_gradgradcheck_with_clamp_active_and_dropout(kernel):
    """Tight bounds put scores on both sides of the clamp; the dropout mask is a constant."""
    g = small_graph("dense" if kernel is dense_kernel else "csr")
    q, k, v, table = inputs(g, seed=1)
    bias = table[g.dst, g.src].detach().requires_grad_()
    mask = (torch.rand(g.num_edges, 2, generator=torch.Generator().manual_seed(2)) > 0.3).double() / 0.7
    score = 0.7 * (k[g.src] * q[g.dst]).sum(-1) + bias
    assert (score.abs() > 0.3).any() and (score.abs() < 0.3).any()  # the clamp is both active and inactive

    def f(q, k, v, bias):
        return kernel(AttentionInputs(q, k, v, g, 0.7, (-0.3, 0.3), bias, mask, True))

    assert torch.autograd.gradgradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-6)


def penalized_grads(attention, clamp, q, k, v, table):
    """Gradients for q, k, v, table of loss + |d loss/dq|^2 + |d loss/dk|^2, loss = <out, c> with a
    constant c: the penalty's gradient is all second-order terms."""
    out = attention(q, k, v, clamp, table)
    c = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    loss = (out * c).sum()
    gq, gk = torch.autograd.grad(loss, (q, k), create_graph=True)
    return torch.autograd.grad(loss + gq.square().sum() + gk.square().sum(), (q, k, v, table))


def edge_backend(backend, g):
    return lambda q, k, v, clamp, table: edge_attention(
        q, k, v, g, clamp=clamp, bias=table[g.dst, g.src], backend=backend
    )


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_penalty_matches_reference_and_dense(backend, clamp):
    g = small_graph(backend)
    leaves = inputs(g, heads=2, d=4, dv=3, seed=4)
    got = penalized_grads(edge_backend(backend, g), clamp, *leaves)
    ref = penalized_grads(edge_backend("reference", g), clamp, *leaves)
    gold = penalized_grads(
        lambda q, k, v, clamp, table: dense_attention(q, k, v, g.edge_index, clamp=clamp, bias_table=table),
        clamp,
        *leaves,
    )
    for name, a, b, c in zip("q k v bias".split(), got, ref, gold):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name} vs reference")
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10, msg=f"d{name} vs tests/dense.py")


def test_the_penalty_changes_the_gradient():
    """So the check above fails if the second-order terms are dropped."""
    g = small_graph("csr")
    q, k, v, table = inputs(g, heads=2, d=4, dv=3, seed=4)
    with_penalty = penalized_grads(edge_backend("reference", g), None, q, k, v, table)[0]
    out = edge_attention(q, k, v, g, clamp=None, bias=table[g.dst, g.src], backend="reference")
    c = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    first_order = torch.autograd.grad((out * c).sum(), q)[0]
    assert (with_penalty - first_order).norm() > 0.1 * first_order.norm()


@pytest.mark.parametrize("backend", ["csr", "auto"])
def test_first_order_backward_keeps_the_fast_path(backend, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the reference backward ran without create_graph")

    monkeypatch.setattr(reference, "differentiable_grads", fail)
    g = small_graph(backend)
    q, k, v, table = inputs(g)
    out, w = edge_attention(q, k, v, g, bias=table[g.dst, g.src], backend=backend, return_weights=True)
    (out.square().sum() + w.square().sum()).backward()
    assert all(t.grad is not None for t in (q, k, v, table))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_penalty_on_q_alone(backend):
    """Only q trainable (k, v constants): csr used to drop the second-order terms here without an error."""
    g = small_graph(backend)
    q, k, v, table = inputs(g, seed=5)
    k, v, bias = k.detach(), v.detach(), table[g.dst, g.src].detach()
    grads = []
    for name in (backend, "reference"):
        out = edge_attention(q, k, v, g, bias=bias, backend=name)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
        (gq,) = torch.autograd.grad(loss, q, create_graph=True)
        grads.append(torch.autograd.grad(loss + gq.square().sum(), q)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["full", "causal"])
def test_gradgradcheck_of_the_dense_clamp_path(kind):
    """Unpadded complete/causal blocks without bias, dropout or weights take dense's own clamp-mode
    Function (or SDPA for rows the clamp cannot reach): both, with scores on both sides of the bounds."""
    g = graphs.from_blocks([(kind, 4, 4), (kind, 4, 4)])
    assert choose_auto(torch.zeros(1, 64, 512), g) == "dense"  # (at this size, when wide enough not to be "small")
    q, k, v, _ = inputs(g, d=3, dv=2, seed=2)

    def f(q, k, v):
        return edge_attention(q, k, v, g, scale=2.0, clamp=(-1.0, 1.5), backend="dense")

    assert torch.autograd.gradgradcheck(f, (q, k, v), eps=1e-6, atol=1e-6)
    torch.testing.assert_close(f(q, k, v), dense_attention(q, k, v, g.edge_index, scale=2.0, clamp=(-1.0, 1.5)))
