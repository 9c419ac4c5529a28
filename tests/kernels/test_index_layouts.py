"""Every backend, triton in Triton's interpreter included, on edge indices in every layout a user
may pass: transposed views of (E, 2) pairs, non-contiguous slices, int32, edges destination-major
or in any order. Values and the q, k, v, bias gradients against the independent float64 dense
reference, and each layout against the contiguous int64 spelling of the same edges."""

import pytest
import torch
from hypothesis import given, settings

from sparseattn import Graph, edge_attention, graphs

from ..dense import dense_attention
from ..optional import backend_param, backend_params
from ..strategies import INDEX_LAYOUTS, graph_cases, laid_out
from ..tolerances import assert_close

# dense needs recorded blocks; triton runs on CPU tensors here only in the interpreter, which conftest
# sets where there is no GPU (with one, test_triton.py runs the compiled kernels on CUDA tensors)
BACKENDS = backend_params(exclude=["dense"])
if not torch.cuda.is_available():
    BACKENDS.append(backend_param("triton", pytest.mark.triton))


def _attention_and_grads(case, graph, backend):
    q, k, v, table = case.tensors(torch.float64)
    ei = case.edge_index
    bias = table[ei[1], ei[0]] if case.use_bias else None
    out = edge_attention(q, k, v, graph, scale=case.scale, clamp=case.clamp, bias=bias, backend=backend)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(case.seed + 1), dtype=torch.float64)
    out.backward(grad_out)
    return out.detach(), [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v, table)], grad_out


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25)
@given(case=graph_cases(max_nodes=7, max_edges=24))
def test_every_layout_matches_the_dense_reference(backend, case):
    out, grads, grad_out = _attention_and_grads(case, case.graph(), backend)
    q, k, v, table = case.tensors(torch.float64)
    gold = dense_attention(
        q, k, v, case.edge_index, scale=case.scale, clamp=case.clamp, bias_table=table if case.use_bias else None
    )
    gold.backward(grad_out)
    assert_close(out, gold.detach(), torch.float64, f"out ({case.layout})")
    for name, g, t in zip("q k v".split(), grads, (q, k, v)):
        assert_close(g, t.grad, torch.float64, f"d{name} ({case.layout})")
    if case.use_bias:
        assert_close(grads[3], table.grad, torch.float64, f"dbias ({case.layout})")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", INDEX_LAYOUTS)
def test_destination_major_pairs_in_every_layout(backend, layout):
    """The case that gave triton outputs off by ~2: destination-major edges listed as pairs, so the
    sorted index the kernel reads is a strided view of the caller's tensor (`pairs.t()`)."""
    g = graphs.window(12, 2)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(12, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    want = edge_attention(q, k, v, g.edge_index, backend="reference")
    got = edge_attention(q, k, v, laid_out(g.edge_index, layout), backend=backend)
    assert_close(got, want, torch.float64, layout)
    got = edge_attention(q, k, v, Graph(laid_out(g.edge_index, layout)), backend=backend)
    assert_close(got, want, torch.float64, f"Graph of {layout}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_editing_the_index_after_building_a_graph_changes_nothing(backend):
    """A Graph keeps its own copy: the caller's tensor may be reused, even with ids far out of
    range (csr once read them through unchecked sparse indices and crashed the process)."""
    ei = graphs.random(9, 8, 30, seed=4).edge_index.clone()
    g = Graph(ei, num_src=9, num_dst=8)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(8, 2, 3, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(9, 2, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    want = edge_attention(q, k, v, ei.clone(), backend="reference")
    ei[0, :5] = torch.tensor([2, 0, 7, 1, 3])  # in range: once a silent wrong answer
    assert_close(edge_attention(q, k, v, g, backend=backend), want, torch.float64, "after an in-range edit")
    ei[0].fill_(10**9)  # far out of range: once a segfault in csr
    assert_close(edge_attention(q, k, v, g, backend=backend), want, torch.float64, "after an out-of-range edit")
