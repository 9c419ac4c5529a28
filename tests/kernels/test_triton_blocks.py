"""The fused clamp-mode kernel for equal dense blocks (`sparseattn.kernels.dense.triton_blocks`, the
dense backend's CUDA path) against the independent dense reference: values and gradients, float32
and half inputs, complete and causal blocks with sizes off the tile grid, and reproducible
gradients. Without CUDA the kernels run in Triton's interpreter (conftest.py sets
TRITON_INTERPRET=1); its bfloat16 products are not usable (numpy has no bfloat16), so bfloat16
runs on a GPU only."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable (pip install triton)")

from sparseattn import edge_attention, graphs  # noqa: E402
from sparseattn.kernels.dense import triton_blocks as tb  # noqa: E402

from ..dense import dense_attention  # noqa: E402
from ..tolerances import assert_close, assert_within_reference_error  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
CLAMP = (-2.0, 2.0)


def blocks(kind, b, lq, lk, heads, d, dv, dtype, size=1.5, seed=0):
    """(graph, q, k, v, views): b blocks as one graph and the kernel's (B, H, L, D) views of the rows."""
    g = graphs.from_blocks([(kind, lk, lq)] * b, device=DEVICE)
    gen = torch.Generator().manual_seed(seed)
    q = (size * torch.randn(b * lq, heads, d, generator=gen)).to(DEVICE, dtype)
    k = (size * torch.randn(b * lk, heads, d, generator=gen)).to(DEVICE, dtype)
    v = torch.randn(b * lk, heads, dv, generator=gen).to(DEVICE, dtype)
    return g, q, k, v


def views(q, k, v, b):
    return tuple(x.view(b, x.shape[0] // b, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))


CASES = [  # kind, B, Lq, Lk, H, D, Dv: off the 64-row tiles, Dv != D, non-power-of-2 widths
    ("full", 2, 37, 70, 3, 20, 9),
    ("full", 1, 130, 5, 2, 16, 16),
    ("causal", 2, 70, 70, 2, 16, 24),
    ("causal", 3, 1, 1, 1, 8, 8),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, b, lq, lk, heads, d, dv", CASES)
def test_values_and_gradients_equal_the_dense_reference(dtype, kind, b, lq, lk, heads, d, dv):
    g, q, k, v = blocks(kind, b, lq, lk, heads, d, dv, dtype)
    scale = 0.5
    scores = torch.einsum("thd,shd->ths", q.double(), k.double()) * scale
    assert (scores.abs() > CLAMP[1]).any() and (scores.abs() < CLAMP[1]).any()  # the clamp binds somewhere
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = tb.block_clamp_attention(*views(q, k, v, b), scale=scale, clamp=CLAMP, causal=kind == "causal")
    assert out.shape == (b, heads, lq, dv) and out.dtype == dtype
    out = out.transpose(1, 2).reshape(b * lq, heads, dv)
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    gold = dense_attention(qd, kd, vd, g.edge_index, scale=scale, clamp=CLAMP)
    d_out = torch.randn(gold.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), d_out.to(dtype))
    golds = torch.autograd.grad(gold, (qd, kd, vd), d_out)
    if dtype == torch.float32:
        assert_close(out, gold, dtype, "out")
        for name, a, b_ in zip("qkv", grads, golds):
            assert_close(a, b_, dtype, f"d{name}")
        return
    # half inputs: within a few times the error of the reference backend run in the same dtype
    qh, kh, vh = (x.detach().requires_grad_() for x in (q, k, v))
    ref = edge_attention(qh, kh, vh, g, scale=scale, clamp=CLAMP, backend="reference")
    refs = torch.autograd.grad(ref, (qh, kh, vh), d_out.to(dtype))
    assert_within_reference_error(out, ref, gold, factor=4.0, what="out")
    for name, a, r, b_ in zip("qkv", grads, refs, golds):
        assert_within_reference_error(a, r, b_, factor=4.0, what=f"d{name}")


def test_gradients_are_reproducible_and_laid_out_like_the_rows():
    g, q, k, v = blocks("causal", 2, 70, 70, 2, 16, 16, torch.float32)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def grads():
        out = tb.block_clamp_attention(*views(q, k, v, 2), scale=0.5, clamp=CLAMP, causal=True)
        return torch.autograd.grad((out * out).sum(), (q, k, v))

    first, second = grads(), grads()
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert all(a.is_contiguous() for a in first)  # (B, L, H, D) underneath: no copy back to rows


def test_double_backward_matches_the_recomputation():
    _, q, k, v = blocks("full", 1, 9, 11, 1, 8, 8, torch.float32, seed=3)
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    out = tb.block_clamp_attention(*views(q32, k32, v32, 1), scale=0.5, clamp=CLAMP, causal=False)
    (dq,) = torch.autograd.grad(out.square().sum(), (q32,), create_graph=True)
    (ddk,) = torch.autograd.grad(dq.square().sum(), (k32,))
    again = tb.recompute(*views(q, k, v, 1), 0.5, *CLAMP, False)
    (dq64,) = torch.autograd.grad(again.square().sum(), (q,), create_graph=True)
    (ddk64,) = torch.autograd.grad(dq64.square().sum(), (k,))
    assert torch.allclose(ddk.double(), ddk64, atol=1e-4, rtol=1e-4)


def test_causal_blocks_must_be_square_and_runs_names_what_it_takes():
    _, q, k, v = blocks("full", 1, 4, 6, 1, 8, 8, torch.float32)
    with pytest.raises(ValueError, match="square"):
        tb.block_clamp_attention(*views(q, k, v, 1), scale=1.0, clamp=CLAMP, causal=True)
    qb, kb, vb = views(q, k, v, 1)
    assert tb.runs(qb, kb, vb)
    assert not tb.runs(qb.double(), kb.double(), vb.double())
    assert not tb.runs(qb[..., :0], kb[..., :0], vb)
    wide = torch.zeros(1, 1, 4, tb.MAX_HEAD_DIM + 1, device=DEVICE)
    assert not tb.runs(wide, wide, vb)
