"""The redesign moved every model and task; these short float64 runs, recorded before it
(tests/golden_runs.py), must still give the same losses, metrics, decoded outputs and weights, to
golden_runs.RTOL, on any CPU."""

import json

import pytest

from sparseattn.models.tagger import current_key

from . import golden_runs

GOLDEN = json.loads(golden_runs.GOLDEN.read_text())


@pytest.mark.parametrize("case", sorted(golden_runs.CASES))
def test_golden_run_is_unchanged(case):
    want, got = dict(GOLDEN[case]), golden_runs.run_case(case)
    # tagger layers renamed their attention and feed-forward (attn -> self_attn, ffn -> ff)
    want["weights"] = {current_key(k): v for k, v in want["weights"].items()}
    assert golden_runs.compare(want, got) == []


def test_compare_catches_what_it_should():
    want = {"loss": [1.0, 2.0], "decoded": [[3, 4]], "w": {"a": [0.5, -0.25]}}
    assert golden_runs.compare(want, want) == []
    assert golden_runs.compare(want, {**want, "loss": [1.0, 2.0 * (1 + 0.5 * golden_runs.RTOL)]}) == []
    assert golden_runs.compare(want, {**want, "loss": [1.0, 2.0 * (1 + 3 * golden_runs.RTOL)]}) != []
    assert golden_runs.compare(want, {**want, "decoded": [[3, 5]]}) == [".decoded[0][1]: 5 != 4"]
    assert golden_runs.compare(want, {**want, "decoded": [[3]]}) != []
    assert golden_runs.compare(want, {"loss": [1.0, 2.0], "decoded": [[3, 4]]}) != []
