"""One run per folder: a run holds an OS lock on RUN_DIR/.lock while it writes there. A second
run into the folder, or a --resume of the live run, is refused in one line however close together
they start; the lock goes with the process that held it, however it ends."""

import json
import os
import shutil
import subprocess
import sys
from contextlib import ExitStack

import pytest

from sparseattn.train.runlock import LOCK_FILE, run_dir_lock

from .cli_helpers import CLI_TINY, ROOT, assert_one_line_error, child, run_cli, sparseattn_child

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the tests hold locks from child processes")


def test_a_run_into_a_locked_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    with run_dir_lock(out):
        code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY], capsys)
        assert_one_line_error(code, err, f"--out {out} is in use by another run (pid {os.getpid()})")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written
    code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY], capsys)  # released: runs
    assert code == 0, err


def test_resume_of_a_live_run_is_refused(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    before = (out / "checkpoint.pt").read_bytes()
    with run_dir_lock(out):
        code, _, err = run_cli(["train", f"--out={out}", "--resume", "--epochs=2"], capsys)
        assert_one_line_error(code, err, "is in use by another run")
        code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY, "--overwrite"], capsys)
        assert_one_line_error(code, err, "is in use by another run")
    assert (out / "checkpoint.pt").read_bytes() == before


def _holder(out):
    """A child process that takes the folder's lock and sleeps (killed when the block ends)."""
    code = (
        "import time\nfrom pathlib import Path\nfrom sparseattn.train.runlock import run_dir_lock\n"
        f"with run_dir_lock(Path({str(out)!r})):\n    print('locked', flush=True)\n    time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return child([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)


def test_the_lock_goes_with_a_killed_process(tmp_path, capsys):
    out = tmp_path / "run"
    with _holder(out) as holder:
        assert holder.stdout.readline().strip() == b"locked"
        code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY], capsys)
        assert_one_line_error(code, err, f"(pid {holder.pid})")
        holder.kill()  # kill -9: no cleanup code runs
        holder.wait()
    code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY], capsys)
    assert code == 0, err


def test_two_runs_started_together_one_trains_the_other_is_refused(tmp_path):
    """Once both exited 0 (3 of 3 trials) and metrics.jsonl mixed the two runs."""
    out = tmp_path / "run"
    argv = ["train", "--task=copy", f"--out={out}", *CLI_TINY]
    with ExitStack() as stack:
        started = (sparseattn_child(*argv, f"--seed={seed}", stderr=subprocess.PIPE) for seed in (1, 2))
        procs = [stack.enter_context(proc) for proc in started]
        results = [(p.wait(timeout=300), p.stderr.read().decode()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    seed_won = 1 if results[0][0] == 0 else 2
    refused = next(err for code, err in results if code == 2)
    assert (
        refused.strip().count("\n") == 0 and "is in use by another run" in refused or "already holds a run" in refused
    )
    assert json.loads((out / "config.json").read_text())["run"]["seed"] == seed_won
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)  # one run's records, not two interleaved


def test_the_lock_file_is_kept_and_names_the_last_holder(tmp_path):
    out = tmp_path / "run"
    with run_dir_lock(out):
        pass
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
