"""Training CLI: config parsing, a tiny copy run that learns, exact resume, Ctrl-C checkpoints,
evaluate --json and plot."""
import json

import pytest
import torch

from sparseattn.__main__ import main
from sparseattn.config import TrainConfig, make_config, parse_overrides
from sparseattn.train import Trainer
from tests.single_thread import one_thread  # noqa: F401  (autouse: one torch thread)

TINY = dict(num_train=96, num_valid=16, num_test=16, seq_mean=6.0, seq_std=1.0, batch_size=16, d_model=32, d_ff=32,
            epochs=2, progress=False, plots=False, eval_decode=False, log_every=2, warmup=20)


def tiny_config(tmp_path, name, **kw):
    return make_config({**TINY, "out": str(tmp_path / name), **kw})


def test_overrides_are_typed_and_unknown_keys_rejected():
    over = parse_overrides(["--epochs=3", "--dropout", "0.2", "--progress=false", "--plots", "--task=sort"])
    assert over == {"epochs": 3, "dropout": 0.2, "progress": False, "plots": True, "task": "sort"}
    with pytest.raises(ValueError, match="unknown config key 'epoch'"):
        parse_overrides(["--epoch=3"])
    with pytest.raises(ValueError, match="expects int"):
        parse_overrides(["--epochs=x"])


def test_presets_apply_before_overrides():
    cfg = make_config({})  # copy + transformer: the seed's demo model
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.d_ff) == (1, 128, 1, 128) and cfg.batch_size == 16
    cfg = make_config({"task": "sort", "model": "ut", "num_heads": 2})
    assert cfg.d_ff == 1024 and cfg.num_heads == 2 and cfg.act_max_steps == 8


def test_cli_rejects_unknown_key(tmp_path):
    with pytest.raises(SystemExit, match="unknown config key 'bogus'"):
        main(["train", "--out", str(tmp_path / "x"), "--bogus=1"])


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


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
    _assert_same_weights(_weights(full.model), _weights(resumed.model))
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
    _assert_same_weights(_weights(full.model), _weights(resumed.model))


def test_checkpoint_holds_everything_and_writes_atomically(tmp_path):
    t = Trainer(tiny_config(tmp_path, "ck", epochs=1))
    t.fit()
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert "checkpoint.pt" in files and not any(f.endswith(".tmp") for f in files)
    state = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=False)
    for key in ("config", "model_name", "model_kwargs", "model", "optimizer", "scheduler", "rng", "position"):
        assert key in state
    assert TrainConfig(**state["config"]).d_model == 32


def test_tiny_copy_run_learns_then_evaluate_and_plot(tmp_path, capsys):
    out = tmp_path / "copy"
    args = ["train", "--task=copy", f"--out={out}", "--num_train=1500", "--num_valid=50", "--num_test=100",
            "--seq_mean=5", "--seq_std=1", "--batch_size=16", "--d_model=64", "--d_ff=64", "--epochs=3",
            "--warmup=100", "--progress=false", "--dropout=0", "--eval_decode=false"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "test: token accuracy" in printed and "plots:" in printed and "loss.png" in printed
    assert (out / "plots" / "loss.png").stat().st_size > 1000
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["token_accuracy"] > 0.6, metrics  # chance is 1/26; ~0.88 measured
    assert metrics["sequence_accuracy"] > 0.3, metrics  # ~0.78 measured
    plot_dir = tmp_path / "plots"
    assert main(["plot", "--checkpoint", str(out / "checkpoint.pt"), "--out", str(plot_dir)]) == 0
    assert {p.name for p in plot_dir.glob("*.png")} == {"attention_encoder.png", "attention_decoder.png",
                                                        "attention_cross.png"}


def _flags(**kw):
    return [f"--{k}={v}" for k, v in kw.items()]


def test_time_budget_stops_mid_epoch_then_validates_tests_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Trainer, "elapsed", lambda self: 10.0 * self.position["step"])  # a clock: 10 s per step
    out = tmp_path / "budget"
    assert main(["train", *_flags(**TINY), f"--out={out}", "--time_budget_min=0.5"]) == 0  # 30 s: 3 of 6 steps
    assert "time budget of 0.5 min reached at step 3 (epoch 1, cut short)" in capsys.readouterr().err
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "valid"] == [3]  # the cut-short epoch is validated
    assert [r["step"] for r in records if r["kind"] == "test"] == [3]
    assert json.loads((out / "results.json").read_text())["best_epoch"] == 1
    # a larger budget goes on with the next epoch (6 batches) and ends at epochs=2
    assert main(["train", f"--out={out}", "--resume", "--time_budget_min=0"]) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["position"] == {"epoch": 2, "batch": 0, "step": 9}
    # a resume whose budget is already spent trains no step
    assert main(["train", f"--out={out}", "--resume", "--epochs=5", "--time_budget_min=0.5"]) == 0
    assert torch.load(out / "checkpoint.pt", weights_only=False)["position"]["step"] == 9


