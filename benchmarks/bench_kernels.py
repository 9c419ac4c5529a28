"""Edge-attention kernels vs the reference and their peers, per graph family, forward and fwd+bwd.

    python -m benchmarks.bench_kernels                      # every family (~30 min on 2 cores)
    python -m benchmarks.bench_kernels --quick              # small graphs, a minute
    python -m benchmarks.bench_kernels --families window-8192,causal-32x128 --flex all

Contenders: every registered backend and "auto"; "auto (raw)" (the same call on the graph's
(2, E) edge_index tensor, so the structure is validated and built inside every call);
"auto (compiled)" (torch.compile(fullgraph=True) of the call, on COMPILE_FAMILIES); "sdpa" (plain
F.scaled_dot_product_attention on uniform batches: exact softmax, is_causal); "sdpa-masked"
(padded batch + boolean mask, as a user would write it with F.scaled_dot_product_attention);
"dense bmm" (block families: padded bmm + clamp-exp computed directly, no graph: the floor a
dense-block kernel can reach);
"pyg" (torch_geometric itself: TransformerConv's gather -> utils.softmax -> utils.scatter; listed as
skipped when it is not installed); FlexAttention (compiled, block mask) on the families in
FLEX_FAMILIES. DGL runs in its own environment: benchmarks/bench_dgl.py. Inputs are N(0, 0.25), so no
score reaches the clamp and clamp-mode and exact-softmax contenders compute the same numbers;
every output is checked against the reference (or, where the reference would not fit the memory
budget, against "csr") before it is timed. A contender whose estimated memory exceeds
--budget-gib, or that fails, gets a null time and the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, List, Optional, Tuple

import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import available_backends, choose_auto, plan

from .harness import (
    Result,
    machine_header,
    machine_info,
    machine_tag,
    median,
    peak_extra_mib,
    time_interleaved,
    write_json,
    write_png,
)
from .peers import (
    DIM,
    HEADS,
    make_dense_bmm,
    make_flex,
    make_pyg,
    make_sdpa,
    make_sdpa_exact,
    pyg_label,
    sdpa_kernel_name,
)

GiB = 2**30
FAMILY_INFO: Dict[str, dict] = {}  # per family: sizes, auto's pick, dense padding waste (written to the JSON)


@dataclass
class Family:
    """A benchmark graph, built by `build(graphs_module)` (this sparseattn's `graphs`, or the
    baseline's with --baseline). `lengths` (n_src, n_dst) per graph and `kind` describe the padded
    batch the dense peers use; None for single non-block graphs (window, random)."""

    name: str
    build: Callable[[ModuleType], graphs.Graph]
    kind: Optional[str] = None  # "full" or "causal" for block families
    lengths: Optional[List[Tuple[int, int]]] = None


def _blocks(kind: str, sizes: List[Tuple[int, int]]) -> Family:
    return Family("", lambda gr: gr.from_blocks([(kind, s, d) for s, d in sizes]), kind, sizes)


def _varlen(total: int, lo: int, hi: int, seed: int = 0) -> List[int]:
    rng, lengths = random.Random(seed), []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(lo, hi), total - sum(lengths)))
    return lengths


def families(quick: bool) -> Dict[str, Family]:
    def fam(name, f: Family) -> Tuple[str, Family]:
        f.name = name
        return name, f

    if quick:
        return dict(
            [
                fam("window-2048", Family("", lambda gr: gr.window(2048, 8))),
                fam("random-5k", Family("", lambda gr: gr.random(5000, 5000, 5000 * 16, seed=0))),
                fam("complete-16x32", _blocks("full", [(32, 32)] * 16)),
                fam("causal-8x64", _blocks("causal", [(64, 64)] * 8)),
                fam("bipartite-8x40x40", _blocks("full", [(40, 40)] * 8)),
                fam("varlen-5..50-512", _blocks("full", [(n, n) for n in _varlen(512, 5, 50)])),
            ]
        )
    return dict(
        [
            fam("window-8192", Family("", lambda gr: gr.window(8192, 8))),
            fam("window-65536", Family("", lambda gr: gr.window(65536, 8))),
            fam("random-50k", Family("", lambda gr: gr.random(50_000, 50_000, 50_000 * 16, seed=0))),
            fam("complete-64x32", _blocks("full", [(32, 32)] * 64)),
            fam("complete-32x128", _blocks("full", [(128, 128)] * 32)),
            fam("complete-8x512", _blocks("full", [(512, 512)] * 8)),
            fam("causal-32x128", _blocks("causal", [(128, 128)] * 32)),
            fam("bipartite-32x40x40", _blocks("full", [(40, 40)] * 32)),
            fam("varlen-5..50-4096", _blocks("full", [(n, n) for n in _varlen(4096, 5, 50)])),
            fam("complete-2x2048", _blocks("full", [(2048, 2048)] * 2)),
        ]
    )


FLEX_FAMILIES = ("window-8192", "causal-32x128", "window-2048", "causal-8x64")
COMPILE_FAMILIES = ("window-8192", "random-50k", "window-2048")  # inductor compiles each shape and pass once


# ---- runner ------------------------------------------------------------------------------------


def estimate_bytes(name: str, g: graphs.Graph) -> float:
    """Rough fwd+bwd peak of a contender on this graph (used only to skip hopeless runs)."""
    e, n = g.num_edges, g.num_src + g.num_dst
    if name in ("reference", "scatter", "pyg"):
        return e * HEADS * DIM * 4 * 7
    if name in ("csr", "auto", "auto (raw)", "auto (compiled)"):
        return e * HEADS * 4 * 12 + n * HEADS * DIM * 4 * 10
    if name == "dense":
        p = plan(g)
        return sum(bk.b * bk.lq * bk.lk for bk in p.buckets) * HEADS * 4 * 6
    return 0.0


def load_baseline(path: str) -> ModuleType:
    """The sparseattn package at `path` (a checkout of another commit, e.g. `git worktree add
    ../baseline <commit>`), imported as `sparseattn_baseline` beside this one: its contenders run in
    the same process and rounds as this tree's, so eager speed is compared under one load."""
    root = os.path.join(path, "sparseattn")
    spec = importlib.util.spec_from_file_location(
        "sparseattn_baseline", os.path.join(root, "__init__.py"), submodule_search_locations=[root]
    )
    if spec is None or spec.loader is None or not os.path.isfile(os.path.join(root, "__init__.py")):
        sys.exit(f"--baseline {path}: no sparseattn package there")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sparseattn_baseline"] = module
    spec.loader.exec_module(module)
    return module


BASELINE_CONTENDERS = ("csr", "auto", "auto (raw)")  # timed with --baseline as "<name> [baseline]"


def run_family(fam: Family, args, results: List[Result]) -> None:
    g = fam.build(graphs)
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, HEADS, DIM) * 0.5 for n in (g.num_dst, g.num_src, g.num_src))
    budget = args.budget_gib * GiB
    FAMILY_INFO[fam.name] = {
        "num_dst": g.num_dst,
        "num_src": g.num_src,
        "edges": g.num_edges,
        "auto": choose_auto(q, g),
        "dense_waste": plan(g).waste if g.blocks else None,
        "dense_buckets": len(plan(g).buckets) if g.blocks else None,
    }
    print(
        f"\n{fam.name}: N_dst={g.num_dst}, N_src={g.num_src}, E={g.num_edges}, H={HEADS}, D={DIM}, float32"
        + (f", dense padding waste {plan(g).waste:.1%}" if g.blocks else "")
        + f", auto -> {choose_auto(q, g)}"
    )

    contenders: Dict[str, Tuple[Optional[Callable], str, float]] = {}  # name -> (fn(q, k, v), note, bytes)
    for name in available_backends() + ["auto"]:
        if name == "dense" and not g.blocks:
            contenders[name] = (None, "not applicable: graph has no dense blocks", 0)
            continue
        note = f"-> {choose_auto(q, g)}" if name == "auto" else ""
        contenders[name] = (
            (lambda b: lambda q_, k_, v_: edge_attention(q_, k_, v_, g, backend=b))(name),
            note,
            estimate_bytes(name, g),
        )
    for name in ("scatter",):
        if name not in contenders:
            contenders[name] = (None, "skipped: torch_scatter not importable", 0)
    ei = g.edge_index
    contenders["auto (raw)"] = (
        lambda q_, k_, v_: edge_attention(q_, k_, v_, ei),
        "edge_index tensor: builds per call",
        estimate_bytes("auto", g),
    )
    if args.baseline_module is not None:
        base = args.baseline_module
        bg, bei = fam.build(base.graphs), ei.clone()
        for name in BASELINE_CONTENDERS:
            graph, backend = (bei, "auto") if name == "auto (raw)" else (bg, name)
            contenders[f"{name} [baseline]"] = (
                (lambda gr, b: lambda q_, k_, v_: base.edge_attention(q_, k_, v_, gr, backend=b))(graph, backend),
                f"--baseline {args.baseline_label}",
                estimate_bytes("auto", g),
            )
    if fam.name in COMPILE_FAMILIES:
        contenders["auto (compiled)"] = (
            "compiled",
            "torch.compile(fullgraph=True), inductor",
            estimate_bytes("auto", g),
        )
    if fam.lengths is not None and fam.kind in ("full", "causal"):
        uniform = all(x == fam.lengths[0] and x[0] == x[1] for x in fam.lengths)
        contenders["sdpa"] = (
            "sdpa-exact" if uniform else None,
            "unmasked SDPA on (B, H, L, D) views, exact softmax"
            if uniform
            else "not applicable: needs a uniform batch of square blocks",
            0,
        )
    contenders["sdpa-masked"] = ("sdpa", "padded batch + boolean mask", 0)
    if fam.lengths is not None:
        contenders["dense bmm"] = ("bmm", "padded bmm + clamp-exp, no graph", 0)
    try:
        contenders["pyg"] = ("pyg", pyg_label(), estimate_bytes("pyg", g))
    except ImportError:
        contenders["pyg"] = (None, "skipped: torch_geometric is not installed", 0)
    if args.flex == "all" or (args.flex == "default" and fam.name in FLEX_FAMILIES):
        contenders["flex_attention"] = ("flex", "torch.compile(flex_attention) + block mask", 0)
    else:
        contenders["flex_attention"] = (
            None,
            "skipped: compiling takes ~1 min per shape and pass on this machine; run with --flex all",
            0,
        )
    contenders["dgl"] = (None, "in its own environment (torch 2.2): python -m benchmarks.bench_dgl", 0)

    if args.contenders:
        contenders = {n: c for n, c in contenders.items() if n in args.contenders.split(",")}
    # the numbers every contender is checked against
    checker = "reference" if estimate_bytes("reference", g) / 7 * 3 <= budget else "csr"
    with torch.no_grad():
        gold = edge_attention(q, k, v, g, backend=checker)

    for mode in ("fwd", "fwd+bwd"):
        leaves = [x.clone().requires_grad_(mode == "fwd+bwd") for x in (q, k, v)]
        gout = torch.randn_like(gold)
        ref_ms, ready = None, []  # ready: (result, fn) checked and measured, timed below in rounds
        for name, (spec, note, est) in contenders.items():
            r = Result(fam.name, g.num_edges, name, mode, note=note)
            results.append(r)
            if spec is None:
                _print_row(r)
                continue
            try:
                if spec == "sdpa":
                    call, est = make_sdpa(fam, g, *leaves)
                elif spec == "sdpa-exact":
                    call = make_sdpa_exact(fam, g, *leaves)
                    FAMILY_INFO[fam.name]["sdpa_kernel"] = sdpa_kernel_name(call)
                    r.note += f"; {FAMILY_INFO[fam.name]['sdpa_kernel']}"
                elif spec == "compiled":  # on the graph the eager contenders used (its structure cached)
                    compiled = torch.compile(lambda q_, k_, v_: edge_attention(q_, k_, v_, g), fullgraph=True)
                    call = (lambda c, args: lambda: c(*args))(compiled, leaves)
                elif spec == "bmm":
                    call, est = make_dense_bmm(fam, g, *leaves)
                elif spec == "pyg":
                    call, est, r.note = make_pyg(g, *leaves)
                elif spec == "flex":
                    call = make_flex(fam, g, *leaves)
                else:
                    call = (lambda fn_, args: lambda: fn_(*args))(spec, leaves)
                factor = 1.0 if mode == "fwd+bwd" else 0.5
                if est * factor > budget:
                    r.note = f"skipped: needs ~{est * factor / GiB:.0f} GiB > --budget-gib {args.budget_gib:g}"
                    _print_row(r)
                    continue
                if mode == "fwd":

                    def fn(call=call):
                        with torch.no_grad():
                            return call()
                else:

                    def fn(call=call, gout=gout, leaves=leaves):
                        out = call()
                        out.backward(gout)
                        for x in leaves:
                            x.grad = None
                        return out

                with torch.no_grad():
                    out = call()
                r.max_err_vs_reference = (out.float() - gold).abs().max().item()
                if checker != "reference":
                    r.note = (r.note + "; " if r.note else "") + "error vs csr (reference exceeds the budget)"
                if not r.max_err_vs_reference <= 1e-3:
                    raise AssertionError(f"max |err| vs {checker} = {r.max_err_vs_reference:.3g}")
                del out
                r.peak_extra_mib = peak_extra_mib(fn)
                ready.append((r, fn))
                continue
            except Exception as exc:  # OOM, unsupported op, wrong answer: a null with the reason
                _fail(r, exc, args.verbose)
            _print_row(r)
        timed = time_interleaved([fn for _, fn in ready], warmup=args.warmup, reps=args.reps, budget_s=args.budget_s)
        for (r, _), times in zip(ready, timed):
            if isinstance(times, Exception):
                _fail(r, times, args.verbose)
            else:
                r.times_ms, r.ms = times, median(times)
                traffic = (g.num_dst * HEADS * DIM * 2 + g.num_src * HEADS * DIM * 2) * 4 + g.num_edges * 8
                r.gb_per_s = traffic * (1 if mode == "fwd" else 3) / (r.ms * 1e-3) / 1e9
                if r.contender == "reference":
                    ref_ms = r.ms
            _print_row(r)
        for r in results:
            if r.family == fam.name and r.mode == mode and r.ms and ref_ms:
                r.speedup_vs_reference = ref_ms / r.ms
        if ref_ms is None:
            print(f"  ({mode}: reference skipped, no speedup column)")


