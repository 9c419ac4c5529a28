"""A tiny copy-task config and weight comparisons shared by the trainer, CLI and EMA tests."""

import torch

from sparseattn.train.config import make_config

TINY = dict(
    device="cpu",  # weights are compared across runs and with CPU-loaded checkpoints
    num_train=96,
    num_valid=16,
    num_test=16,
    seq_mean=6.0,
    seq_std=1.0,
    batch_size=16,
    d_model=32,
    d_ff=32,
    epochs=2,
    progress=False,
    plots=False,
    eval_decode=False,
    log_every=2,
    warmup=20,
)


def tiny_config(tmp_path, name, **kw):
    """The copy task (transformer unless model= says otherwise) at toy sizes, run dir tmp_path/name."""
    return make_config({**TINY, "out": str(tmp_path / name), **kw})


def flags(**kw):
    return [f"--{k}={v}" for k, v in kw.items()]


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
