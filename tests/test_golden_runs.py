"""The redesign moved every model and task; these short runs, recorded before it (tests/golden_runs.py),
must still give the same losses, metrics, decoded outputs and weights, bit for bit, at one thread."""

import json

import pytest

from sparseattn.models.tagger import current_key

from . import golden_runs

GOLDEN = json.loads(golden_runs.GOLDEN.read_text())


@pytest.mark.parametrize("case", sorted(golden_runs.CASES))
def test_golden_run_is_unchanged(case):
    want, got = GOLDEN[case], golden_runs.run_case(case)
    assert got["train_loss"] == want["train_loss"]
    assert got["valid"] == want["valid"]
    assert got["test"] == want["test"]
    assert got["decoded"] == want["decoded"]
    # tagger layers renamed their attention and feed-forward (attn -> self_attn, ffn -> ff)
    assert got["weights"] == {current_key(k): v for k, v in want["weights"].items()}
