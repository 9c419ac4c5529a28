"""GATv2's score op (sparseattn.kernels.scores): the chunked autograd Function against the plain-torch
reference and a per-edge loop, values and gradients of every input in float64, across chunk sizes,
slopes, edge features, shared and bipartite node sets, empty edge sets and double backward."""

import itertools

import pytest
import torch

from sparseattn.kernels.scores import default_chunk, gatv2_scores, gatv2_scores_reference

H, C, F = 3, 4, 2


def make(num_src, num_dst, num_edges, edge_features=True, seed=0):
    """float64 leaves x_l (N_src, H, C), x_r (N_dst, H, C), att (H, C)[, edge_attr (E, F), edge_weight
    (H * C, F)] and a random edge_index (2, E) with repeated edges."""
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    leaves = {"x_l": leaf(num_src, H, C), "x_r": leaf(num_dst, H, C), "att": leaf(H, C)}
    if edge_features:
        leaves.update(edge_attr=leaf(num_edges, F), edge_weight=leaf(H * C, F))
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    dst = torch.randint(0, num_dst, (num_edges,), generator=gen)
    return leaves, torch.stack([src, dst])


def call(fn, leaves, edge_index, slope, **kw):
    return fn(
        leaves["x_l"],
        leaves["x_r"],
        edge_index,
        leaves["att"],
        slope,
        leaves.get("edge_attr"),
        leaves.get("edge_weight"),
        **kw,
    )


def grads(out, leaves, proj):
    return dict(zip(leaves, torch.autograd.grad((out * proj).sum(), list(leaves.values()))))


def test_the_reference_is_the_formula():
    """gatv2_scores_reference against a loop over edges and heads of att . LeakyReLU(x_l[j] + x_r[i] + W e)."""
    leaves, edge_index = make(4, 3, 7)
    got = call(gatv2_scores_reference, leaves, edge_index, 0.3)
    w = leaves["edge_weight"].view(H, C, F)
    for e, (j, i) in enumerate(edge_index.t().tolist()):
        for h in range(H):
            s = leaves["x_l"][j, h] + leaves["x_r"][i, h] + w[h] @ leaves["edge_attr"][e]
            expected = (leaves["att"][h] * torch.where(s > 0, s, 0.3 * s)).sum()
            torch.testing.assert_close(got[e, h], expected, rtol=0, atol=1e-12)


CASES = list(
    itertools.product(
        [1, 5, 7, 30, 200, None],  # edges per chunk: 1, uneven splits of 30 edges, one chunk, more than E, default
        [0.2, 0.0, 1.0, -0.5],  # negative_slope (1.0: linear, -0.5: non-monotone)
        [True, False],  # edge features
    )
)


@pytest.mark.parametrize("chunk,slope,edge_features", CASES)
def test_fast_op_equals_the_reference(chunk, slope, edge_features):
    leaves, edge_index = make(6, 4, 30, edge_features, seed=1)
    out = call(gatv2_scores, leaves, edge_index, slope, chunk=chunk)
    ref = call(gatv2_scores_reference, leaves, edge_index, slope)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    proj = torch.randn_like(ref)
    got, expected = grads(out, leaves, proj), grads(ref, leaves, proj)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-12, msg=f"d/d{name}")


def test_shared_node_features():
    """x_r is x_l (GATv2's share_weights on one node set): both gathers' gradients reach x_l."""
    leaves, edge_index = make(5, 5, 40, seed=2)
    leaves["x_r"] = leaves["x_l"]
    out = call(gatv2_scores, leaves, edge_index, 0.2, chunk=9)
    ref = call(gatv2_scores_reference, leaves, edge_index, 0.2)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    shared = {k: v for k, v in leaves.items() if k != "x_r"}
    proj = torch.randn_like(ref)
    got, expected = grads(out, shared, proj), grads(ref, shared, proj)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-12, msg=f"d/d{name}")


