"""--overwrite replaces a run only once the new one has started (its first epoch has ended): a
start that fails (a missing data file, no CUDA, a NaN loss) or is interrupted before (Ctrl-C or
SIGTERM while setting up, training or validating) leaves every file of the old run byte-identical;
a good one replaces the run's files and keeps the user's, and resumes exactly from the swapped-in
checkpoint. A process killed during the swap leaves a folder of one run, and a folder whose files
belong to different runs is refused."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparseattn.train import run_folder, trainer
from sparseattn.train.run_folder import STAGING, SWAPPING, swap_in
from sparseattn.train.runlock import LOCK_FILE

from .cli_helpers import CLI_M30K, CLI_TINY, ROOT, assert_one_line_error, run_cli


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


def test_the_old_run_stays_until_the_first_epoch_ends_then_is_replaced(old_run, capsys, monkeypatch):
    seen = []

    def swap_and_look(staging, out):  # what RUN_DIR and the staging folder hold when the swap comes
        step = torch.load(staging / "checkpoint.pt", weights_only=False)["position"]["step"]
        seen.append((json.loads((out / "config.json").read_text())["run"]["seed"], sorted(snapshot(staging)), step))
        swap_in(staging, out)

    monkeypatch.setattr(trainer, "swap_in", swap_and_look)
    old_ckpt = (old_run / "checkpoint.pt").read_bytes()
    argv = ["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--seed=3", "--checkpoint_every=1", "--overwrite"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    # once, at the end of the epoch (step 3; checkpoint_every's at steps 1 and 2 stay), the old run still there
    assert seen == [(0, ["best.pt", "checkpoint.pt", "config.json", "metrics.jsonl"], 3)]
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


def _interrupt_self(signum):
    os.kill(os.getpid(), signum)  # the handler training installs sets its stop flag


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("when", ["first step", "step after a checkpoint", "first validation"])
def test_an_interrupt_after_training_began_leaves_the_old_run(old_run, capsys, monkeypatch, signum, when):
    """Ctrl-C or SIGTERM (`timeout`) soon after an --overwrite run began training once swapped the
    new run in with its checkpoint: best.pt, results.json and metrics.jsonl of the finished run were
    gone, replaced by a run at step 1-41. An interrupt never replaces a run: the new one is discarded."""
    if when == "first validation":
        end_epoch = trainer.Trainer.end_epoch

        def interrupted(self, *args, **kwargs):
            _interrupt_self(signum)
            return end_epoch(self, *args, **kwargs)

        monkeypatch.setattr(trainer.Trainer, "end_epoch", interrupted)
    else:
        step = trainer.Trainer.train_step
        at = 1 if when == "first step" else 2  # the second: after checkpoint_every's first checkpoint

        def interrupted(self, batch):
            stats = step(self, batch)
            if self.position["step"] + 1 == at:
                _interrupt_self(signum)
            return stats

        monkeypatch.setattr(trainer.Trainer, "train_step", interrupted)
    before = snapshot(old_run)
    argv = ["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--checkpoint_every=1", "--overwrite"]
    code, _, err = run_cli(argv, capsys)
    assert code == 130, err
    assert "Traceback" not in err and err.splitlines()[-1].endswith(
        f"before the new run's first epoch ended: --out {old_run} keeps the run it held, and the new run is discarded"
    )
    assert snapshot(old_run) == before and not (old_run / STAGING).exists()


KILLED_SWAP = """
import os, sys
from pathlib import Path
from sparseattn.train.cli import main

renames, replace = 0, os.replace

def counted(src, dst):  # the swap's renames: a folder's, or a file's from one folder into another
    global renames
    if Path(src).name == ".new-run" or Path(src).parent != Path(dst).parent:
        renames += 1
        if renames == int(os.environ["KILL_AT"]):
            os._exit(9)  # as kill -9: nothing more runs
    replace(src, dst)

os.replace = counted
sys.exit(main(sys.argv[1:]))
"""


def _seeds(out: Path) -> dict:
    """The seed of the run each file of `out` belongs to."""
    seeds = {
        name: torch.load(out / name, weights_only=False)["config"]["run"]["seed"]
        for name in ("checkpoint.pt", "best.pt")
    }
    return {**seeds, "config.json": json.loads((out / "config.json").read_text())["run"]["seed"]}


@pytest.mark.parametrize("kill_at", [1, 3])
def test_a_process_killed_during_the_swap_leaves_one_run(old_run, capsys, kill_at):
    """Killed at the third rename of the swap, a process once left the new run's best.pt and
    metrics.jsonl beside the old run's checkpoint.pt and config.json; --resume exited 0, continued
    the old run and tested with the other run's best.pt. Now the swap is one rename of a folder:
    killed before it, the folder keeps the old run; after it, the next command finishes the swap."""
    before = snapshot(old_run)
    argv = ["train", "--task=copy", f"--out={old_run}", *CLI_TINY, "--seed=7", "--overwrite"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), KILL_AT=str(kill_at))
    killed = subprocess.run([sys.executable, "-c", KILLED_SWAP, *argv], env=env, capture_output=True, timeout=120)
    assert killed.returncode == 9, killed.stderr.decode()
    code, _, err = run_cli(["evaluate", old_run], capsys)
    assert code == 0 and "Traceback" not in err, err
    seed = 0 if kill_at == 1 else 7  # before the folder's rename: the old run; after it: the new one
    assert set(_seeds(old_run).values()) == {seed}
    assert not (old_run / SWAPPING).exists()
    if kill_at == 1:  # byte for byte, beside what the killed start left in .new-run/ (the next run removes it)
        assert {k: v for k, v in snapshot(old_run).items() if not k.startswith(STAGING)} == before
    code, _, err = run_cli(["train", f"--out={old_run}", "--resume", "--epochs=2"], capsys)
    assert code == 0, err
    assert set(_seeds(old_run).values()) == {seed} and not (old_run / STAGING).exists()
    state = torch.load(old_run / "checkpoint.pt", weights_only=False)
    assert state["position"]["epoch"] == 2


def test_a_folder_mixing_two_runs_files_is_refused(copy_run, tmp_path, capsys):
    other = tmp_path / "other"
    code, _, err = run_cli(["train", "--task=copy", f"--out={other}", *CLI_TINY, "--seed=5"], capsys)
    assert code == 0, err
    mixed = tmp_path / "mixed"
    shutil.copytree(copy_run, mixed)
    shutil.copy(other / "best.pt", mixed / "best.pt")
    ids = {run: json.loads((run / "config.json").read_text())["run_id"] for run in (copy_run, other)}
    for argv in (["evaluate", mixed], ["plot", mixed], ["train", f"--out={mixed}", "--resume", "--epochs=2"]):
        code, _, err = run_cli(argv, capsys)
        assert_one_line_error(
            code, err, f"{mixed} mixes the files of 2 runs", f"best.pt of run {ids[other]}", f"of run {ids[copy_run]}"
        )
    assert (mixed / "checkpoint.pt").read_bytes() == (copy_run / "checkpoint.pt").read_bytes()  # nothing resumed
