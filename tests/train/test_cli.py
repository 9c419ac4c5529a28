"""The command line (`sparseattn.train.cli.main`): a tiny copy run that learns, evaluate --json and
plot; flags and --config files; the time budget; compare; one-line errors with exit code 2."""

import json
import re

import pytest
import torch

from sparseattn.train.cli import main
from sparseattn.train.config import make_config, parse_flags
from sparseattn.train.trainer import Trainer

from .helpers import TINY, flags, tiny_config


def test_flags_are_texts_typed_by_the_config_and_unknown_keys_rejected():
    over = parse_flags(["--epochs=3", "--dropout", "0.2", "--progress=false", "--plots", "--task=sort"])
    assert over == {"epochs": "3", "dropout": "0.2", "progress": "false", "plots": "true", "task": "sort"}
    cfg = make_config(over)
    assert (cfg.run.epochs, cfg.model_cfg.dropout, cfg.run.progress, cfg.run.plots, cfg.task) == (
        3,
        0.2,
        False,
        True,
        "sort",
    )
    with pytest.raises(ValueError, match="unknown config key 'epoch'"):
        make_config(parse_flags(["--epoch=3"]))
    with pytest.raises(ValueError, match="expects int"):
        make_config(parse_flags(["--epochs=x"]))
    with pytest.raises(ValueError, match="expected --key=value"):
        parse_flags(["epochs=3"])


def test_cli_rejects_unknown_key(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "x"), "--bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "sparseattn train: unknown config key 'bogus'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_unknown_command_is_exit_code_2(capsys):
    assert main(["bogus"]) == 2
    assert "unknown command 'bogus'" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_a_config_file_reaches_the_run_and_flags_override_it(tmp_path):
    """`train --config FILE`: the file's task, model and values are the run's, a flag beats the file."""
    preset = tmp_path / "mine.toml"
    preset.write_text(
        '# a test preset\n[task]\nname = "reverse"\nnum_train = 40\nnum_valid = 8\nnum_test = 8\n'
        "seq_mean = 5.0\n[run]\nepochs = 3\nbatch_size = 8\nwarmup = 7\nprogress = false\n"
        'plots = false\neval_decode = false\n[model]\nname = "transformer"\nd_model = 16\n'
        'd_ff = 24\nnum_heads = 2\nclamp = "-4,3"\n'
    )
    out = tmp_path / "run"
    assert main(["train", "--config", str(preset), f"--out={out}", "--epochs=1", "--d_ff=40"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["task"], saved["model"]) == ("reverse", "transformer")
    assert saved["task_config"]["num_train"] == 40 and saved["run"]["batch_size"] == 8 and saved["run"]["warmup"] == 7
    assert saved["model_config"]["d_model"] == 16 and list(saved["model_config"]["clamp"]) == [-4.0, 3.0]
    assert saved["run"]["epochs"] == 1 and saved["model_config"]["d_ff"] == 40  # the flags win
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["position"]["epoch"] == 1 and state["model"]["src_embed.lut.weight"].shape[1] == 16


def test_a_missing_config_file_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nosuch.toml"), f"--out={tmp_path / 'x'}"]) == 2
    assert "nosuch.toml" in capsys.readouterr().err


def test_tiny_copy_run_learns_then_evaluate_and_plot(tmp_path, capsys):
    out = tmp_path / "copy"
    args = [
        "train",
        "--task=copy",
        f"--out={out}",
        "--num_train=1500",
        "--num_valid=50",
        "--num_test=100",
        "--seq_mean=5",
        "--seq_std=1",
        "--batch_size=16",
        "--d_model=64",
        "--d_ff=64",
        "--epochs=3",
        "--warmup=100",
        "--progress=false",
        "--dropout=0",
        "--eval_decode=false",
    ]
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
    assert {p.name for p in plot_dir.glob("*.png")} == {
        "attention_encoder.png",
        "attention_decoder.png",
        "attention_cross.png",
        "loss.png",  # redrawn from the run's metrics.jsonl
    }


def test_time_budget_stops_mid_epoch_then_validates_tests_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Trainer, "elapsed", lambda self: 10.0 * self.position["step"])  # a clock: 10 s per step
    out = tmp_path / "budget"
    assert main(["train", *flags(**TINY), f"--out={out}", "--time_budget_min=0.5"]) == 0  # 30 s: 3 of 6 steps
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


def test_compare_plots_runs_and_names_bad_arguments(tmp_path, capsys):
    for name in ("a", "b"):
        Trainer(tiny_config(tmp_path, name, seed=len(name))).fit()
    png = tmp_path / "cmp" / "acc.png"
    assert (
        main(
            [
                "compare",
                "--run",
                f"A={tmp_path / 'a'}",
                "--run",
                f"B={tmp_path / 'b'}",
                "--metric",
                "tf_accuracy",
                "--output",
                str(png),
            ]
        )
        == 0
    )
    assert png.stat().st_size > 1000
    err = tmp_path / "cmp" / "err.png"
    assert (
        main(["compare", "--run", f"A={tmp_path / 'a'}", "--metric", "tf_accuracy", "--error", "--output", str(err)])
        == 0
    )
    assert err.stat().st_size > 1000
    assert main(["compare", "--run", f"A={tmp_path / 'a'}", "--metric", "loss", "--error", "--output", str(err)]) == 2
    assert re.search("--metric 'loss'.*needs a metric in \\[0, 1\\]", capsys.readouterr().err)
    assert main(["compare", "--run", f"A={tmp_path / 'a'}", "--metric", "bleu", "--output", str(png)]) == 2
    assert re.search("--metric 'bleu'.*run 'A'", capsys.readouterr().err)
    assert main(["compare", "--run", str(tmp_path / "a"), "--output", str(png)]) == 2
    assert re.search("LABEL=RUN_DIR", capsys.readouterr().err)
    assert main(["compare", "--run", f"A={tmp_path}", "--output", str(png)]) == 2
    assert re.search("no metrics.jsonl", capsys.readouterr().err)


def test_missing_checkpoint_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", f"--out={tmp_path / 'none'}", "--resume"]) == 2
    assert re.search(r"sparseattn train: no checkpoint at .*checkpoint\.pt", capsys.readouterr().err)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "x.pt")]) == 2
    assert re.search(r"sparseattn evaluate: no checkpoint at .*x\.pt", capsys.readouterr().err)