def test_best_score_prefers_task_metrics_and_breaks_ties_by_loss():
    from sparseattn.train import best_score
    assert best_score({"f1": 0.5, "sequence_accuracy": 0.9, "loss": 1.0}) == (0.5, -1.0)
    assert best_score({"bleu": 20.0, "tf_accuracy": 0.9}) == (20.0, 0.0)
    assert best_score({"sequence_accuracy": 0.7, "tf_accuracy": 0.9, "loss": 0.3}) == (0.7, -0.3)
    assert best_score({"loss": 2.0}) == (-2.0, 0.0)
    assert best_score({"tf_accuracy": 0.9, "loss": 0.5}) > best_score({"tf_accuracy": 0.9, "loss": 0.6})
    assert best_score({"tf_accuracy": 0.91, "loss": 0.9}) > best_score({"tf_accuracy": 0.9, "loss": 0.5})


def test_renamed_config_keys_load_from_old_checkpoints():
    from sparseattn.config import config_from_checkpoint
    old = {**TrainConfig().to_dict(), "task": "chunking"}
    old["batch_tokens"] = old.pop("max_tokens") + 500
    assert config_from_checkpoint(old).max_tokens == 500


def test_compare_plots_runs_and_names_bad_arguments(tmp_path, capsys):
    for name in ("a", "b"):
        Trainer(tiny_config(tmp_path, name, seed=len(name))).fit()
    png = tmp_path / "cmp" / "acc.png"
    assert main(["compare", "--run", f"A={tmp_path / 'a'}", "--run", f"B={tmp_path / 'b'}",
                 "--metric", "tf_accuracy", "--output", str(png)]) == 0
    assert png.stat().st_size > 1000
    err = tmp_path / "cmp" / "err.png"
    assert main(["compare", "--run", f"A={tmp_path / 'a'}", "--metric", "tf_accuracy", "--error", "--output", str(err)]) == 0
    assert err.stat().st_size > 1000
    with pytest.raises(SystemExit, match="--metric 'loss'.*needs a metric in \\[0, 1\\]"):
        main(["compare", "--run", f"A={tmp_path / 'a'}", "--metric", "loss", "--error", "--output", str(err)])
    with pytest.raises(SystemExit, match="--metric 'bleu'.*run 'A'"):
        main(["compare", "--run", f"A={tmp_path / 'a'}", "--metric", "bleu", "--output", str(png)])
    with pytest.raises(SystemExit, match="LABEL=RUN_DIR"):
        main(["compare", "--run", str(tmp_path / "a"), "--output", str(png)])
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        main(["compare", "--run", f"A={tmp_path}", "--output", str(png)])


def test_missing_checkpoint_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match=r"sparseattn train: no checkpoint at .*checkpoint\.pt"):
        main(["train", f"--out={tmp_path / 'none'}", "--resume"])
    with pytest.raises(SystemExit, match=r"sparseattn evaluate: no checkpoint at .*x\.pt"):
        main(["evaluate", "--checkpoint", str(tmp_path / "x.pt")])
