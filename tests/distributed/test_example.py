"""examples/distributed_node_classification.py --small trains the same way on 2 gloo processes
(torchrun) as in one process on the whole graph: the same global loss and accuracy at every step
(float32, to 1e-5), a loss that falls, and on each rank a halo of exactly the window's boundary rows.
Both runs go at once, in subprocesses bounded in time."""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "distributed_node_classification.py"
STEP = re.compile(r"^step\s+(\d+) \| loss (\S+) \| acc (\S+) \|", re.MULTILINE)
RANK_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+\d+\s+\d+\s+\S+\s+(\d+)\s+(\d+)\s", re.MULTILINE)  # rank edges .. rows
RADIUS, NODES = 8, 4000  # the example's --small graph


@pytest.fixture(scope="module")
def outputs() -> Dict[int, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    commands = {
        1: [sys.executable, str(SCRIPT), "--small"],
        2: [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(SCRIPT),
            "--small",
        ],
    }
    procs = {
        world: subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for world, cmd in commands.items()
    }
    results = {}
    try:
        for world, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{world} process(es) failed:\n{stderr[-3000:]}"
            results[world] = stdout
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return results


def steps(out: str) -> List[tuple]:
    return [(int(s), float(loss), float(acc)) for s, loss, acc in STEP.findall(out)]


def test_two_processes_train_like_one(outputs):
    single, sharded = steps(outputs[1]), steps(outputs[2])
    assert [s[0] for s in single] == [s[0] for s in sharded] == [1, 2], outputs
    for (step, loss1, acc1), (_, loss2, acc2) in zip(single, sharded):
        assert abs(loss1 - loss2) <= 1e-5, f"step {step}: loss {loss2} on 2 processes, {loss1} in one"
        assert abs(acc1 - acc2) <= 1e-3, f"step {step}: accuracy {acc2} on 2 processes, {acc1} in one"
    assert single[1][1] < single[0][1], "the loss did not fall"
    for out in outputs.values():
        assert re.search(r"^final loss \S+ \| acc \S+$", out, re.MULTILINE), out


def test_each_rank_trades_the_window_boundary(outputs):
    rows = {int(m.group(1)): m.groups()[1:] for m in RANK_ROW.finditer(outputs[2])}
    assert sorted(rows) == [0, 1], outputs[2]
    assert sum(int(r[0]) for r in rows.values()) == NODES * (2 * RADIUS + 1) - RADIUS * (RADIUS + 1)
    for rank, (_, rows_in, rows_out) in rows.items():
        # per step: radius rows per layer forward (k and v together) and their gradients back, 2 layers
        assert int(rows_in) == int(rows_out) == 2 * 2 * RADIUS, (rank, outputs[2])
