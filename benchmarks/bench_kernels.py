"""Edge-attention kernels vs the reference and their peers, per graph family, forward and fwd+bwd,
at each thread setting and input scale, with each time's distance to the machine's physical limit.

    python -m benchmarks.bench_kernels                      # every family at 1, 2, 2 passive threads (~1.5 h)
    python -m benchmarks.bench_kernels --quick --threads 1 --reps 1 --contenders csr,auto  # seconds
    python -m benchmarks.bench_kernels --families window-8192,causal-32x128 --flex all
    python -m benchmarks.bench_kernels --gqa --threads 1    # grouped-query heads vs repeated k, v (~3 min)
    python -m benchmarks.bench_kernels --stream --threads 1 # 24 graphs of 2K-20K nodes, two passes (stream.py)

What it measures: benchmarks/templates/kernels.md. JSON format 2 (rows with threads, omp_wait_policy,
input_scale, limit; config with settings, family_info, ratios); earlier files: one setting, s = 0.5.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from statistics import median
from typing import Dict, List, Optional

import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import choose_auto, plan

from . import harness, stream
from .contenders import EXACT, UNCHECKED, CheckTimer, contenders_for, estimate_bytes, needed_bytes
from .families import Family, families
from .kernels_report import DEFAULT_SCALE, KernelResult, plotted, ratio_table, stream_table
from .limits import gather_floor, limit_ms, measure_rates, must_move
from .peers import DIM, HEADS
from .threads import POLICIES, run_setting, setting_label, thread_settings

GiB = 2**30
CHECKS = CheckTimer()
FAMILY_INFO: Dict[str, dict] = {}  # per family: sizes, auto's pick, dense padding, bytes and flops (in the JSON)
FLOORS: Dict[str, dict] = {}  # per family, at this worker's setting: limits.gather_floor (in the setting's JSON)


def print_row(r: KernelResult) -> None:
    pct = None if r.limit_fraction is None else 100 * r.limit_fraction
    rates = f"{harness.fmt(r.gb_per_s, '.2f')} GB/s {harness.fmt(r.gflop_per_s, '.1f')} GFLOP/s"
    x_floor = f" {r.ms / r.floor_ms:.2f}x floor" if r.ms and r.floor_ms else ""
    compiled = f" compile {r.compile_s:.1f} s" if r.compile_s is not None else ""
    print(harness.row_line(r, f"{rates} {harness.fmt(pct, '.1f')}% of limit{x_floor}{compiled}  "), flush=True)


def _rates(r: dict) -> str:
    return f"copy {r['copy_gb_per_s']:.1f} GB/s, GEMM {r['gemm_gflop_per_s']:.0f} GFLOP/s"


def run_family(fam: Family, g: graphs.Graph, scale: float, args, rates: dict, results: List[KernelResult]) -> None:
    """Check, measure and time every contender on `g` with inputs N(0, scale^2), both passes."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, HEADS, DIM) * scale for n in (g.num_dst, g.num_src, g.num_src))
    budget = args.budget_gib * GiB
    if fam.name not in FAMILY_INFO:  # sizes, degrees, auto's pick, dense padding, bytes and flops per pass
        blocks = plan(g) if g.blocks else None
        deg = {f"max_{k}_degree": int(torch.bincount(i, minlength=1).max()) for k, i in (("in", g.dst), ("out", g.src))}
        info = dict(num_dst=g.num_dst, num_src=g.num_src, edges=g.num_edges, **deg, auto=choose_auto(q, g))
        info.update(dense_waste=blocks.waste if blocks else None, dense_buckets=len(blocks.buckets) if blocks else None)
        FAMILY_INFO[fam.name] = {**info, **must_move(g, HEADS, DIM, DIM)}
    fi = FAMILY_INFO[fam.name]
    if fam.name not in FLOORS:
        FLOORS[fam.name] = gather_floor(g, HEADS, DIM, reps=3 if args.quick else 5)
    floor = FLOORS[fam.name]
    waste = f", dense padding waste {fi['dense_waste']:.1%}" if g.blocks else ""
    print(
        f"\n{fam.name}: N_dst={g.num_dst}, N_src={g.num_src}, E={g.num_edges}, H={HEADS}, D={DIM}, float32, "
        f"inputs N(0, {scale**2:g}){waste}, auto -> {fi['auto']}, {args.label} thread(s); gather floor "
        f"{floor['floor']:.2f} ms (embedding_bag of k and v rows: interleaved {floor['interleaved']:.2f}, "
        f"head-major {floor['head_major']:.2f})"
    )
    contenders = contenders_for(fam, g, q, args, fi)
    checker = "reference" if estimate_bytes("reference", g) / 7 * 3 <= budget else "csr"

    @functools.cache
    def gold(exact: bool) -> torch.Tensor:  # what contenders are checked against: clamp mode, or exact softmax
        with torch.no_grad():
            return edge_attention(q, k, v, g, backend=checker, **({"clamp": None} if exact else {}))

    for mode in ("fwd", "fwd+bwd"):
        leaves = [x.clone().requires_grad_(mode == "fwd+bwd") for x in (q, k, v)]
        gout = torch.randn_like(gold(False))
        lim = limit_ms(fi["bytes"][mode], fi["flops"][mode], rates["copy_gb_per_s"], rates["gemm_gflop_per_s"])
        ready = []  # (row, fn): checked and measured, timed below in rounds
        check_times: Dict[int, List[float]] = {}  # id(row) -> ms in the finiteness check, per call
        for name, (build, note, est) in contenders.items():
            r = KernelResult(fam.name, g.num_edges, name, mode, note=note, limit_ms=lim, input_scale=scale)
            r.threads, r.omp_wait_policy = args.setting
            r.floor_ms = floor["floor"] if mode == "fwd" else None
            results.append(r)
            need = needed_bytes(est, mode)
            if build is not None and need > budget:  # known too large: skipped before building (compiling)
                build, r.note = None, f"skipped: needs ~{need / GiB:.0f} GiB > --budget-gib {args.budget_gib:g}"
            try:  # build None: not run, the note says why
                start = time.perf_counter()
                call, built_est, remark = build(*leaves) if build is not None else (None, None, "")
                r.compile_s = time.perf_counter() - start if name == "pyg (compiled)" and call is not None else None
                r.note += f"; {remark}" if remark else ""
                need = needed_bytes(built_est or est, mode)
                if call is not None and need > budget:
                    r.note = f"skipped: needs ~{need / GiB:.0f} GiB > --budget-gib {args.budget_gib:g}"
                elif call is not None:
                    with torch.no_grad():
                        r.max_err_vs_reference = err = (call().float() - gold(name in EXACT)).abs().max().item()
                    if checker != "reference":
                        r.note = (r.note + "; " if r.note else "") + "error vs csr (reference exceeds the budget)"
                    if not err <= 1e-3:
                        against = checker + (" with clamp=None" if name in EXACT else "")
                        raise AssertionError(f"max |err| vs {against} = {err:.3g}")
                    fn = harness.timed_pass(call, mode, leaves, gout)
                    if name == "auto" and fi["auto"] in UNCHECKED:  # a tile kernel behind its finiteness check
                        fn = CHECKS.wrap(fn, check_times.setdefault(id(r), []))
                    r.peak_extra_mib = harness.peak_extra_mib(fn)
                    ready.append((r, fn))
                    continue
            except Exception as exc:  # OOM, unsupported op, wrong answer: a null with the reason
                r.ms, r.note = None, harness.failure(exc)
            print_row(r)
        rows, timing = [r for r, _ in ready], dict(warmup=args.warmup, reps=args.reps, budget_s=args.budget_s)
        harness.measure(rows, [fn for _, fn in ready], memory=False, **timing)
        ref_ms = next((r.ms for r in rows if r.contender == "reference" and r.ms), None)
        for r in rows:
            if r.ms and id(r) in check_times:  # the timed calls' (the last ones): warmups and memory came first
                r.check_ms = median(check_times[id(r)][-len(r.times_ms) :])
            if r.ms:
                r.gb_per_s = fi["bytes"][mode] / (r.ms * 1e-3) / 1e9
                r.gflop_per_s = fi["flops"][mode] / (r.ms * 1e-3) / 1e9
                r.limit_fraction, r.load_average = lim / r.ms, os.getloadavg()[0]
                r.floor_fraction = r.floor_ms / r.ms if r.floor_ms else None
                r.speedup_vs_reference = ref_ms / r.ms if ref_ms else None
            print_row(r)
        if ref_ms is None:
            print(f"  ({mode}: reference skipped, no speedup column; limit {lim:.2f} ms)")