def _fail(r: Result, exc: BaseException, verbose: bool) -> None:
    r.ms, r.note = None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if verbose:
        traceback.print_exception(exc)


def _print_row(r: Result) -> None:
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    print(
        f"  {r.mode:8s} {r.contender:15s} {fmt(r.ms, '10.2f')} ms  peak +{fmt(r.peak_extra_mib, '8.1f')} MiB  "
        f"{fmt(r.gb_per_s, '6.2f')} GB/s  err {fmt(r.max_err_vs_reference, '.1e')}  {r.note}",
        flush=True,
    )


def summary_table(results: List[Result]) -> str:
    lines = ["family               pass     contender        ms         x vs ref   peak extra MiB  max|err|"]
    for r in results:
        if r.ms is None:
            continue
        sp = "-" if r.speedup_vs_reference is None else f"{r.speedup_vs_reference:.1f}x"
        pk = "-" if r.peak_extra_mib is None else f"{r.peak_extra_mib:.0f}"
        lines.append(
            f"{r.family:20s} {r.mode:8s} {r.contender:15s} {r.ms:10.2f} {sp:>10s} {pk:>15s}  "
            f"{r.max_err_vs_reference:.1e}"
        )
    return "\n".join(lines)


RATIOS = {  # targets: name -> (numerator, denominator, target as "<= x" / ">= x" or None)
    "auto/sdpa": ("auto", "sdpa", "<= 1.1"),
    "raw/Graph": ("auto (raw)", "auto", "<= 1.5"),
    "compiled/eager": ("auto (compiled)", "auto", None),
    "pyg/auto": ("pyg", "auto", ">= 15"),
    # --baseline: this tree's eager time over the baseline's, in the same rounds
    **{f"{n}/baseline": (n, f"{n} [baseline]", "<= 1.05") for n in BASELINE_CONTENDERS},
}


