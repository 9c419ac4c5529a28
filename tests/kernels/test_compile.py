"""torch.compile and torch.export over the csr custom ops (csr_ops.py) and the dense backend: no
graph break, same values and gradients as the reference. Tiny graphs: each compile takes seconds."""

import pytest
import torch

from sparseattn import edge_attention, graphs, kernels
from sparseattn.kernels import choose_auto
from sparseattn.kernels import csr as csr_module
from sparseattn.kernels.csr_ops import csr_forward, head_major_forward_op, prepare


def _inputs(g, heads=2, dim=4, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randn(n, heads, dim, generator=gen, dtype=dtype).requires_grad_()
        for n in (g.num_dst, g.num_src, g.num_src)
    ]


@pytest.mark.parametrize("layout", ["interleaved", "head-major"])
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_no_graph_break_and_compiled_equals_reference(backend, layout, monkeypatch):
    """aot_eager traces forward and backward through AOTAutograd like inductor, without codegen (~1 min
    here). Both csr layouts: the automatic choice is forced one way or the other."""
    monkeypatch.setattr(csr_module, "prefers_head_major", lambda *args: layout == "head-major")
    g = graphs.window(30, 3)
    prepare(g, 2)
    q, k, v = _inputs(g)
    bias = torch.randn(g.num_edges, 2, requires_grad=True)

    def fn(q, k, v, bias):
        out, w = edge_attention(q, k, v, g, bias=bias, return_weights=True)
        return out, w

    explained = torch._dynamo.explain(fn)(q, k, v, bias)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    out, w = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v, bias)
    ref, ref_w = edge_attention(q, k, v, g, bias=bias, return_weights=True, backend="reference")
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(w, ref_w, atol=1e-6)
    grads = torch.autograd.grad((out * ref.detach()).sum() + (w * ref_w.detach()).sum(), (q, k, v, bias))
    want = torch.autograd.grad((ref * ref.detach()).sum() + (ref_w * ref_w.detach()).sum(), (q, k, v, bias))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, want))


def test_export_traces_the_ops():
    g = graphs.random(12, 10, 40, seed=1)
    prepare(g, 2)
    q, k, v = (x.detach() for x in _inputs(g))

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return edge_attention(q, k, v, g, clamp=None)

    ep = torch.export.export(M(), (q, k, v))
    targets = [str(n.target) for m in ep.graph_module.modules() if hasattr(m, "graph") for n in m.graph.nodes]
    assert "sparseattn.csr_forward.default" in targets  # (inside the autocast-off region)
    assert torch.allclose(ep.module()(q, k, v), edge_attention(q, k, v, g, clamp=None, backend="reference"), atol=1e-6)


@pytest.mark.parametrize("layout", ["interleaved", "head-major"])
@pytest.mark.parametrize("clamp", [[-0.5, 0.5], None])
def test_ops_gradcheck(clamp, layout):
    """The custom ops' autograd rule in float64, called directly (the path compiled code takes;
    unsorted edges, so the caller-order conversions run too), and the forward op's schema, fake
    kernel and autograd registration (opcheck: ~8 s for the interleaved op, so in clamp mode only)."""
    from sparseattn.kernels.csr import _pattern
    from sparseattn.kernels.csr_head_major import head_major_pattern
    from sparseattn.kernels.csr_ops import csr_op_attention, csr_op_head_major_attention, index_args

    g = graphs.random(5, 4, 14, seed=2)
    prepare(g, 2)
    q, k, v = _inputs(g, dim=3, dtype=torch.float64)
    bias = torch.randn(g.num_edges, 2, dtype=torch.float64, requires_grad=True)
    attention = csr_op_head_major_attention if layout == "head-major" else csr_op_attention

    def f(q, k, v, bias):
        return attention(q, k, v, g, 0.8, clamp, bias, None, True)

    assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-7)
    if layout == "head-major":
        hm = head_major_pattern(g)
        args = (q, k, v, *index_args(hm), hm.to_sorted(bias), None, 0.8, clamp, True)
        torch.library.opcheck(head_major_forward_op, args)
    elif clamp is not None:
        flat = (t.reshape(-1, 3) for t in (q, k, v))
        args = (*flat, *index_args(_pattern(g, 2)), bias.reshape(-1), None, 0.8, clamp, True)
        torch.library.opcheck(csr_forward, args)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["full", "causal"])
@pytest.mark.parametrize("clamp", [(-0.5, 0.5), (-5.0, 5.0), None], ids=["binds", "cannot-bind", "exact"])
def test_dense_no_graph_break_and_compiled_equals_reference(backend, kind, clamp):
    """The dense backend ("auto" takes it here). Compiled, its clamp mode runs every row through
    DenseClampAttention instead of routing rows to SDPA on their data as eager mode does."""
    g = graphs.from_blocks([(kind, 16, 16)] * 4)
    kernels.prepare(g, 2)  # dense's plan (and csr's index, unused here)
    q, k, v = _inputs(g)
    assert choose_auto(q, g) == "dense"

    def fn(q, k, v):
        return edge_attention(q, k, v, g, clamp=clamp)

    explained = torch._dynamo.explain(fn)(q, k, v)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    out = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v)
    ref = edge_attention(q, k, v, g, clamp=clamp, backend="reference")
    assert torch.allclose(out, ref, atol=1e-5)
    grads = torch.autograd.grad((out * ref.detach()).sum(), (q, k, v))
    want = torch.autograd.grad((ref * ref.detach()).sum(), (q, k, v))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, want))