STANDALONE = {"pyg (compiled)": "pyg (compiled, standalone)", "auto": "auto (standalone)"}


def standalone_rows(family: str, scale: float, args) -> List[KernelResult]:
    """benchmarks/standalone.py on this family and scale in a fresh process of this setting's environment:
    compiled PyG and `auto` as a user writes them, as rows named by STANDALONE (ms None, with the reason,
    where the script failed)."""
    cmd = [sys.executable, "-m", "benchmarks.standalone", family, "--threads", str(args.setting[0])]
    cmd += ["--scale", str(scale), "--reps", str(args.reps)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1])["contenders"] if done.returncode == 0 and lines else {}
    why = f"failed: benchmarks.standalone exited {done.returncode}: {done.stderr.strip()[-200:]}"
    rows = []
    for name, label in STANDALONE.items():
        for mode in ("fwd", "fwd+bwd"):
            ms = report.get(name, {}).get(mode)
            note = "a fresh process, as a user writes it (benchmarks/standalone.py)" if ms else why
            r = KernelResult(family, FAMILY_INFO[family]["edges"], label, mode, ms=ms, note=note, input_scale=scale)
            r.threads, r.omp_wait_policy, r.load_average = args.setting[0], args.setting[1], os.getloadavg()[0]
            if name == "pyg (compiled)" and ms:
                r.compile_s = report[name][f"first_s {mode}"]
            print_row(r)
            rows.append(r)
    return rows


