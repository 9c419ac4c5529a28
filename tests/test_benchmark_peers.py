"""The torch_geometric peer of benchmarks/bench_kernels.py computes what sparseattn's exact-mode
reference computes (TransformerConv's attention on the same q, k, v and edges)."""

import pytest
import torch

from sparseattn import edge_attention, graphs

pytest.importorskip("torch_geometric", reason="torch_geometric is not installed: the benchmark peer is skipped too")


def test_torch_geometric_peer_matches_exact_reference():
    from benchmarks.peers import DIM, HEADS, make_pyg, pyg_label

    g = graphs.random(40, 30, 300, seed=0)
    q, k, v = (torch.randn(n, HEADS, DIM, dtype=torch.float64) * 2 for n in (g.num_dst, g.num_src, g.num_src))
    fn, _, label = make_pyg(g, q, k, v)
    out = fn()
    ref = edge_attention(q, k, v, g, clamp=None, backend="reference")
    assert label == pyg_label() and label.startswith("torch_geometric ")
    assert out.shape == ref.shape == (g.num_dst, HEADS, DIM)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_torch_geometric_peer_gradients_match():
    from benchmarks.peers import DIM, HEADS, make_pyg

    g = graphs.window(32, 3)
    leaves = [torch.randn(32, HEADS, DIM, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    gout = torch.randn(32, HEADS, DIM, dtype=torch.float64)
    make_pyg(g, *leaves)[0]().backward(gout)
    peer = [x.grad for x in leaves]
    for x in leaves:
        x.grad = None
    edge_attention(*leaves, g, clamp=None, backend="reference").backward(gout)
    for a, x in zip(peer, leaves):
        torch.testing.assert_close(a, x.grad, rtol=1e-9, atol=1e-9)
