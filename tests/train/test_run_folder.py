"""--overwrite replaces a run only once the new one has started: a start that fails (a missing data
file, no CUDA, an interrupt while setting up, a NaN loss before the first checkpoint) leaves every
file of the old run byte-identical; a good one replaces the run's files and keeps the user's, and
resumes exactly from the swapped-in checkpoint."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from sparseattn.train import run_folder, trainer
from sparseattn.train.run_folder import STAGING, swap_in
from sparseattn.train.runlock import LOCK_FILE

from .cli_helpers import CLI_M30K, CLI_TINY, assert_one_line_error, run_cli


def snapshot(folder: Path) -> dict:
    """{relative path: bytes} of every file under `folder` but its lock (a run's pid is written there)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != LOCK_FILE
    }


@pytest.fixture
def old_run(copy_run, tmp_path):
    """A copy run with the files a finished run has (results, hypotheses, plots) and one of the user's."""
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    (out / "results.json").write_text('{"old": true}\n')
    (out / "hyp.test.de").write_text("old hypotheses\n")
    (out / "plots").mkdir()
    (out / "plots" / "loss.png").write_bytes(b"old plot")
    (out / "notes.txt").write_text("mine")
    return out


def test_a_missing_data_file_leaves_the_old_run_byte_identical(m30k_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(m30k_run, out)
    before = snapshot(out)
    (tmp_path / "empty").mkdir()
    argv = [a for a in CLI_M30K if not a.startswith("--data-dir")] + [f"--data-dir={tmp_path / 'empty'}"]
    code, _, err = run_cli(["train", f"--out={out}", *argv, "--overwrite"], capsys)
    assert_one_line_error(code, err, "lacks train.en, train.de")
    assert snapshot(out) == before and not (out / STAGING).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_leaves_the_old_run_byte_identical(old_run, capsys):
    before = snapshot(old_run)
    code, _, err = run_cli(
        ["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--device=cuda", "--overwrite"], capsys
    )
    assert_one_line_error(code, err, "--device=cuda: CUDA is not available here")
    assert snapshot(old_run) == before and not (old_run / STAGING).exists()


def test_an_interrupt_while_setting_up_leaves_the_old_run(old_run, capsys, monkeypatch):
    def interrupted(self):  # the last step of Trainer.__init__, after config.json is written
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "_trim_metrics", interrupted)
    before = snapshot(old_run)
    code, _, err = run_cli(["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--overwrite"], capsys)
    assert code == 130 and err.strip() == "sparseattn train: interrupted"
    assert snapshot(old_run) == before and not (old_run / STAGING).exists()


def test_a_nan_loss_before_the_first_checkpoint_leaves_the_old_run(old_run, capsys, monkeypatch):
    monkeypatch.setattr(
        trainer.Trainer, "train_step", lambda self, batch: self.check_finite(torch.tensor(float("nan")))
    )
    before = snapshot(old_run)
    code, _, err = run_cli(["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--overwrite"], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].endswith(
        f"became nan at step 1 (epoch 1); stopped without saving, --out {old_run} keeps the run it held. "
        "Lower --lr_factor or raise --warmup and start again"
    )
    assert snapshot(old_run) == before and not (old_run / STAGING).exists()


def test_the_old_run_stays_until_the_first_checkpoint_then_is_replaced(old_run, capsys, monkeypatch):
    seen = []

    def swap_and_look(staging, out):  # what RUN_DIR and the staging folder hold when the swap comes
        seen.append((json.loads((out / "config.json").read_text())["run"]["seed"], sorted(snapshot(staging))))
        swap_in(staging, out)

    monkeypatch.setattr(trainer, "swap_in", swap_and_look)
    old_ckpt = (old_run / "checkpoint.pt").read_bytes()
    code, _, err = run_cli(["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--seed=3", "--overwrite"], capsys)
    assert code == 0, err
    assert seen == [(0, ["best.pt", "checkpoint.pt", "config.json", "metrics.jsonl"])]  # once, the old run still there
    run = json.loads((old_run / "config.json").read_text())["run"]
    assert run["seed"] == 3 and run["out"] == str(old_run)  # the run folder, not the one it set up in
    assert (old_run / "checkpoint.pt").read_bytes() != old_ckpt
    assert json.loads((old_run / "results.json").read_text())["split"] == "test"  # the new run's results
    assert not (old_run / "hyp.test.de").exists() and not (old_run / "plots" / "loss.png").exists()
    assert (old_run / "notes.txt").read_text() == "mine" and (old_run / LOCK_FILE).exists()
    assert not (old_run / STAGING).exists()


def test_an_overwrite_resumes_exactly_from_the_swapped_in_checkpoint(old_run, tmp_path, capsys):
    argv = ["train", "--task=copy", *CLI_TINY, "--epochs=2"]
    code, _, err = run_cli([*argv, f"--out={old_run}", "--max_steps=2", "--overwrite"], capsys)
    assert code == 0 and "stopped at max_steps=2" in err, err
    state = torch.load(old_run / "checkpoint.pt", weights_only=False)
    assert state["position"]["step"] == 2 and state["config"]["run"]["out"] == str(old_run)
    code, _, err = run_cli(["train", f"--out={old_run}", "--resume", "--max_steps=0"], capsys)
    assert code == 0, err
    code, _, err = run_cli([*argv, f"--out={tmp_path / 'straight'}"], capsys)
    assert code == 0, err
    resumed, straight = (
        torch.load(d / "checkpoint.pt", weights_only=False)["model"] for d in (old_run, tmp_path / "straight")
    )
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


def test_a_failed_start_leaves_no_staging_behind_and_a_stale_one_is_cleared(old_run, capsys):
    stale = old_run / STAGING
    stale.mkdir()
    (stale / "checkpoint.pt").write_bytes(b"what a killed start left")
    code, _, err = run_cli(["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--overwrite"], capsys)
    assert code == 0, err
    assert not stale.exists()
    assert torch.load(old_run / "checkpoint.pt", weights_only=False)["position"]["step"] == 3


def test_swap_in_moves_the_new_run_in_and_removes_only_the_old_runs_files(tmp_path):
    out, new = tmp_path / "run", tmp_path / "run" / STAGING
    (out / "plots").mkdir(parents=True)
    new.mkdir()
    for name in ("checkpoint.pt", "best.pt", "results.json", "hyp.val.de", "plots/cross.png", "checkpoint.pt.ab.tmp"):
        (out / name).write_text(f"old {name}")
    (out / "plots" / "notes.md").write_text("mine")
    for name in ("checkpoint.pt", "config.json"):
        (new / name).write_text(f"new {name}")
    swap_in(new, out)
    assert snapshot(out) == {
        "checkpoint.pt": b"new checkpoint.pt",
        "config.json": b"new config.json",
        "plots/notes.md": b"mine",
    }
    assert run_folder.run_files(out) == [out / "checkpoint.pt", out / "config.json"]