@pytest.mark.parametrize("num_src,num_dst", [(1, 9), (9, 1), (3, 3)])
def test_gradcheck_and_second_derivatives(num_src, num_dst):
    """torch.autograd.gradcheck and gradgradcheck (the backward under create_graph=True goes through
    the reference) on bipartite sizes, chunks splitting the edges unevenly."""
    leaves, edge_index = make(num_src, num_dst, 11, seed=3)
    names = list(leaves)

    def fn(*tensors):
        return call(gatv2_scores, dict(zip(names, tensors)), edge_index, 0.3, chunk=4)

    assert torch.autograd.gradcheck(fn, tuple(leaves.values()))
    assert torch.autograd.gradgradcheck(fn, tuple(leaves.values()))


def test_only_some_inputs_need_gradients():
    leaves, edge_index = make(5, 4, 20, seed=4)
    for name in leaves:
        frozen = {k: (v if k == name else v.detach()) for k, v in leaves.items()}
        out = call(gatv2_scores, frozen, edge_index, 0.2, chunk=6)
        ref = call(gatv2_scores_reference, frozen, edge_index, 0.2)
        proj = torch.randn_like(ref)
        (got,) = torch.autograd.grad((out * proj).sum(), [frozen[name]])
        (expected,) = torch.autograd.grad((ref * proj).sum(), [frozen[name]])
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12, msg=f"d/d{name}")


@pytest.mark.parametrize("edge_features", [True, False])
def test_no_edges(edge_features):
    leaves, edge_index = make(3, 2, 0, edge_features)
    out = call(gatv2_scores, leaves, edge_index, 0.2)
    assert out.shape == (0, H)
    out.sum().backward()
    for name, t in leaves.items():
        assert t.grad is not None and not t.grad.any(), name


class _LargestSaved(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self) -> None:
        self.largest = 0
        super().__init__(self.pack, lambda t: t)

    def __enter__(self):
        super().__enter__()
        return self

    def pack(self, t):
        self.largest = max(self.largest, t.numel())
        return t


def test_saves_no_edge_by_channel_tensor():
    """The reference keeps (E, H, C) tensors for backward; the op keeps its inputs only."""
    leaves, edge_index = make(8, 8, 400, seed=5)
    with _LargestSaved() as saved_ref:
        call(gatv2_scores_reference, leaves, edge_index, 0.2)
    with _LargestSaved() as saved:
        call(gatv2_scores, leaves, edge_index, 0.2, chunk=16)
    assert saved_ref.largest >= 400 * H * C
    assert saved.largest <= 2 * 400  # edge_index (2, E) and edge_attr (E, F)


def test_float32_matches_float64():
    leaves, edge_index = make(50, 40, 2000, seed=6)
    ref = call(gatv2_scores_reference, leaves, edge_index, 0.2)
    low = {k: v.detach().float() for k, v in leaves.items()}
    out = call(gatv2_scores, low, edge_index, 0.2, chunk=300)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)


def test_default_chunk_and_errors():
    assert default_chunk(8, 64, torch.device("cpu")) == 2**20 // 512
    assert default_chunk(8, 64, torch.device("cuda")) == 2**27 // 512
    assert default_chunk(1 << 12, 1 << 12, torch.device("cpu")) == 1
    leaves, edge_index = make(3, 3, 5)
    with pytest.raises(ValueError, match="chunk must be a positive number of edges, got 0"):
        call(gatv2_scores, leaves, edge_index, 0.2, chunk=0)
    with pytest.raises(ValueError, match="att must be"):
        gatv2_scores(leaves["x_l"], leaves["x_r"], edge_index, leaves["att"][:, :2])
    with pytest.raises(ValueError, match="edge_attr and edge_weight go together"):
        gatv2_scores(leaves["x_l"], leaves["x_r"], edge_index, leaves["att"], edge_attr=leaves["edge_attr"])
    with pytest.raises(ValueError, match="x_l and x_r must be"):
        gatv2_scores(leaves["x_l"], leaves["x_r"][:, :2], edge_index, leaves["att"])
