"""What a call costs beyond its arithmetic: `csr` on a tiny graph (64-node window, H=8, D=64), where
dispatch into the kernel ops and their autograd rule dominate, forward (no_grad) and
forward+backward, per call, optionally against another checkout in the same rounds.

    python -m benchmarks.probe_op_overhead
    python -m benchmarks.probe_op_overhead --baseline ../baseline   # a worktree of another commit

Each timing is 200 calls; median over interleaved rounds (harness.time_interleaved). Writes
probe_op_overhead_<machine>[_tag].log under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable, Dict, List

import torch

import sparseattn

from .bench_kernels import _commit_of, load_baseline
from .harness import machine_header, machine_info, machine_tag, time_interleaved

RESULTS = os.path.join(os.path.dirname(__file__), "results")
CALLS = 200


def contenders(lib, label: str, n: int) -> Dict[str, Callable[[], None]]:
    """fwd and fwd+bwd of lib's csr on a window graph of n nodes, each CALLS times per run."""
    g = lib.graphs.window(n, 4)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 8, 64, generator=gen) * 0.5 for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def fwd() -> None:
        with torch.no_grad():
            for _ in range(CALLS):
                lib.edge_attention(q, k, v, g, backend="csr")

    def fwd_bwd() -> None:
        for _ in range(CALLS):
            lib.edge_attention(*leaves, g, backend="csr").sum().backward()

    return {f"fwd {label}": fwd, f"fwd+bwd {label}": fwd_bwd}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="", help="a checkout of another commit (its folder)")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = contenders(sparseattn, "this tree", args.nodes)
    if args.baseline:
        runs.update(contenders(load_baseline(args.baseline), f"baseline {_commit_of(args.baseline)}", args.nodes))
    names: List[str] = sorted(runs, key=lambda n: n.startswith("fwd+bwd"))
    times = time_interleaved([runs[n] for n in names], warmup=2, reps=args.reps, budget_s=60)
    info = machine_info()
    lines = [
        "$ python -m benchmarks.probe_op_overhead " + " ".join(sys.argv[1:] if argv is None else argv),
        machine_header(info),
        f"csr on a {args.nodes}-node window graph (radius 4), H=8, D=64, float32; ms per call, median of "
        f"{args.reps} interleaved rounds of {CALLS} calls",
    ]
    for name, t in zip(names, times):
        ms = statistics.median(t) / CALLS if isinstance(t, list) else float("nan")
        lines.append(f"  {name:40s} {ms:7.3f} ms")
    print("\n".join(lines))
    stem = f"probe_op_overhead_{machine_tag(info)}{'_' + args.tag if args.tag else ''}"
    with open(os.path.join(args.out, stem + ".log"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