def run_worker(args, fams: Dict[str, Family], path: str) -> None:
    """One thread setting (started by `main` in its environment): rates, every family and scale, rates again
    (limits use the higher of each); writes {"setting", "family_info", "results"} to `path` after each family."""
    torch.set_num_threads(args.setting[0])
    sizes = {"copy_mib": 64, "gemm_n": 1024, "reps": 5} if args.quick else {}
    rates = measure_rates(**sizes)
    setting = dict(label=args.label, threads=args.setting[0], omp_wait_policy=args.setting[1])
    setting.update(torch_threads=torch.get_num_threads(), **harness.openmp_settings())
    setting.update(rates_start=rates, load_average_start=os.getloadavg()[0])
    print(f"{args.label} thread(s): torch {setting['torch_threads']}, env {setting['env']}; ", end="")
    print(_rates(rates), flush=True)
    results: List[KernelResult] = []

    def write() -> None:
        setting["load_average_end"], setting["floors"] = os.getloadavg()[0], FLOORS
        with open(path, "w") as f:
            json.dump({"setting": setting, "family_info": FAMILY_INFO, "results": [asdict(r) for r in results]}, f)

    for fam in fams.values():
        g = fam.build()
        for scale in args.scales:
            run_family(fam, g, scale, args, rates, results)
            if args.standalone:
                results += standalone_rows(fam.name, scale, args)
        del g
        write()
    setting["rates_end"] = end = measure_rates(**sizes)
    rate = [max(rates[key], end[key]) for key in ("copy_gb_per_s", "gemm_gflop_per_s")]
    setting["copy_gb_per_s"], setting["gemm_gflop_per_s"] = rate
    for r in results:
        r.limit_ms = limit_ms(FAMILY_INFO[r.family]["bytes"][r.mode], FAMILY_INFO[r.family]["flops"][r.mode], *rate)
        r.limit_fraction = r.limit_ms / r.ms if r.ms else None
    print(f"\n{args.label} thread(s), at the end: {_rates(end)}; the limits use the higher of each: ", end="")
    print(_rates(setting), flush=True)
    write()


