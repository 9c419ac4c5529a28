"""The sparse-call helpers the csr kernels share."""

import pytest
import torch

from sparseattn.kernels.csr.primitives import exp_shifted_, spmm

from ..tolerances import assert_close


def _rows(offsets):
    return torch.repeat_interleave(torch.arange(len(offsets) - 1), torch.tensor(offsets).diff())


@pytest.mark.parametrize("magnitude", [1.0, 1e4])
def test_numerators_normalize_to_the_row_softmax(magnitude):
    offsets = [0, 3, 3, 7, 8]  # an empty row and a one-edge row
    scores = torch.tensor([0.2, -1.0, 0.9, 1.0, -0.5, 0.1, -0.7, 0.4], dtype=torch.float64) * magnitude
    row = _rows(offsets)
    w = exp_shifted_(scores.clone(), torch.tensor(offsets), row)
    assert torch.isfinite(w).all() and (w > 0).any()
    z = torch.zeros(4, dtype=torch.float64).index_add_(0, row, w)
    want = torch.cat([torch.softmax(scores[a:b], 0) for a, b in zip(offsets[:-1], offsets[1:]) if b > a])
    assert torch.allclose(w / z[row], want, rtol=1e-12, atol=1e-300)


def test_rows_of_only_minus_infinity_get_zero_weights_and_nan_is_not_hidden():
    """(No row max is -inf after the fill, so no -inf - -inf = NaN; a NaN score stays NaN.)"""
    offsets = torch.tensor([0, 2, 4])
    scores = torch.tensor([float("-inf"), float("-inf"), 0.5, 1.5])
    w = exp_shifted_(scores.clone(), offsets, _rows([0, 2, 4]))
    assert w[:2].tolist() == [0.0, 0.0] and torch.allclose(w[2:] / w[2:].sum(), torch.softmax(scores[2:], 0))
    nan = exp_shifted_(torch.tensor([float("nan"), 0.0, 1.0, 2.0]), offsets, _rows([0, 2, 4]))
    assert torch.isnan(nan[0]) and torch.isfinite(nan[2:]).all()


@pytest.mark.parametrize("itype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmm_matches_a_dense_product_on_either_path(itype, dtype):
    """float32 takes the embedding_bag path, float64 the CSR addmm: both give the dense product,
    with empty rows as zeros, alpha applied, and strided out written in place."""
    torch.manual_seed(0)
    offsets = [0, 3, 3, 7, 8, 8]
    col = torch.tensor([0, 2, 5, 1, 1, 3, 4, 5], dtype=itype)  # a duplicate column in row 2
    values = torch.randn(8, dtype=dtype)
    x = torch.randn(6, 5, dtype=dtype)
    dense = torch.zeros(5, 6, dtype=dtype).index_put_((_rows(offsets), col.long()), values, accumulate=True)
    crow = torch.tensor(offsets, dtype=itype)
    got = spmm(crow, col, values, x, (5, 6), alpha=0.5)
    assert_close(got, 0.5 * dense @ x, dtype, "spmm")
    assert got[1].abs().sum() == 0 and got[4].abs().sum() == 0
    out = torch.full((5, 3, 5), float("nan"), dtype=dtype)
    spmm(crow, col, values, x, (5, 6), out=out[:, 1])
    assert_close(out[:, 1], dense @ x, dtype, "spmm into out")
    assert torch.isnan(out[:, 0]).all()


def test_spmm_on_inputs_that_require_grad():
    """The backward calls it, grad disabled, on saved tensors that still require grad."""
    x = torch.randn(4, 3, requires_grad=True)
    values = torch.rand(3, requires_grad=True)
    with torch.no_grad():
        got = spmm(torch.tensor([0, 2, 3]), torch.tensor([1, 3, 0]), values, x, (2, 4))
    assert not got.requires_grad
    assert torch.allclose(got[0], values[0] * x[1] + values[1] * x[3])
