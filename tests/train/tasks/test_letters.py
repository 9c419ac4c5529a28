import string
from types import SimpleNamespace

import numpy as np
import pytest

from sparseattn.train.tasks import TASKS, get_task
from sparseattn.train.tasks.letters import LetterConfig, letter_sequences


def _cfg(**kw):
    base = dict(src_eos=True, num_train=9000, num_valid=1000, num_test=1000, seq_mean=15.0, seq_std=3.0, data_seed=0)
    return SimpleNamespace(task_cfg=LetterConfig(**{**base, **kw}))


def test_letter_sequences_follow_the_seed_distribution():
    seqs = letter_sequences(9000, seed=0)
    lengths = np.array([len(s) for s in seqs])
    assert lengths.min() >= 1 and abs(lengths.mean() - 14.5) < 0.2  # floor(Normal(15, 3))
    assert set(c for s in seqs for c in s) == set(string.ascii_lowercase)
    assert letter_sequences(5, seed=1) == letter_sequences(5, seed=1) != letter_sequences(5, seed=2)


@pytest.mark.parametrize("name, fn", [("copy", lambda s: s), ("sort", sorted), ("reverse", lambda s: s[::-1])])
def test_tasks_build_splits_and_targets(name, fn):
    task = get_task(name)
    task.setup(_cfg())
    assert [task.num_examples(s) for s in ("train", "valid", "test")] == [9000, 1000, 1000]
    src, tgt = task.splits["train"]
    assert all(s[-1] == task.eos for s in src) and task.src_vocab.itos[task.eos] == "</s>"
    assert all(list(t) == list(fn(list(s[:-1]))) for s, t in zip(src[:200], tgt[:200]))
    assert task.splits["train"][0][:3] != task.splits["test"][0][:3]
    assert task.model_info() == dict(src_vocab_size=29, tgt_vocab_size=29, shared_vocab=True)
    again = get_task(name)
    again.setup(_cfg())
    assert again.splits["test"] == task.splits["test"]


def test_unknown_task_lists_the_registered_ones():
    with pytest.raises(ValueError, match="copy"):
        get_task("nope")
    assert {"copy", "sort", "reverse"} <= set(TASKS)


def test_sources_end_with_eos_only_when_asked():
    task = get_task("copy")
    task.setup(_cfg(src_eos=False, num_train=50, num_valid=5, num_test=5))
    src, tgt = task.splits["train"]
    assert all(list(s) == list(t) for s, t in zip(src, tgt))  # copy: no EOS appended to the source
