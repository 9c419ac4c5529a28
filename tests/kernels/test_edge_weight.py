"""edge_attention's edge_weight: multipliers of the normalized weights after the softmax (PyG's
explainer masks), against dense masked attention (tests/dense.py) in float64, values and gradients
of every input, and the rules of who computes it (the reference only: "auto" picks it, other
names are refused before any work)."""

import pytest
import torch

from sparseattn import edge_attention
from sparseattn.functional import check_arguments

from ..dense import dense_attention

# 7 nodes, 16 edges: a repeated edge (0 -> 1 twice), a self loop (3 -> 3), node 6 receives nothing
EDGE_INDEX = torch.tensor(
    [[0, 0, 1, 2, 3, 4, 5, 6, 2, 4, 6, 3, 5, 1, 0, 6], [1, 1, 2, 3, 3, 5, 0, 0, 4, 2, 1, 4, 1, 5, 2, 3]]
)
N, H, D, DV = 7, 2, 4, 3


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(N, H, D, dtype=torch.float64, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(N, H, DV, dtype=torch.float64, generator=g).requires_grad_()
    return q, k, v, g


def message_table(weight):
    """(N_dst, N_src, H): the sum of each pair's edge multipliers (duplicates add)."""
    table = torch.zeros(N, N, H, dtype=torch.float64)
    return table.index_put((EDGE_INDEX[1], EDGE_INDEX[0]), weight, accumulate=True)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("clamp", [None, (-5.0, 5.0)])
def test_edge_weight_scales_each_normalized_weight_as_dense_attention_does(per_head, clamp):
    q, k, v, g = inputs()
    shape = (EDGE_INDEX.shape[1], H) if per_head else (EDGE_INDEX.shape[1],)
    weight = torch.rand(shape, dtype=torch.float64, generator=g).requires_grad_()
    out, alpha = edge_attention(q, k, v, EDGE_INDEX, clamp=clamp, edge_weight=weight, return_weights=True)
    table = message_table(weight if per_head else weight.unsqueeze(1).expand(-1, H))
    expected = dense_attention(q, k, v, EDGE_INDEX, clamp=clamp, message_table=table)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn(N, H, DV, dtype=torch.float64, generator=g)
    got = torch.autograd.grad(out, (q, k, v, weight), grad)
    want = torch.autograd.grad(expected, (q, k, v, weight), grad)
    for a, b, name in zip(got, want, ("q", "k", "v", "edge_weight")):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    plain, plain_alpha = edge_attention(q, k, v, EDGE_INDEX, clamp=clamp, return_weights=True)
    torch.testing.assert_close(alpha, plain_alpha, rtol=0, atol=0)  # the weights are before edge_weight
    ones = torch.ones(shape, dtype=torch.float64)
    torch.testing.assert_close(edge_attention(q, k, v, EDGE_INDEX, clamp=clamp, edge_weight=ones), plain)


def test_edge_weight_and_dropout_multiply_the_same_weights():
    q, k, v, g = inputs(1)
    weight = torch.rand(EDGE_INDEX.shape[1], dtype=torch.float64, generator=g)
    torch.manual_seed(5)
    both = edge_attention(q, k, v, EDGE_INDEX, dropout_p=0.5, edge_weight=weight)
    torch.manual_seed(5)
    keep = (torch.rand(EDGE_INDEX.shape[1], H) >= 0.5).double() / 0.5  # edge_attention's draw
    expected = edge_attention(q, k, v, EDGE_INDEX, edge_weight=weight[:, None] * keep)
    torch.testing.assert_close(both, expected, rtol=0, atol=1e-15)


def test_only_the_reference_takes_edge_weight_and_a_bad_one_is_named():
    q, k, v, _ = inputs()
    weight = torch.ones(EDGE_INDEX.shape[1], dtype=torch.float64)
    for backend in ("csr", "small", "scatter"):
        with pytest.raises(ValueError, match=f"backend '{backend}' does not take edge_weight"):
            edge_attention(q, k, v, EDGE_INDEX, edge_weight=weight, backend=backend)
        with pytest.raises(ValueError, match="does not take edge_weight"):
            check_arguments(q, k, v, EDGE_INDEX, edge_weight=weight, backend=backend)
    edge_attention(q, k, v, EDGE_INDEX, edge_weight=weight, backend="reference")
    with pytest.raises(ValueError, match=r"edge_weight must have shape \(E, H\) = \(16, 2\) or \(E,\) = \(16,\)"):
        edge_attention(q, k, v, EDGE_INDEX, edge_weight=weight[:5])
    with pytest.raises(ValueError, match="edge_weight must have shape"):
        check_arguments(q, k, v, EDGE_INDEX, edge_weight=weight[:5])
    with pytest.raises(TypeError, match="edge_weight"):
        edge_attention(q, k, v, EDGE_INDEX, edge_weight=weight.long())


def test_a_nan_edge_weight_reaches_only_its_destination():
    """The non-finite contract (tests/kernels/test_non_finite.py) for edge_weight: out is NaN only at
    the destination of the NaN edge; gradients are NaN only in rows that destination connects."""
    q, k, v, g = inputs(2)
    weight = torch.rand(EDGE_INDEX.shape[1], dtype=torch.float64, generator=g)
    bad = 5  # the edge 4 -> 5
    weight[bad] = float("nan")
    weight.requires_grad_()
    out = edge_attention(q, k, v, EDGE_INDEX, clamp=None, edge_weight=weight)
    t = int(EDGE_INDEX[1, bad])
    assert out[t].isnan().all() and torch.isfinite(out[torch.arange(N) != t]).all()
    dq, dk, dv, dw = torch.autograd.grad(out.sum(), (q, k, v, weight))
    touched = EDGE_INDEX[1] == t
    sources = EDGE_INDEX[0, touched].unique()
    assert torch.isfinite(dq[torch.arange(N) != t]).all()
    for grad in (dk, dv):
        assert torch.isfinite(grad[~torch.isin(torch.arange(N), sources)]).all()
    assert torch.isfinite(dw[~touched]).all()
