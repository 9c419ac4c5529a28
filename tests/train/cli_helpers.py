"""What the CLI tests share: tiny runs' flags, running `sparseattn` in this process or in a
subprocess (`child` for one a test signals or kills), and the one-line error every failure must be."""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparseattn.train.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CLI_TINY = [
    "--device=cpu",  # the recorded numbers and exact-resume checks are CPU runs
    "--num_train=48",
    "--num_valid=8",
    "--num_test=8",
    "--seq_mean=5",
    "--seq_std=1",
    "--batch_size=16",
    "--d_model=16",
    "--d_ff=16",
    "--num_heads=2",
    "--epochs=1",
    "--progress=false",
    "--plots=false",
    "--warmup=10",
    "--eval_decode=false",
]
CLI_M30K = [
    "--task=multi30k",
    f"--data-dir={FIXTURES / 'multi30k_sample'}",
    "--vocab_size=200",
    "--d_model=16",
    "--d_ff=16",
    "--num_heads=2",
    "--max_tokens=64",
    "--epochs=1",
    "--progress=false",
    "--plots=false",
    "--valid_bleu_sentences=2",
    "--beam=1",
    "--eval_batch_size=8",
]


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of `sparseattn ARGV` in this process."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def sparseattn(*argv, cwd=None, stdin=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "sparseattn", *map(str, argv)],
        cwd=cwd,
        input=stdin,
        env=env,
        capture_output=True,
        timeout=timeout,
    )


def _sigint_as_from_a_terminal() -> None:
    # a job a shell starts in the background (`pytest &`, some CI runners) inherits SIGINT ignored,
    # and Python keeps it so: a child that is to be interrupted gets the default back
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def child(argv, **popen):
    """A subprocess a test signals or kills, as started from a terminal however pytest was started
    (SIGINT at its default), in a session of its own (a Ctrl-C meant for pytest is not sent to
    it too), and killed when the block ends if it is still running."""
    proc = subprocess.Popen(
        [str(a) for a in argv], preexec_fn=_sigint_as_from_a_terminal, start_new_session=True, **popen
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def sparseattn_child(*argv, **popen):
    """`child` running `python -m sparseattn ARGV` on this source tree."""
    env = {**os.environ, **popen.pop("env", {}), "PYTHONPATH": str(ROOT)}
    return child([sys.executable, "-m", "sparseattn", *argv], env=env, **popen)


def wait_until(proc, condition, what: str, timeout: float = 60.0, poll: float = 0.01) -> None:
    """Return once condition() holds; fail naming `what` when the child exits first or `timeout`
    seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the child exited (code {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g} s")
        time.sleep(poll)
