"""Trainer: exact resume after max_steps and after Ctrl-C, what a checkpoint holds, the best-epoch
score."""

import json

import pytest
import torch

from sparseattn.train.config import config_from_dict
from sparseattn.train.trainer import Trainer, best_score, fused_adam_supported

from .helpers import assert_same_weights, tiny_config, weights


@pytest.mark.parametrize("model", ["transformer", "ut"])
def test_resume_after_max_steps_equals_uninterrupted(tmp_path, model):
    full = Trainer(tiny_config(tmp_path, "full", model=model, num_heads=2))
    assert full.fit() == "finished"
    part = Trainer(tiny_config(tmp_path, "part", model=model, num_heads=2, max_steps=9))  # stops mid epoch 2
    assert part.fit() == "max_steps"
    assert part.position == {"epoch": 1, "batch": 3, "step": 9}
    resumed = Trainer(tiny_config(tmp_path, "part", model=model, num_heads=2), resume=True)
    assert resumed.position["step"] == 9
    assert resumed.fit() == "finished"
    assert_same_weights(weights(full.model), weights(resumed.model))
    assert resumed.optimizer.state_dict()["state"][0]["step"] == full.optimizer.state_dict()["state"][0]["step"]
    lines = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["kind"] == "valid"] == [6, 12]


def test_keyboard_interrupt_saves_checkpoint_and_resume_is_exact(tmp_path, monkeypatch):
    full = Trainer(tiny_config(tmp_path, "full", dropout=0.3))
    full.fit()
    run = Trainer(tiny_config(tmp_path, "run", dropout=0.3))
    calls = {"n": 0}
    original = run.task.loss

    def flaky_loss(model, batch, cfg):
        calls["n"] += 1
        out = original(model, batch, cfg)  # draws dropout masks, then the "Ctrl-C" lands
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(run.task, "loss", flaky_loss)
    assert run.fit() == "interrupted"
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert saved["position"]["step"] == 4  # the last completed step
    resumed = Trainer(tiny_config(tmp_path, "run", dropout=0.3), resume=True)
    resumed.fit()
    assert_same_weights(weights(full.model), weights(resumed.model))


def test_checkpoint_holds_everything_and_writes_atomically(tmp_path):
    t = Trainer(tiny_config(tmp_path, "ck", epochs=1))
    t.fit()
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert "checkpoint.pt" in files and not any(f.endswith(".tmp") for f in files)
    state = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=False)
    for key in ("config", "model", "optimizer", "scheduler", "rng", "position"):
        assert key in state
    cfg = config_from_dict(state["config"])  # the model is rebuilt from the config alone
    assert (cfg.task, cfg.model, cfg.model_cfg.d_model) == ("copy", "transformer", 32)
    rebuilt = cfg.model_cfg.build(t.task.model_info())
    rebuilt.load_state_dict(state["model"])
    assert_same_weights(weights(rebuilt), weights(t.model))


def test_adam_is_torch_s_fused_one_where_the_parameters_allow_and_a_resume_keeps_it(tmp_path):
    t = Trainer(tiny_config(tmp_path, "fused", max_steps=2))
    assert t.optimizer.param_groups[0]["fused"] is True
    assert t.fit() == "max_steps"
    resumed = Trainer(tiny_config(tmp_path, "fused"), resume=True)
    assert resumed.optimizer.param_groups[0]["fused"] is True
    floats = [torch.nn.Parameter(torch.zeros(2))]
    assert fused_adam_supported(floats) and fused_adam_supported(p for p in floats)
    assert not fused_adam_supported([])
    assert not fused_adam_supported(floats + [torch.nn.Parameter(torch.zeros(2, device="meta"))])
    assert not fused_adam_supported([torch.zeros(2, dtype=torch.int64)])


def test_best_score_prefers_task_metrics_and_breaks_ties_by_loss():
    assert best_score({"f1": 0.5, "sequence_accuracy": 0.9, "loss": 1.0}) == (0.5, -1.0)
    assert best_score({"bleu": 20.0, "tf_accuracy": 0.9}) == (20.0, 0.0)
    assert best_score({"sequence_accuracy": 0.7, "tf_accuracy": 0.9, "loss": 0.3}) == (0.7, -0.3)
    assert best_score({"loss": 2.0}) == (-2.0, 0.0)
    assert best_score({"tf_accuracy": 0.9, "loss": 0.5}) > best_score({"tf_accuracy": 0.9, "loss": 0.6})
    assert best_score({"tf_accuracy": 0.91, "loss": 0.9}) > best_score({"tf_accuracy": 0.9, "loss": 0.5})