def run_gqa(args, argv: List[str]) -> None:
    """--gqa: a random 50K-node graph (in-degree 16), H=8, D=64, float32: k and v of H_kv heads passed as
    they are ("gqa") against repeated to H heads at the call ("repeat"), csr and auto, both passes."""
    torch.set_num_threads(args.thread_counts[0])
    info = dict(harness.machine_info(), threads=args.thread_counts[0])
    out = harness.Output("benchmarks.bench_kernels", argv, args.out, info, args.tag or "gqa", log_file=True)
    n, g = 50_000, graphs.random(50_000, 50_000, 50_000 * 16, seed=0)
    out.log(f"random-50k, E={g.num_edges}, H={HEADS}, D={DIM}, float32, median of {args.reps} in interleaved rounds")
    rows: List[harness.Result] = []
    for kv_heads in (8, 2, 1):
        torch.manual_seed(0)
        q, k, v = (torch.randn(n, h, DIM) * DEFAULT_SCALE for h in (HEADS, kv_heads, kv_heads))
        groups, kv_mib = HEADS // kv_heads, 2 * k.nbytes / 2**20
        for mode in ("fwd", "fwd+bwd"):
            leaves = [x.clone().requires_grad_(mode == "fwd+bwd") for x in (q, k, v)]
            fns, here = [], []
            for backend, kind in itertools.product(("csr", "auto"), ("gqa", "repeat") if groups > 1 else ("gqa",)):

                def call(b=backend, r=groups if kind == "repeat" else 1, x=leaves):
                    kv = [t.repeat_interleave(r, 1) if r > 1 else t for t in x[1:]]  # "repeat": H heads
                    return edge_attention(x[0], *kv, g, backend=b)

                here.append(harness.Result(f"H_kv={kv_heads}", g.num_edges, f"{backend} {kind}", mode))
                here[-1].note = f"k+v {kv_mib * (groups if kind == 'repeat' else 1):.0f} MiB"
                fns.append(harness.timed_pass(call, mode, leaves))
            harness.measure(here, fns, warmup=1, reps=args.reps, budget_s=args.budget_s)
            rows += here
            for r in here:
                print(f"  {r.family:7s}" + harness.row_line(r), flush=True)
        out.save(dict(graph="random-50k", heads=HEADS, dim=DIM, dtype="float32", load=os.getloadavg()), rows)
    harness.write_times(out.png, out.header + " (grouped-query heads)", rows)
    out.close(preview=False)


