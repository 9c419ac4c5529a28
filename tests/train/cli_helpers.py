"""What the CLI tests share: tiny runs' flags, running `sparseattn` in this process or in a
subprocess, and the one-line error every failure must be."""

import os
import subprocess
import sys
from pathlib import Path

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
