import numpy as np
import pytest

from sparseattn.train.metrics import Meter, sequence_accuracy, token_accuracy


def test_token_accuracy_counts_missing_and_extra_tokens_as_errors():
    assert token_accuracy([[1, 2, 3]], [[1, 2, 3]]) == 1.0
    assert token_accuracy([[1, 2]], [[1, 2, 3]]) == pytest.approx(2 / 3)
    assert token_accuracy([[1, 2, 3, 4]], [[1, 2, 3]]) == pytest.approx(3 / 4)
    assert token_accuracy([[1, 9, 3], [5]], [[1, 2, 3], [5]]) == pytest.approx(3 / 4)


def test_sequence_accuracy_is_exact_match():
    assert sequence_accuracy([[1, 2], [3]], [[1, 2], [3, 4]]) == 0.5
    with pytest.raises(ValueError, match="references"):
        sequence_accuracy([[1]], [])


def test_meter_sums_numbers_and_arrays():
    m = Meter()
    m.add({"loss": 4.0, "tokens": 2, "correct": 1, "hist": np.array([0, 1, 1])})
    m.add({"loss": 2.0, "tokens": 2, "correct": 2, "hist": np.array([0, 2, 0])})
    s = m.summary()
    assert s["loss"] == 1.5 and s["accuracy"] == 0.75 and s["hist"] == [0, 3, 1] and s["tokens"] == 4