def ratio_table(results: List[Result]) -> Tuple[str, dict]:
    """Target ratios per family: auto/sdpa, raw/Graph and pyg/auto per pass, csr backward/forward
    (the backward alone: fwd+bwd minus fwd, over fwd)."""
    ms = {(r.family, r.contender, r.mode): r.ms for r in results if r.ms}
    out, lines = {}, ["family               ratio            fwd     fwd+bwd  target"]
    for fam in dict.fromkeys(r.family for r in results):
        for name, (num, den, target) in RATIOS.items():
            vals = [
                ms.get((fam, num, m)) and ms.get((fam, den, m)) and ms[fam, num, m] / ms[fam, den, m]
                for m in ("fwd", "fwd+bwd")
            ]
            if any(vals):
                out[f"{fam} {name}"] = vals
                lines.append(
                    f"{fam:20s} {name:15s} "
                    + "  ".join("      -" if x is None else f"{x:7.2f}" for x in vals)
                    + (f"  {target}" if target else "")
                )
        f, fb = ms.get((fam, "csr", "fwd")), ms.get((fam, "csr", "fwd+bwd"))
        if f and fb:
            out[f"{fam} csr bwd/fwd"] = [(fb - f) / f]
            lines.append(f"{fam:20s} {'csr bwd/fwd':15s} {(fb - f) / f:7.2f}           <= 2.5")
    return "\n".join(lines), out


