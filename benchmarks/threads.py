"""Thread settings for a CPU benchmark, each measured in a fresh process of its own, since OpenMP reads
OMP_NUM_THREADS and OMP_WAIT_POLICY once, at start (`run_setting`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ("default", "passive", "active")  # "default": OMP_WAIT_POLICY unset


def thread_settings(threads: List[int], policies: List[str]) -> List[Tuple[int, str]]:
    """(threads, wait policy) pairs to run, in order; one thread has no team to wait on, so it runs
    with the first policy only."""
    return [(t, p) for t in threads for p in (policies if t > 1 else policies[:1])]


def setting_label(threads: int, policy: str) -> str:
    """'1', '2', '2 passive': a setting as tables name it."""
    return str(threads) + ("" if policy == "default" else f" {policy}")


def setting_env(threads: int, policy: str) -> Dict[str, str]:
    """This process's environment with one setting's OpenMP variables (policy "default": unset),
    and the repository on PYTHONPATH so that `python -m benchmarks...` imports from any folder."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy.upper()
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def run_setting(module: str, argv: List[str], threads: int, policy: str, path: str) -> Tuple[Optional[dict], int]:
    """`python -m <module> <argv> --threads T --omp-wait-policy P --worker <path>` in that setting's environment:
    the JSON it wrote to `path` (None if nothing) and its exit code."""
    wait = "OMP_WAIT_POLICY unset" if policy == "default" else f"OMP_WAIT_POLICY={policy.upper()}"
    print(f"\n==== OMP_NUM_THREADS={threads}, {wait}: a fresh process", flush=True)
    cmd = [sys.executable, "-m", module, *argv, "--threads", str(threads), "--omp-wait-policy", policy]
    code = subprocess.run(cmd + ["--worker", path], env=setting_env(threads, policy)).returncode
    if not os.path.exists(path):
        return None, code
    with open(path) as f:
        return json.load(f), code
