"""The scatter backend (torch_scatter): hand-computed case, gradcheck, and its availability probe."""

import math
import sys

import pytest
import torch

from sparseattn import Graph, edge_attention
from sparseattn.kernels import scatter as scatter_mod
from sparseattn.kernels.contract import AttentionInputs

torch_scatter = pytest.importorskip("torch_scatter", reason="torch_scatter not installed (extra sparseattn[scatter])")


def test_hand_computed_with_a_duplicate_edge():
    q = torch.tensor([[[2.0]]], dtype=torch.float64)
    k = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64)
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64)
    ei = torch.tensor([[1, 0, 1], [0, 0, 0]])
    out = edge_attention(q, k, v, ei, scale=1.0, backend="scatter")
    wa, wb = math.exp(2.0), math.exp(5.0)
    assert out.item() == pytest.approx((wa * 10 + 2 * wb * 20) / (wa + 2 * wb), rel=1e-12)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
def test_gradcheck(clamp):
    gen = torch.Generator().manual_seed(0)
    g = Graph(torch.tensor([[0, 2, 1, 1, 3, 0], [1, 0, 1, 1, 2, 4]]), num_src=4, num_dst=5)
    q = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64).requires_grad_()
    k = torch.randn(4, 2, 3, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(4, 2, 2, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.randn(6, 2, generator=gen, dtype=torch.float64).requires_grad_()

    def f(q, k, v, bias):
        return scatter_mod.scatter_attention(AttentionInputs(q, k, v, g, 0.7, clamp, bias, None, True))

    assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-7)


def test_probe_reports_why_when_torch_scatter_is_missing(monkeypatch):
    assert scatter_mod.probe() is None
    monkeypatch.setitem(sys.modules, "torch_scatter", None)  # makes `import torch_scatter` raise ImportError
    reason = scatter_mod.probe()
    assert reason is not None and "torch_scatter" in reason and "pip install" in reason