def run_stream_mode(args, argv: List[str]) -> None:
    """--stream: benchmarks/stream.py at the first of --threads, its table in the log, rows in the JSON."""
    count, lo, hi = (2, 200, 400) if args.quick else (24, 2000, 20000)
    info = dict(harness.machine_info(), threads=args.thread_counts[0])
    out = harness.Output("benchmarks.bench_kernels", argv, args.out, info, args.tag or "stream", args.quick)
    out.log(f"a stream of {count} random graphs of {lo}-{hi} nodes, in-degree 16, H={HEADS}, D={DIM}, float32,")
    out.log("fwd+bwd on each; seconds per pass over the whole stream; pass 1 builds (auto) and compiles (pyg)")
    rows = stream.run_stream(count, lo, hi, args.thread_counts[0])
    for line in stream_table(rows):
        out.log(line)
    for r in rows:
        if r["note"]:
            out.log(f"  {r['contender']} pass {r['pass']}: {r['note']}")
    config = dict(heads=HEADS, dim=DIM, dtype="float32", graphs=count, nodes=[lo, hi], in_degree=16, quick=args.quick)
    config["compiled"] = "torch.compile(peers.pyg_attention), default (automatic dynamic shapes)"
    out.save(config, [], stream=rows)
    out.close(preview=False)


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = harness.parser(__doc__, default="1,2", help="comma-separated thread counts, each run in its own process")
    ap.add_argument("--quick", action="store_true", help="small graphs, few repetitions (a smoke test)")
    ap.add_argument("--families", default="", help="comma-separated family names (default: all)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per contender (median reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=8.0, help="max seconds of timed runs per contender")
    ap.add_argument("--budget-gib", type=float, default=8.0, help="skip contenders estimated to need more")
    ap.add_argument("--flex", choices=["none", "default", "all"], default="default")
    policy = "comma-separated OMP_WAIT_POLICY settings (default = unset, passive, active); 1 thread: the first"
    ap.add_argument("--omp-wait-policy", default="default,passive", help=policy)
    scale = "comma-separated standard deviations of q, k, v (0.5: no score reaches the clamp; 1: N(0, 1))"
    ap.add_argument("--input-scale", default=str(DEFAULT_SCALE), help=scale)
    ap.add_argument("--contenders", default="", help="comma-separated contender names (default: all)")
    ap.add_argument("--gqa", action="store_true", help="grouped-query heads against repeated k, v (run_gqa)")
    ap.add_argument("--stream", action="store_true", help="a stream of varying-size graphs, two passes (stream.py)")
    standalone = "also run each family's compiled PyG and auto in a fresh process as a user writes them (standalone.py)"
    ap.add_argument("--standalone", action="store_true", help=standalone)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: run one setting, write here
    args = ap.parse_args(argv)
    args.thread_counts = [int(x) for x in args.threads.split(",") if x]
    args.policies = args.omp_wait_policy.split(",")
    args.scales = [float(x) for x in args.input_scale.split(",") if x]
    if not args.thread_counts or min(args.thread_counts) < 1 or set(args.policies) - set(POLICIES) or not args.scales:
        ap.error("--threads needs counts >= 1, --omp-wait-policy default/passive/active, --input-scale numbers")
    if args.quick:
        args.reps, args.warmup, args.budget_s = min(args.reps, 3), 1, 3.0
        args.flex = "none" if args.flex == "default" else args.flex
    if args.gqa:
        return run_gqa(args, argv)
    if args.stream:
        return run_stream_mode(args, argv)
    fams = families(args.quick)
    names = args.families.split(",") if args.families else list(fams)
    if set(names) - set(fams):
        sys.exit(f"unknown families {sorted(set(names) - set(fams))}; choose from {list(fams)}")
    fams = {f: fams[f] for f in names}
    if args.worker:  # one setting, in the process `run_setting` started with its environment
        args.setting = (args.thread_counts[0], args.policies[0])
        args.label = setting_label(*args.setting)
        return run_worker(args, fams, args.worker)

    settings = thread_settings(args.thread_counts, args.policies)
    info, counts = harness.machine_info(), sorted({t for t, _ in settings})
    info["threads"] = counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    # the workers print to this process's output: no log file, the output is the log
    out = harness.Output("benchmarks.bench_kernels", argv, args.out, info, args.tag, args.quick, log_file=False)
    out.log(
        f"H={HEADS}, D={DIM}, float32; inputs N(0, s^2) for s in {args.scales}; thread settings "
        f"{[setting_label(*s) for s in settings]}, each in a fresh process; median of up to {args.reps} runs after "
        f"{args.warmup} warmup in interleaved rounds; peak extra, % of limit: benchmarks/templates/kernels.md"
    )
    config = dict(format=2, heads=HEADS, dim=DIM, dtype="float32", reps=args.reps, warmup=args.warmup)
    config.update(quick=args.quick, families=list(fams), input_scales=args.scales, budget_gib=args.budget_gib)
    config["peak_memory"] = "CPU: peak RSS (VmHWM, reset via /proc/self/clear_refs) during one call minus RSS before"
    config["limit"] = "limit_ms = max(bytes / copy_gb_per_s, flops / gemm_gflop_per_s), bytes and flops per pass in"
    config["limit"] += " family_info, rates in the row's setting (benchmarks/limits.py)"
    config["floor"] = (
        "gather floor (fwd rows' floor_ms, setting's floors): ms to read every k and v row once in the graph's edge"
        " order (CSR, destination-major), summed per destination by F.embedding_bag, the faster of (N_src, H*D)"
        " interleaved rows and H head-major (N_src, D) tables; floor_fraction = floor_ms / ms"
    )
    config["compile_s"] = "pyg (compiled): seconds of its first call (and backward for fwd+bwd), not in ms"
    config.update(settings=[], family_info=FAMILY_INFO, baseline=None)
    results: List[KernelResult] = []
    with tempfile.TemporaryDirectory(prefix="bench_kernels_") as tmp:
        for i, (threads, policy) in enumerate(settings):
            data, code = run_setting("benchmarks.bench_kernels", argv, threads, policy, os.path.join(tmp, f"{i}.json"))
            data = data or {"setting": {"label": setting_label(threads, policy), "threads": threads}}
            if code:
                data["setting"]["error"] = f"its process exited with {code}"
                out.log(f"  {data['setting']['error']}; kept what it wrote")
            config["settings"].append(data["setting"])
            FAMILY_INFO.update(data.get("family_info", {}))
            results += [KernelResult(**r) for r in data.get("results", [])]
            out.save(config, results)  # partial results survive
    config["ratios"] = ratio_table(results)
    out.save(config, results)
    harness.write_times(out.png, out.header, plotted(results))
    out.close()


if __name__ == "__main__":
    main()
