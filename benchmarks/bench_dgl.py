"""sparseattn `auto` vs DGL's edge softmax + SpMM on bench_kernels' graph families, fwd and fwd+bwd.

    python -m benchmarks.bench_dgl --dgl-python /path/to/dgl-venv/bin/python
    python -m benchmarks.bench_dgl --dgl-python ... --families window-8192,random-50k --threads 1

DGL 2.1 needs torch <= 2.2.1 (its wheel has no graphbolt library for 2.2.2), torchdata 0.7.1,
pandas < 2.2 and numpy < 2, so it lives in its own environment (the torch wheel pulls its CUDA
packages, a few GB):

    python -m venv DGL_VENV
    DGL_VENV/bin/pip install torch==2.2.1 torchdata==0.7.1 "pandas<2.2" "numpy<2" dgl==2.1.0

`--dgl-python` (or $DGL_PYTHON) names that environment's Python. Without it, or when DGL does not
import there, DGL is listed as skipped with the reason and only sparseattn is timed.

Per family (benchmarks/families.py) this process draws q/k/v (N(0, 0.25), seed 0, H=8, D=64, float32),
the output gradient and the exact-softmax reference, and hands them (.npz) to benchmarks/dgl_runner.py,
a long-lived subprocess in the DGL environment (one JSON command per line); its docstring has the two
DGL recipes. Pairs: `auto exact` (clamp=None) against `dgl fused`, `auto clamp` against `dgl builtin`
(the DGL tutorial). Every output is checked (max |err| <= 1e-3) before timing; each interleaved round
takes one sample per contender (the median of --reps calls, DGL's timed inside its process), and the
result is the median over --rounds; peak memory is measured in the process that ran the call.
Writes bench_dgl_<machine>[_<tag>].{json,png,log} under --out ("nodgl" joins the tag when DGL did not
run); both sides' versions are in the JSON. What it measures: docs/benchmarks/dgl.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List

import numpy as np
import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import choose_auto

from .families import families
from .harness import RESULTS, Output, Result, machine_header, machine_info, machine_tag, peak_extra_mib, write_png
from .pages import preview

DEFAULT_FAMILIES = "window-8192,random-50k,complete-64x32,causal-32x128,bipartite-32x40x40,varlen-5..50-4096"
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dgl_runner.py")
HEADS, DIM, TOL = 8, 64, 1e-3
PAIRS = (("auto exact", "dgl fused"), ("auto clamp", "dgl builtin"))


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

    def ask(self, **msg) -> dict:
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
        return reply

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
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
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dgl-python", default=os.environ.get("DGL_PYTHON", ""), help="Python of the DGL environment")
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help="comma-separated bench_kernels family names, or all")
    ap.add_argument("--quick", action="store_true", help="bench_kernels' small graphs (a smoke test)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="calls per sample (1 when a call takes over 0.3 s)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--tag", default="")
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
    runner, dgl_info = start_dgl(args.dgl_python, args.threads, workdir)
    info = machine_info()
    info["dgl"] = dgl_info
    dgl_note = dgl_info if isinstance(dgl_info, str) else ""
    # DGL's and torch's versions are in the JSON (machine.dgl), not in the name; a run without DGL says so
    variant = "-".join(([args.tag] if args.tag else []) + ([] if runner else ["nodgl"]))
    stem = f"bench_dgl{'_quick' if args.quick else ''}_{machine_tag(info)}{'_' + variant if variant else ''}"
    out = Output("benchmarks.bench_dgl", argv, args.out, stem)
    out.log(machine_header(info))
    d = dgl_info
    dgl = dgl_note or f"dgl {d['dgl']} on torch {d['torch']}, numpy {d['numpy']}, {d['threads']} thread(s), own process"
    out.log(f"DGL: {dgl}")
    out.log(
        f"H={HEADS}, D={DIM}, float32; median over {args.rounds} interleaved rounds of the median of {args.reps} calls"
    )
    results: List[Result] = []
    config = {**vars(args), "dgl_python": "DGL_PYTHON" if args.dgl_python else "", "out": "OUT"}  # no machine paths
    try:
        for name in names:
            run_family(name, fams[name], args, runner, dgl_note, workdir, results, out.log)
            out.save(info, config, results)
    finally:
        if runner is not None:
            runner.close()
    theirs = f"dgl {d['dgl']} on torch {d['torch']}" if isinstance(d, dict) else d
    write_png(out.path + ".png", machine_header(info) + f"\n{theirs}; ms, median of interleaved rounds", results)
    out.log("\n" + preview(out.path + ".json"))
    out.close()


def run_family(name, fam, args, runner, dgl_note, workdir, results, log) -> None:
    g = fam.build(graphs)
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, HEADS, DIM) * 0.5 for n in (g.num_dst, g.num_src, g.num_src))
    checker = "reference" if g.num_edges * HEADS * DIM * 4 * 3 <= 2**31 else "csr"
    with torch.no_grad():
        ref = edge_attention(q, k, v, g, clamp=None, backend=checker)
    gout = torch.randn_like(ref)
    log(
        f"\n{name}: N_dst={g.num_dst}, N_src={g.num_src}, E={g.num_edges}, auto -> {choose_auto(q, g)}, "
        f"checked against {checker} (exact softmax)"
    )
    dgl_errs: Dict[str, float] = {}
    if runner is not None:
        path = os.path.join(workdir, f"{name}.npz")
        arrays = dict(src=g.src, dst=g.dst, q=q, k=k, v=v, ref=ref, gout=gout)
        np.savez(path, num_src=g.num_src, num_dst=g.num_dst, **{key: t.numpy() for key, t in arrays.items()})
        try:
            dgl_errs = runner.ask(cmd="load", family=name, path=path)["max_err"]
        except Exception as exc:
            dgl_note = f"failed: {exc}"
        os.remove(path)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    local = {"auto exact": dict(clamp=None), "auto clamp": {}}

    for mode in ("fwd", "fwd+bwd"):
        calls: Dict[str, Callable[[], float]] = {}  # contender -> one sample (ms)
        rows: Dict[str, Result] = {}
        for c in ("auto exact", "dgl fused", "auto clamp", "dgl builtin"):
            r = rows[c] = Result(name, g.num_edges, c, mode)
            results.append(r)
            try:
                if c.startswith("auto"):
                    kw = local[c]

                    def call(kw=kw, mode=mode):
                        if mode == "fwd":
                            with torch.no_grad():
                                return edge_attention(*leaves, g, backend="auto", **kw)
                        out = edge_attention(*leaves, g, backend="auto", **kw)
                        out.backward(gout)
                        for x in leaves:
                            x.grad = None
                        return out

                    with torch.no_grad():
                        out = edge_attention(q, k, v, g, backend="auto", **kw)
                    r.max_err_vs_reference = (out - ref).abs().max().item()
                    r.note = f"-> {choose_auto(q, g)}"
                    if not r.max_err_vs_reference <= TOL:
                        raise AssertionError(f"max |err| {r.max_err_vs_reference:.3g}")
                    r.peak_extra_mib = peak_extra_mib(call)
                    first = _timed(call)
                    for _ in range(args.warmup - 1):
                        call()
                    reps = args.reps if first < 300 else 1
                    calls[c] = lambda call=call, reps=reps: statistics.median(_timed(call) for _ in range(reps))
                else:
                    if runner is None or c not in dgl_errs:
                        r.note = dgl_note or "skipped"
                        continue
                    r.max_err_vs_reference = dgl_errs[c]
                    if not r.max_err_vs_reference <= TOL:
                        raise AssertionError(f"max |err| {r.max_err_vs_reference:.3g}")
                    r.peak_extra_mib = runner.ask(cmd="mem", contender=c, mode=mode)["peak_extra_mib"]
                    first = runner.ask(cmd="time", contender=c, mode=mode, reps=1, warmup=args.warmup - 1)
                    reps = args.reps if first["times_ms"][0] < 300 else 1
                    calls[c] = lambda c=c, reps=reps, mode=mode: statistics.median(
                        runner.ask(cmd="time", contender=c, mode=mode, reps=reps)["times_ms"]
                    )
            except Exception as exc:
                r.note = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        order = list(calls)
        for i in range(args.rounds):
            for c in order if i % 2 == 0 else reversed(order):
                try:
                    rows[c].times_ms.append(calls[c]())
                except Exception as exc:
                    rows[c].note = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        load = os.getloadavg()[0]
        for r in rows.values():
            if r.times_ms and not r.note.startswith("failed"):
                r.ms = statistics.median(r.times_ms)
            r.note = (r.note + "; " if r.note else "") + f"load {load:.1f}"
        for a, b in PAIRS:
            if rows[a].ms and rows[b].ms:
                rows[a].speedup_vs_reference = rows[b].ms / rows[a].ms  # here: DGL time / sparseattn time
        for c, r in rows.items():
            ms = "-" if r.ms is None else f"{r.ms:9.2f}"
            mem = "-" if r.peak_extra_mib is None else f"{r.peak_extra_mib:.0f}"
            err = "-" if r.max_err_vs_reference is None else f"{r.max_err_vs_reference:.1e}"
            x = f"  {r.speedup_vs_reference:.2f}x faster than DGL" if r.speedup_vs_reference else ""
            log(f"  {mode:8s} {c:12s} {ms:>9s} ms  peak +{mem} MiB  err {err}  {r.note}{x}")


def _timed(fn) -> float:
    import time

    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


if __name__ == "__main__":
    main()