def _commit_of(path: str) -> str:
    """The short commit hash checked out at `path`, or its folder name."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or os.path.basename(os.path.abspath(path))
    except OSError:
        return os.path.basename(os.path.abspath(path))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small graphs, few repetitions (a smoke test)")
    ap.add_argument("--families", default="", help="comma-separated family names (default: all)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per contender (median reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=8.0, help="max seconds of timed runs per contender")
    ap.add_argument("--budget-gib", type=float, default=8.0, help="skip contenders estimated to need more")
    ap.add_argument("--flex", choices=["none", "default", "all"], default="default")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--contenders", default="", help="comma-separated contender names (default: all)")
    ap.add_argument("--tag", default="", help="suffix for the result file names (e.g. a re-run of some families)")
    ap.add_argument(
        "--baseline",
        default="",
        help="a checkout of another commit (its folder); adds its csr, auto and auto (raw) as '... [baseline]'",
    )
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    args.baseline_module = load_baseline(args.baseline) if args.baseline else None
    args.baseline_label = _commit_of(args.baseline) if args.baseline else ""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.reps, args.warmup, args.budget_s = min(args.reps, 3), 1, 3.0
        args.flex = "none" if args.flex == "default" else args.flex
    fams = families(args.quick)
    if args.families:
        unknown = [f for f in args.families.split(",") if f not in fams]
        if unknown:
            sys.exit(f"unknown families {unknown}; choose from {list(fams)}")
        fams = {f: fams[f] for f in args.families.split(",")}
    info = machine_info()
    print(machine_header(info))
    print(
        f"H={HEADS}, D={DIM}, float32; median of up to {args.reps} runs after {args.warmup} warmup, contenders timed "
        f"in interleaved rounds; peak extra = "
        f"peak RSS during one call minus RSS before it"
    )
    results: List[Result] = []
    stem = f"bench_kernels{'_quick' if args.quick else ''}_{machine_tag(info)}{'_' + args.tag if args.tag else ''}"
    config = {
        "heads": HEADS,
        "dim": DIM,
        "dtype": "float32",
        "reps": args.reps,
        "warmup": args.warmup,
        "quick": args.quick,
        "families": list(fams),
        "budget_gib": args.budget_gib,
        "peak_memory": "CPU: peak RSS (VmHWM, reset via /proc/self/clear_refs) during one call minus RSS before",
        "family_info": FAMILY_INFO,
        "baseline": args.baseline_label or None,
        "commit": _commit_of(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    }
    for fam in fams.values():
        run_family(fam, args, results)
        write_json(os.path.join(args.out, stem + ".json"), info, config, results)  # partial results survive a kill
    print("\n" + summary_table(results))
    table, ratios = ratio_table(results)
    config["ratios"] = ratios
    write_json(os.path.join(args.out, stem + ".json"), info, config, results)
    print(f"\n{table}\nload average at the end: {os.getloadavg()[0]:.1f}")
    drawn = write_png(os.path.join(args.out, stem + ".png"), machine_header(info), results)
    print(f"\nwrote {os.path.join(args.out, stem)}.json" + (" and .png" if drawn else " (no matplotlib: no PNG)"))


if __name__ == "__main__":
    main()
