"""The sparse-call helpers the csr kernels share."""

import pytest
import torch

from sparseattn.kernels.sparse_calls import exp_shifted_


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
