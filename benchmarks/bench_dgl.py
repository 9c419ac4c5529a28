"""sparseattn `auto` vs DGL's edge softmax + SpMM on bench_kernels' graph families, fwd and fwd+bwd.

    python -m benchmarks.bench_dgl --dgl-python /path/to/dgl-venv/bin/python
    python -m benchmarks.bench_dgl --dgl-python ... --families window-8192,random-50k --threads 1

DGL 2.1 needs torch <= 2.2.1 (no graphbolt library for 2.2.2), torchdata 0.7.1, pandas < 2.2 and numpy < 2,
so it lives in its own environment (a few GB with torch's CUDA packages):

    python -m venv DGL_VENV
    DGL_VENV/bin/pip install torch==2.2.1 torchdata==0.7.1 "pandas<2.2" "numpy<2" dgl==2.1.0 pyyaml pydantic

(dgl 2.1.0 imports yaml and pydantic without declaring them.)

`--dgl-python` (or $DGL_PYTHON) names its Python, which runs benchmarks/dgl_runner.py; without it DGL is
listed as skipped and only sparseattn is timed ("nodgl" joins the tag). What is measured: docs/benchmarks/dgl.md.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from sparseattn import edge_attention
from sparseattn.kernels import choose_auto

from . import harness
from .families import families
from .harness import Output, Result, failure, machine_info, peak_extra_mib, row_line, timed_pass

DEFAULT_FAMILIES = "window-8192,random-50k,complete-64x32,causal-32x128,bipartite-32x40x40,varlen-5..50-4096"
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dgl_runner.py")
HEADS, DIM, TOL = 8, 64, 1e-3
PAIRS = (("auto exact", "dgl fused"), ("auto clamp", "dgl builtin"))  # ours against theirs
OURS = {"auto exact": dict(clamp=None), "auto clamp": {}}  # edge_attention's arguments


class DGLRunner:
    """The DGL subprocess: one JSON command per line in, one JSON reply per line out."""

    def __init__(self, python: str, threads: int, stderr_path: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own packages only
        env.update(OMP_NUM_THREADS=str(threads), DGLBACKEND="pytorch")
        self.stderr = open(stderr_path, "w")
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.proc = subprocess.Popen(
            [python, RUNNER, str(threads)], text=True, env=env, cwd=tempfile.gettempdir(), **pipes
        )

    def ask(self, key: Optional[str] = None, **msg) -> Any:
        """The reply to msg, or its `key` entry."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.stderr.flush()
            tail = open(self.stderr.name).read().strip().splitlines()
            raise RuntimeError(f"DGL runner exited: {tail[-1] if tail else 'no output'}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply if key is None else reply[key]

    def close(self) -> None:
        try:
            self.proc.communicate(json.dumps({"cmd": "quit"}) + "\n", timeout=30)
        except Exception:
            self.proc.kill()
        self.stderr.close()


def start_dgl(python: str, threads: int, workdir: str):
    """(runner or None, versions dict or the reason DGL is skipped)."""
    if not python:
        return None, "skipped: no --dgl-python (or $DGL_PYTHON) given"
    if not os.path.exists(python):
        return None, f"skipped: --dgl-python {python} does not exist"
    runner = DGLRunner(python, threads, os.path.join(workdir, "dgl_runner.stderr"))
    try:
        return runner, runner.ask(cmd="hello")
    except Exception as exc:
        runner.close()
        return None, f"skipped: dgl does not import in {python} ({str(exc)[:200]})"


def main(argv=None) -> None:
    ap = harness.parser(__doc__, type=int, default=1)
    ap.add_argument("--dgl-python", default=os.environ.get("DGL_PYTHON", ""), help="Python of the DGL environment")
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help="comma-separated bench_kernels family names, or all")
    ap.add_argument("--quick", action="store_true", help="bench_kernels' small graphs (a smoke test)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="calls per sample (1 when a call takes over 0.3 s)")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    fams = families(args.quick)
    if args.quick and args.families == DEFAULT_FAMILIES:
        args.families = "all"
    names = list(fams) if args.families == "all" else args.families.split(",")
    unknown = [n for n in names if n not in fams]
    if unknown:
        sys.exit(f"unknown families {unknown}; choose from {list(fams)}")
    workdir = tempfile.mkdtemp(prefix="bench_dgl_")
    runner, d = start_dgl(args.dgl_python, args.threads, workdir)
    info = dict(machine_info(), dgl=d)  # DGL's and its torch's versions are in the JSON, not in the name
    tag = "-".join(([args.tag] if args.tag else []) + ([] if runner else ["nodgl"]))  # a run without DGL says so
    out = Output("benchmarks.bench_dgl", argv, args.out, info, tag, quick=args.quick)
    dgl_note = d if isinstance(d, str) else ""
    theirs = dgl_note or f"dgl {d['dgl']} on torch {d['torch']}"
    own = "" if dgl_note else f", numpy {d['numpy']}, {d['threads']} thread(s), own process"
    out.log(f"DGL: {theirs}{own}")
    out.log(f"H={HEADS}, D={DIM}, float32; median of {args.rounds} interleaved rounds of {args.reps}-call medians")
    results: List[Result] = []
    config = {**vars(args), "dgl_python": "DGL_PYTHON" if args.dgl_python else "", "out": "OUT"}  # no machine paths
    try:
        for name in names:
            run_family(name, fams[name], args, runner, dgl_note, workdir, results, out.log)
            out.save(config, results)
    finally:
        if runner is not None:
            runner.close()
    harness.write_times(out.png, out.header + f"\n{theirs}; ms, median of interleaved rounds", results)
    out.close()


def run_family(name, fam, args, runner, dgl_note, workdir, results, log) -> None:
    g = fam.build()
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, HEADS, DIM) * 0.5 for n in (g.num_dst, g.num_src, g.num_src))
    checker = "reference" if g.num_edges * HEADS * DIM * 4 * 3 <= 2**31 else "csr"
    with torch.no_grad():
        ref = edge_attention(q, k, v, g, clamp=None, backend=checker)
        errs = {
            c: (edge_attention(q, k, v, g, backend="auto", **kw) - ref).abs().max().item() for c, kw in OURS.items()
        }
    gout = torch.randn_like(ref)
    log(
        f"\n{name}: N_dst={g.num_dst}, N_src={g.num_src}, E={g.num_edges}, auto -> {choose_auto(q, g)}, "
        f"checked against {checker} (exact softmax)"
    )
    if runner is not None:
        path = os.path.join(workdir, f"{name}.npz")
        arrays = dict(src=g.src, dst=g.dst, q=q, k=k, v=v, ref=ref, gout=gout)
        np.savez(path, num_src=g.num_src, num_dst=g.num_dst, **{key: t.numpy() for key, t in arrays.items()})
        try:
            errs.update(runner.ask("max_err", cmd="load", family=name, path=path))
        except Exception as exc:
            dgl_note = f"failed: {exc}"
        os.remove(path)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]

    for mode in ("fwd", "fwd+bwd"):
        rows = {c: Result(name, g.num_edges, c, mode) for pair in PAIRS for c in pair}
        results += rows.values()
        samples: Dict[str, Tuple[Callable[..., List[float]], int]] = {}  # contender -> (timer, calls)
        for c, r in rows.items():
            if c not in errs:  # DGL did not run
                r.note = dgl_note or "skipped"
                continue
            try:
                r.max_err_vs_reference = errs[c]
                if not r.max_err_vs_reference <= TOL:
                    raise AssertionError(f"max |err| {r.max_err_vs_reference:.3g}")
                if c in OURS:
                    call = timed_pass(
                        lambda kw=OURS[c]: edge_attention(*leaves, g, backend="auto", **kw), mode, leaves, gout
                    )
                    r.note, r.peak_extra_mib = f"-> {choose_auto(q, g)}", peak_extra_mib(call)
                    timer = functools.partial(harness.time_ms, call, budget_s=float("inf"))
                else:
                    r.peak_extra_mib = runner.ask("peak_extra_mib", cmd="mem", contender=c, mode=mode)
                    timer = functools.partial(runner.ask, "times_ms", cmd="time", contender=c, mode=mode)
                samples[c] = timer, args.reps if timer(reps=1, warmup=args.warmup - 1)[0] < 300 else 1
            except Exception as exc:
                r.note = failure(exc)
        for i in range(args.rounds):  # one sample of each per round, every other round in reverse order
            for c in list(samples) if i % 2 == 0 else reversed(list(samples)):
                try:
                    rows[c].times_ms.append(statistics.median(samples[c][0](reps=samples[c][1], warmup=0)))
                except Exception as exc:
                    rows[c].note = failure(exc)
        load = os.getloadavg()[0]
        for r in rows.values():
            if r.times_ms and not r.note.startswith("failed"):
                r.ms = statistics.median(r.times_ms)
            r.note = (r.note + "; " if r.note else "") + f"load {load:.1f}"
        for a, b in PAIRS:
            if rows[a].ms and rows[b].ms:
                rows[a].speedup_vs_reference = rows[b].ms / rows[a].ms  # here: DGL time / sparseattn time
        for r in rows.values():
            log(row_line(r) + (f"  {r.speedup_vs_reference:.2f}x faster than DGL" if r.speedup_vs_reference else ""))


if __name__ == "__main__":
    main()
