"""What training prints and what the other commands take: one line per epoch with --progress=false;
evaluate, plot and translate given a run folder (best.pt, else checkpoint.pt, named in one line);
plot redraws loss.png from the run's metrics and gives attention maps a colour bar."""

import json
import re
import shutil

import matplotlib.figure

from .cli_helpers import CLI_TINY, assert_one_line_error, run_cli


def test_progress_false_prints_one_line_per_epoch(tmp_path, capsys):
    out = tmp_path / "run"
    code, printed, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY, "--epochs=2"], capsys)
    assert code == 0 and "test: token accuracy" in printed
    lines = err.splitlines()
    assert "\r" not in err and "it/s" not in err  # no progress bar
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and len(lines) == 3, err  # the start line, then one line per epoch
    for n, line in enumerate(epochs, 1):
        assert line.startswith(f"epoch {n}/2 | step {3 * n} | "), line  # 48 sequences, 16 a batch
        assert re.search(r"train loss \d+\.\d{4} acc \d\.\d{4} \| valid loss \d+\.\d{4} tf_accuracy", line), line
    valid = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if '"valid"' in r]
    assert f"valid loss {valid[-1]['valid']['loss']:.4f}" in epochs[-1]


def test_evaluate_takes_a_run_folder_and_says_which_checkpoint(copy_run, tmp_path, capsys):
    code, out, err = run_cli(["evaluate", "--checkpoint", copy_run, "--json"], capsys)
    assert (
        code == 0
        and err.strip() == f"{copy_run}: using best.pt, the weights of epoch 1, the best on the validation split"
    )
    by_folder = json.loads(out)
    code, out, err = run_cli(["evaluate", "--checkpoint", copy_run / "best.pt", "--json"], capsys)
    assert code == 0 and not err and json.loads(out) == by_folder

    no_best = tmp_path / "no_best"
    shutil.copytree(copy_run, no_best)
    (no_best / "best.pt").unlink()
    code, out, err = run_cli(["evaluate", "--checkpoint", no_best, "--json"], capsys)
    assert code == 0 and len(err.splitlines()) == 1
    assert err.startswith(f"{no_best}: no best.pt") and "using checkpoint.pt, the weights after epoch 1" in err
    code, out_ckpt, _ = run_cli(["evaluate", "--checkpoint", copy_run / "checkpoint.pt", "--json"], capsys)
    assert json.loads(out) == json.loads(out_ckpt)


def test_a_folder_without_a_checkpoint_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for command in ("evaluate", "plot", "translate"):
        code, _, err = run_cli(
            [command, "--checkpoint", tmp_path / "empty", *(["hi"] * (command == "translate"))], capsys
        )
        assert_one_line_error(code, err, f"sparseattn {command}: {tmp_path / 'empty'} holds no checkpoint")


def test_translate_takes_a_run_folder(m30k_run, copy_run, capsys):
    code, out, err = run_cli(["translate", "--checkpoint", m30k_run, "A dog runs."], capsys)
    assert code == 0 and len(out.splitlines()) == 1 and err.startswith(f"{m30k_run}: using best.pt")
    code, by_file, _ = run_cli(["translate", "--checkpoint", m30k_run / "best.pt", "A dog runs."], capsys)
    assert out == by_file
    code, _, err = run_cli(["translate", "--checkpoint", copy_run, "hello"], capsys)
    assert_one_line_error(code, err, "best.pt is a 'copy' checkpoint")


def test_plot_of_a_run_folder_redraws_the_loss_curve_and_colour_bars(copy_run, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(copy_run, run)  # trained with --plots=false: no plots/ yet
    bars = []
    colorbar = matplotlib.figure.Figure.colorbar
    monkeypatch.setattr(
        matplotlib.figure.Figure, "colorbar", lambda fig, *a, **kw: bars.append(kw) or colorbar(fig, *a, **kw)
    )
    code, out, err = run_cli(["plot", "--checkpoint", run], capsys)
    assert code == 0 and err.startswith(f"{run}: using best.pt")
    names = {"attention_encoder.png", "attention_decoder.png", "attention_cross.png", "loss.png"}
    assert {p.name for p in (run / "plots").glob("*.png")} == names
    printed = out.split()
    assert set(printed) == {str(run / "plots" / name) for name in names} and printed[-1].endswith("loss.png")
    assert (run / "plots" / "loss.png").stat().st_size > 1000
    assert [kw.get("label") for kw in bars] == ["attention weight"] * 3  # one bar per attention figure

    (run / "metrics.jsonl").unlink()  # a checkpoint without its run's metrics: the other plots, and a note
    code, out, err = run_cli(["plot", "--checkpoint", run / "checkpoint.pt", "--out", tmp_path / "p2"], capsys)
    assert code == 0 and "no loss.png: no metrics.jsonl" in err
    assert {p.name for p in (tmp_path / "p2").glob("*.png")} == names - {"loss.png"}
