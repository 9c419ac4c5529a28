import random

import numpy as np
import pytest
import torch

from sparseattn.train.checkpoint import load, rng_state, save_atomic, set_rng_state


def test_save_atomic_replaces_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "ck.pt"
    save_atomic({"config": {}, "model": {"a": torch.ones(2)}}, path)
    save_atomic({"config": {}, "model": {"a": torch.zeros(2)}}, path)
    assert torch.equal(load(path)["model"]["a"], torch.zeros(2))
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_failed_save_keeps_the_old_file(tmp_path):
    path = tmp_path / "ck.pt"
    save_atomic({"config": {}, "model": {"a": 1}}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(OSError, match=r"could not write .*ck\.pt \(boom\); the previous ck\.pt, if any, is intact"):
        save_atomic({"config": {}, "model": {"a": Unpicklable()}}, path)
    assert load(path) == {"config": {}, "model": {"a": 1}} and [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_rng_state_round_trip():
    state = rng_state()
    first = (torch.rand(3), np.random.rand(), random.random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


def test_load_missing_file_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load(tmp_path / "missing.pt")


def test_load_rejects_a_dict_that_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "other.pt"
    save_atomic({"a": torch.ones(2)}, path)
    with pytest.raises(ValueError, match="is not a sparseattn checkpoint"):
        load(path)
