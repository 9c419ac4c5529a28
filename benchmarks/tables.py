"""The benchmark pages, generated from the stored results: python -m benchmarks.tables

Reads every `benchmarks/results/<bench>_<machine>[_<variant>].json` and writes
`docs/benchmarks/<page>.md` (one page per benchmark: a section per machine, with its variants),
`docs/benchmarks/index.md` (one line per benchmark and machine with its headline figure); the kept
probe logs (`PROBES`) go at the end of the page they belong to, and each run's PNG is copied to
`docs/benchmarks/img/`, so the documentation site serves it. Every number on the pages comes from
the JSON files; what a JSON does not hold (the commit a run was measured at, the command that
reproduces it) is in `KNOWN` below, tied to the run's date so that a new run under the same name
shows "commit not recorded" until it is added.

    python -m benchmarks.tables            # write the pages and images
    python -m benchmarks.tables --check    # exit 1 if the committed pages or images differ

File names: `<bench>_<machine>[_<variant>].{json,png,log}`, where <machine> is the harness's
`machine_tag` (CPU model, threads, GPU or "cpu"), <variant> a run with other settings than the
default (`--tag`), and `probe_<name>_<machine>[_<variant>].log` for probe logs (no JSON).
`tests/test_bench_tables.py` checks that the committed pages equal what this module generates,
that every stored result is on a page, and that every file follows the convention.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .kernels_report import CSR_FWD_BWD, LIMIT_TARGETS, RATIOS, THREAD_GAIN, KernelResult, ratio_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
DOCS = os.path.join(ROOT, "docs", "benchmarks")
RESULTS_REL = "benchmarks/results"

BENCHES = ("kernels", "layers", "train", "compile", "dgl", "triton_gpu", "distributed")
PAGES = ("kernels", "layers", "train", "compile", "dgl", "triton_gpu", "distributed")
TITLES = {
    "kernels": "Kernels: edge attention per graph family",
    "layers": "Layers: sparseattn.nn.TransformerConv against PyG",
    "train": "Training step: graph Transformer against torch.nn.Transformer",
    "compile": "Compiled against eager",
    "dgl": "Against DGL",
    "triton_gpu": "Triton kernels on a GPU",
    "distributed": "Several processes: a partitioned graph",
}
MACHINE_RE = r"[a-z0-9]+(?:-[a-z0-9]+)*-\d+(?:-\d+)?t-[a-z0-9]+(?:-[a-z0-9]+)*"
NAME_RE = re.compile(
    rf"^(?P<bench>bench_(?:{'|'.join(BENCHES)})|probe_[a-z0-9]+(?:_[a-z0-9]+)*?)_(?P<machine>{MACHINE_RE})"
    r"(?:_(?P<variant>[a-z0-9]+(?:-[a-z0-9]+)*))?\.(?P<ext>json|png|log)$"
)


def parse_name(filename: str) -> Optional[Dict[str, str]]:
    """bench, machine, variant ("" for the default run) and ext of a results file, or None."""
    m = NAME_RE.match(filename)
    if m is None:
        return None
    return {"bench": m["bench"], "machine": m["machine"], "variant": m["variant"] or "", "ext": m["ext"]}


# ---- what the JSON files do not say -------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """A stored run's commit and command. `date` is the JSON's machine date: a later run written
    under the same name is another run, and its page says "commit not recorded"."""

    date: str
    code: str
    command: str
    about: str = ""


H100 = "intel-xeon-processor-16t-nvidia-h100-80gb-hbm3"
KERNELS_CMD = "python -m benchmarks.bench_kernels --threads 1 --flex none --reps 7 --budget-s 6"
THP_CMD = KERNELS_CMD + " --families window-8192,window-65536,random-50k --contenders 'auto,auto (raw)'"
KNOWN: Dict[str, Known] = {
    "bench_kernels_amd-epyc-1t-cpu": Known(
        "2026-11-24 16:53 UTC",
        "b6b42db",
        "python -m benchmarks.bench_kernels --threads 1 --input-scale 1",
        "Inputs N(0, 1), where the clamp binds. Load 1.0 at start and end; while `random-50k` and"
        " `powerlaw-50k` ran, a test process of lower priority ran beside it (load up to 2.3), so those two"
        " rows may read a little slow.",
    ),
    "bench_kernels_amd-epyc-1t-cpu_varlen": Known(
        "2026-11-24 17:40 UTC",
        "4a1db8f",
        "python -m benchmarks.bench_kernels --threads 1 --input-scale 1 --families varlen-5..50-4096"
        " --contenders csr,dense,auto --tag varlen",
        "The variable-length batch after the main run, on the final code: `dense` without autograd reads one"
        " bucket's rows at a time again (the main run's code gathered all of them at once in inference too)."
        " Peak memory here comes from a process that ran three contenders, so compare it within this run only.",
    ),
    "bench_kernels_amd-epyc-1-2t-cpu_threads": Known(
        "2026-11-24 14:24 UTC",
        "5207a20",
        "python -m benchmarks.bench_kernels --threads 1,2 --omp-wait-policy default,passive --input-scale 1"
        " --families window-8192,window-65536,random-50k --contenders csr,auto --tag threads",
        "One and two threads, OpenMP's default wait policy and PASSIVE, on the sparse families, of the same"
        " kernels as the main run; load 1.0 at 1 thread, 1.0-1.7 at 2 (the benchmark's own two threads).",
    ),
    "bench_kernels_amd-epyc-1t-cpu_clamp": Known(
        "2026-11-24 18:37 UTC",
        "d253a9e",
        "python -m benchmarks.bench_kernels --threads 1 --input-scale 1"
        " --families complete-32x128,complete-8x512,causal-32x128 --contenders auto,sdpa --tag clamp",
        "Clamp-mode `auto` against SDPA on the final code's dense tiles, N(0, 1) inputs, the families of the"
        " 1.15x target; load 0.7-0.8. The main run's 1.12-1.19 and these 1.12-1.19 differ by run-to-run"
        " spread of a few percent.",
    ),
    "bench_kernels_amd-epyc-2t-cpu_pyg-2t": Known(
        "2026-11-24 18:14 UTC",
        "5aea0f1",
        "python -m benchmarks.bench_kernels --threads 2 --input-scale 1"
        " --families window-8192,random-50k,powerlaw-50k,varlen-5..50-4096 --contenders auto,pyg --tag pyg-2t",
        "`auto` against torch_geometric at two threads, OpenMP's default wait policy and PASSIVE, on the"
        " sparse families (window-65536's PyG forward+backward is over the time budget); load 1.2-2.0, the"
        " benchmark's own two threads.",
    ),
    "bench_kernels_amd-epyc-1t-cpu_thp-off": Known(
        "2026-11-23 02:12 UTC", "76912fc", THP_CMD + " --tag thp-off", "Three large graphs in the default environment."
    ),
    "bench_kernels_amd-epyc-1t-cpu_thp-on": Known(
        "2026-11-23 02:13 UTC",
        "76912fc",
        "THP_MEM_ALLOC_ENABLE=1 " + THP_CMD + " --tag thp-on",
        "The same three graphs with `THP_MEM_ALLOC_ENABLE=1`, run right after.",
    ),
    "bench_dgl_amd-epyc-1t-cpu": Known(
        "2026-11-24 17:28 UTC", "b6b42db", "python -m benchmarks.bench_dgl --dgl-python DGL_VENV/bin/python"
    ),
    "bench_dgl_amd-epyc-2t-cpu": Known(
        "2026-11-24 18:06 UTC",
        "5aea0f1",
        "python -m benchmarks.bench_dgl --dgl-python DGL_VENV/bin/python --threads 2",
        "Two threads on each side, OpenMP's default wait policy: both processes' idle threads spin on the"
        " same two cores, which slows whichever side runs next; load 0.3-2.0.",
    ),
    "bench_dgl_amd-epyc-2t-cpu_passive": Known(
        "2026-11-24 18:12 UTC",
        "5aea0f1",
        "OMP_WAIT_POLICY=PASSIVE python -m benchmarks.bench_dgl --dgl-python DGL_VENV/bin/python --threads 2"
        " --families window-8192,random-50k,varlen-5..50-4096 --tag passive",
        "Two threads with `OMP_WAIT_POLICY=PASSIVE` in both processes (the DGL runner inherits the"
        " environment), on the sparse families; load 0.3-1.6.",
    ),
    "bench_layers_amd-epyc-1t-cpu": Known("2026-11-24 15:24 UTC", "4ebc45e", "python -m benchmarks.bench_layers"),
    "bench_compile_amd-epyc-1t-cpu": Known("2026-11-24 05:10 UTC", "ae37849", "python -m benchmarks.bench_compile"),
    "bench_distributed_amd-epyc-1t-cpu": Known(
        "2026-11-24 09:19 UTC", "2e57f8e", "python -m benchmarks.bench_distributed"
    ),
    "bench_train_amd-epyc-1t-cpu_compile": Known(
        "2026-11-24 05:15 UTC",
        "ae37849",
        "python -m benchmarks.bench_train --data-dir data/multi30k --threads 1 --compile --tag compile",
        "The training step with every encoder and decoder layer compiled (`bench_train --compile`), both tasks.",
    ),
    "bench_train_amd-epyc-1t-cpu_compile-multi30k": Known(
        "2026-11-24 05:22 UTC",
        "ae37849",
        "python -m benchmarks.bench_train --data-dir data/multi30k --tasks multi30k --threads 1 --rounds 7 --compile"
        " --tag compile-multi30k",
        "Multi30k alone with 7 rounds, started 7 minutes after the `compile` run, whose eager steps were slower"
        " (the eager column): the more reliable Multi30k figure.",
    ),
    "bench_train_amd-epyc-1-2t-cpu": Known(
        "2026-11-24 17:31 UTC", "b6b42db", "python -m benchmarks.bench_train --data-dir data/multi30k --threads 1 2"
    ),
    f"bench_train_{H100}": Known(
        "2026-11-23 03:39 UTC",
        "e29d907",
        "python -m benchmarks.bench_train --data-dir data/multi30k --device cuda --threads 16 --rounds 5 --batches 4",
        "On this GPU both models are bound by the host (Python, dispatch, kernel launches): the GPU is busy for a"
        " small part of each step (the log gives the busy time per run), so skipping padding buys nothing. The two"
        " host synchronizations per graph-model step that this run's profile showed (the triton kernels' scalar"
        " tensor, the positional encoding's largest position) have been removed since; not re-measured on a GPU.",
    ),
    f"bench_train_{H100}_backends": Known(
        "2026-11-23 03:17 UTC",
        "b33dba5 with the half-input SDPA of 0198106",
        "python -m benchmarks.bench_train --data-dir data/multi30k --device cuda --threads 16 --rounds 3 --batches 4"
        " --tasks multi30k --backends auto dense csr --tag backends",
        "The graph model on each backend, Multi30k, same batches.",
    ),
    f"bench_triton_gpu_{H100}": Known(
        "2026-11-23 03:29 UTC",
        "0198106",
        "python benchmarks/bench_triton_gpu.py --budget 230",
        "The kernels have changed since this run (edge terms, the eager entry into the ops); not re-measured on a GPU.",
    ),
    f"bench_triton_gpu_{H100}_sweep": Known(
        "2026-11-22 23:34 UTC",
        "45b9c15 (whose default forward layout, the `triton` row, was `tile`)",
        "python benchmarks/bench_triton_gpu.py --sweep --cases random,window8,window64,complete512 --modes clamp"
        " --budget 170",
        "Forward only, clamp mode: each layout (`tile`, `lanes`, `heads`) with each edge tile (E), warp count (w)"
        " and pipeline stages (s). The `heads` layout with its ~2048-element tiles became the default from this"
        " sweep.",
    ),
    f"bench_triton_gpu_{H100}_sweep-backward": Known(
        "2026-11-23 00:17 UTC",
        "2b19950 (the `triton` row: the default backward, 8 edges per tile with 1 warp at D=64)",
        "python benchmarks/bench_triton_gpu.py --sweep-backward --cases random,window8,complete512 --modes clamp"
        " --budget 120 --contender-s 1.5",
        "Forward+backward, clamp mode: the backward kernels' edge tile (E) and warp count (w), forward at its default.",
    ),
}

PROBES: Dict[str, Tuple[str, str, str]] = {  # log stem -> (page, title, what it measured and decided)
    f"probe_dense_blocks_gpu_{H100}": (
        "triton_gpu",
        "Dense blocks in clamp mode: the fused kernel",
        "`python -m benchmarks.probe_dense_blocks_gpu` (with `QUICK=1`): `dense`'s fused clamp-mode kernel"
        " (`sparseattn/kernels/triton_blocks.py`, tiles of 64x64, 4 warps, 3 stages at D <= 64) against the"
        " batched matmuls it replaced ('materialized') and SDPA's exact softmax, on complete and causal blocks.",
    ),
    f"probe_dense_blocks_gpu_{H100}_sweep": (
        "triton_gpu",
        "Dense blocks in clamp mode: tiles, and float32",
        "The first run of that kernel, with float32 inputs routed to it too and a sweep of 7 tile settings: the"
        " shipped 64x64 tiles with 4 warps and 3 stages come from it, and float32 stays on the batched matmuls"
        " (the kernel's IEEE float32 backward took 18-60x longer).",
    ),
    f"probe_triton_layouts_{H100}": (
        "triton_gpu",
        "Triton edge kernels: forward layout by head count and width",
        'Forward ms of `backend="triton"` per forced layout at H x D from 256 to 4096 on a random graph of'
        " 65,536 nodes and 1M edges (the probe's code is in the log): the record behind the rule 'per-head"
        " `tile` programs when H x D < 512, the `heads` layout otherwise'.",
    ),
}


# ---- the stored runs ----------------------------------------------------------------------------


@dataclass
class Run:
    stem: str
    bench: str  # "kernels", "train", ...
    machine: str
    variant: str
    data: Dict[str, Any]
    png: bool
    log: bool

    @property
    def info(self) -> Dict[str, Any]:
        return self.data["machine"]

    @property
    def results(self) -> List[Dict[str, Any]]:
        return self.data.get("results", [])

    @property
    def config(self) -> Dict[str, Any]:
        return self.data.get("config", {})

    @property
    def page(self) -> str:
        if self.bench == "train" and self.config.get("compile"):
            return "compile"
        return self.bench


def load_runs(results: str = RESULTS) -> List[Run]:
    names = set(os.listdir(results))
    runs = []
    for name in sorted(names):
        parsed = parse_name(name)
        if parsed is None or parsed["ext"] != "json" or not parsed["bench"].startswith("bench_"):
            continue
        stem = name[: -len(".json")]
        with open(os.path.join(results, name)) as f:
            data = json.load(f)
        bench = parsed["bench"][len("bench_") :]
        runs.append(
            Run(stem, bench, parsed["machine"], parsed["variant"], data, stem + ".png" in names, stem + ".log" in names)
        )
    return runs


# ---- formatting ---------------------------------------------------------------------------------

DASH = "–"


def f_ms(x: Optional[float]) -> str:
    """Milliseconds to about three significant digits."""
    if x is None:
        return DASH
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def f_x(r: Optional[float]) -> str:
    if r is None:
        return DASH
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    return f"{r:.2f}x"


def f_int(x: Optional[float]) -> str:
    return DASH if x is None else f"{x:,.0f}"


def f_pct(x: Optional[float]) -> str:
    return DASH if x is None else f"{100 * x:.1f}%"


def table(head: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A markdown table; columns in `right` are right-aligned (numbers)."""
    lines = ["| " + " | ".join(head) + " |"]
    lines.append("| " + " | ".join("---:" if i in right else "---" for i in range(len(head))) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def skipped(note: str) -> str:
    """A short cell for a contender that has no time, from its note."""
    n = note.lower()
    if "out of memory" in n:
        return "out of memory"
    if n.startswith("not applicable") or "not a batch of equal complete blocks" in n:
        return "n/a"
    if "needs ~" in n and "budget" in n:
        return "over budget"
    if "auto picks" in n:
        return "= " + n.rsplit(" ", 2)[-2]
    if "not one contiguous range" in n:
        return "cannot express"
    if "exact softmax only" in n:
        return "exact only"
    if "not installed" in n or "no module" in n:
        return "not installed"
    return "failed" if n.startswith(("failed", "error")) else "skipped"


LEGEND = (
    "n/a: the contender does not apply to the graph; over budget: its estimated memory exceeds the run's"
    " `--budget-gib`, so it was not run; cannot express: the contender has no way to describe the graph."
)


def machine_desc(info: Dict[str, Any]) -> str:
    cpu = info["cpu"] + (f" ({info['cpu_capability']})" if info.get("cpu_capability") else "")
    threads = str(info["threads"])
    threads = threads.replace("-", " and ") + (" thread" if threads == "1" else " threads")
    gpu = info.get("gpu", "no GPU")
    return f"{cpu}, {threads}, {gpu}"


def versions(info: Dict[str, Any]) -> str:
    out = [f"sparseattn {info['sparseattn']}", f"torch {info['torch']}"]
    if info.get("cuda"):
        out.append(f"CUDA {info['cuda']}")
    for name in ("triton", "torch_geometric"):
        if info.get(name):
            out.append(f"{name} {info[name]}")
    dgl = info.get("dgl")
    if isinstance(dgl, dict):
        out.append(f"DGL {dgl['dgl']} on torch {dgl['torch']} (own process)")
    out.append(f"Python {info['python']}")
    return ", ".join(out)


def loads(run: Run) -> List[float]:
    values = [run.info.get("load_average")] + [r.get("load_average") for r in run.results if isinstance(r, dict)]
    for r in run.results:  # bench_dgl notes each row's load
        m = re.search(r"load (\d+\.\d+)", str(r.get("note", "")))
        if m:
            values.append(float(m.group(1)))
    return [float(v) for v in values if isinstance(v, (int, float))]


def f_load(run: Run) -> str:
    values = loads(run)
    if not values:
        return "load not recorded"
    lo, hi = min(values), max(values)
    return f"load average {lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"load average {lo:.1f}-{hi:.1f}"


def known(run: Run) -> Optional[Known]:
    k = KNOWN.get(run.stem)
    return k if k is not None and k.date == run.info.get("date") else None


def command(run: Run) -> str:
    k = known(run)
    if k is not None:
        return k.command
    return f"python -m benchmarks.bench_{run.bench}" + (f" --tag {run.variant}" if run.variant else "")


def header(run: Run) -> str:
    k = known(run)
    info = run.info
    code = f"commit {k.code}" if k is not None else "commit not recorded"
    files = [f"`{RESULTS_REL}/{run.stem}.json`"] + [f"`.{e}`" for e, has in (("log", run.log), ("png", run.png)) if has]
    items = [
        f"Command: `{command(run)}`",
        f"Machine: {machine_desc(info)}",
        f"Versions: {versions(info)}",
        f"Measured: {info['date']}, {code}, {f_load(run)}",
    ]
    if info.get("env"):
        items.append("Environment: " + ", ".join(f"`{k}={v}`" for k, v in info["env"].items()))
    items.append("Files: " + ", ".join(files))
    out = (k.about + "\n\n") if k is not None and k.about else ""
    return out + "\n".join(f"- {item}" for item in items)


def plot(run: Run) -> str:
    return f"![{run.stem}](img/{run.stem}.png)" if run.png else ""


def by_key(rows: Iterable[Dict[str, Any]], *keys: str) -> Dict[Tuple[Any, ...], Dict[str, Any]]:
    return {tuple(r[k] for k in keys): r for r in rows}


def ordered(values: Iterable[str], first: Sequence[str] = ()) -> List[str]:
    seen = list(dict.fromkeys(values))
    return [v for v in first if v in seen] + [v for v in seen if v not in first]


def median_range(values: Sequence[float]) -> str:
    if not values:
        return DASH
    return f"{f_x(statistics.median(values))} ({f_x(min(values))[:-1]}-{f_x(max(values))})"


# ---- kernels ------------------------------------------------------------------------------------

KERNEL_ORDER = ("csr", "dense", "auto", "auto (raw)", "auto (compiled)", "sdpa", "sdpa-masked", "dense bmm", "pyg")


def _bound(text: Optional[str]) -> Optional[Tuple[str, float]]:
    """A kernels_report target, "<= 1.15" -> ("<=", 1.15); None stays None."""
    if text is None:
        return None
    op, value = text.split()
    return op, float(value)


KERNEL_TARGETS = (  # the ratio names of kernels_report.ratio_table, the column head, its target there
    ("auto/sdpa", "clamp-mode `auto` / `sdpa`", _bound(RATIOS["auto/sdpa"][2])),
    ("raw/Graph", "`auto (raw)` / `auto`", _bound(RATIOS["raw/Graph"][2])),
    ("csr fwd+bwd/fwd", "`csr` fwd+bwd / fwd", _bound(CSR_FWD_BWD)),
    ("pyg/auto", "`pyg` / `auto`", _bound(RATIOS["pyg/auto"][2])),
    ("compiled/eager", "`auto (compiled)` / `auto`", None),
    ("auto limit share", "`auto` fwd, share of the limit (≥ 25% on window-65536)", None),  # per family: below
    ("auto 1 thread/this", "`auto` at 1 thread / here", _bound(THREAD_GAIN[1])),
)
SHARE_TARGETS = {family: _bound(target) for family, target in LIMIT_TARGETS.items()}  # on "auto limit share"


def _misses(value: Optional[float], target: Optional[Tuple[str, float]]) -> bool:
    if value is None or target is None:
        return False
    op, bound = target
    return value > bound if op == "<=" else value < bound


# A bench_kernels run of format 2 (config["format"]) times each family at several thread settings
# and input scales: its rows carry `threads`, `omp_wait_policy` and `input_scale`, its config the
# settings (OpenMP environment, copy bandwidth, GEMM rate) and ratio records per setting and scale,
# and every row its physical limit. Earlier runs hold one setting, and their tables have no such
# columns.


def _is_v2(run: Run) -> bool:
    return run.config.get("format", 1) >= 2


def _setting(row: Dict[str, Any]) -> str:
    policy = row.get("omp_wait_policy", "default")
    return str(row.get("threads")) + ("" if policy == "default" else f" {policy}")


def _group(run: Run, row: Dict[str, Any]) -> Tuple[str, ...]:
    """The group cells a row's table line starts with after its family: (threads, input σ) for a
    run of format 2, nothing for an earlier one."""
    return (_setting(row), f"{row.get('input_scale', 0.5):g}") if _is_v2(run) else ()


GROUP_HEAD = ["threads", "input σ"]


def _lines(run: Run) -> List[Tuple[str, Tuple[str, ...]]]:
    """(family, group) per table line, families in run order, then groups in run order."""
    groups = ordered(_group(run, r) for r in run.results)
    have = {(r["family"], _group(run, r)) for r in run.results}
    return [(f, gr) for f in ordered(r["family"] for r in run.results) for gr in groups if (f, gr) in have]


def _ratio_lines(run: Run) -> List[Tuple[List[str], Dict[str, List[Optional[float]]]]]:
    """Each table line's first cells and its ratios by name, from the JSON's records."""
    ratios = run.config.get("ratios", {})
    if not _is_v2(run):
        families = ordered(r["family"] for r in run.results)
        return [
            ([f"`{f}`"], {k[len(f) + 1 :]: v for k, v in ratios.items() if k.startswith(f + " ")}) for f in families
        ]
    by_line: Dict[Tuple[str, Tuple[str, ...]], Dict[str, List[Optional[float]]]] = {}
    for rec in ratio_table([KernelResult(**r) for r in run.results])[1]:  # today's definitions, from the rows
        line = (rec["family"], (rec["threads"], f"{rec['input_scale']:g}"))
        by_line.setdefault(line, {})[rec["ratio"]] = rec["values"]
    return [([f"`{f}`", *gr], by_line[f, gr]) for f, gr in _lines(run) if (f, gr) in by_line]


def kernel_ratios(run: Run) -> Tuple[str, int, int]:
    """The target-ratio table, and how many of its ratios meet their target, of how many."""
    lines = _ratio_lines(run)
    present = [(k, head, t) for k, head, t in KERNEL_TARGETS if any(k in ratios for _, ratios in lines)]
    rows, met, total = [], 0, 0
    for first, ratios in lines:
        row = list(first)
        for key, _, target in present:
            cells = []
            if key == "auto limit share":
                target = SHARE_TARGETS.get(first[0].strip("`"))
            for v in ratios.get(key, []):
                if v is not None and target is not None:
                    total += 1
                    met += not _misses(v, target)
                text = f_pct(v) if key == "auto limit share" else f_x(v)
                cells.append(f"**{text}**" if _misses(v, target) else text)
            row.append(" / ".join(cells) if cells else DASH)
        rows.append(row)
    head = (["family"] + (GROUP_HEAD if _is_v2(run) else [])) + [
        h + (f" ({t[0].replace('<=', '≤').replace('>=', '≥')} {t[1]:g})" if t else "") for _, h, t in present
    ]
    first = 1 + (len(GROUP_HEAD) if _is_v2(run) else 0)
    return table(head, rows, right=range(first, len(head))), met, total


MOVED = (("bytes", 1e6, 0), ("flops", 1e9, 2))  # must_move's bytes in MB and flops in GFLOP, with decimals


def family_table(run: Run) -> str:
    fams = run.config.get("family_info", {})
    rows = []
    for fam in ordered(r["family"] for r in run.results):
        fi = fams.get(fam, {})
        waste = fi.get("dense_waste")
        row = [
            f"`{fam}`",
            f_int(fi.get("num_dst")),
            f_int(fi.get("edges")),
            f"`{fi.get('auto', '?')}`",
            DASH if waste is None else f"{100 * waste:.0f}%",
        ]
        if _is_v2(run):
            row.append(f"{f_int(fi.get('max_in_degree'))} / {f_int(fi.get('max_out_degree'))}")
            for k, d, p in MOVED:
                vals = [fi.get(k, {}).get(m) for m in ("fwd", "fwd+bwd")]
                row.append(" / ".join(DASH if v is None else f"{v / d:,.{p}f}" for v in vals))
        rows.append(row)
    head = ["family", "nodes", "edges", "`auto` picks", "dense padding"]
    if _is_v2(run):
        head += ["max in / out degree", "MB moved, fwd / fwd+bwd", "GFLOP, fwd / fwd+bwd"]
    return table(head, rows, right=(1, 2, 4, 5, 6, 7) if _is_v2(run) else (1, 2, 4))


def settings_table(run: Run) -> str:
    """A run of format 2: each thread setting's OpenMP environment and measured rates."""
    rows = []
    for s in run.config.get("settings", []):
        env = s.get("env", {})
        rows.append(
            [
                s.get("label", "?"),
                " ".join(f"`{k}={v}`" for k, v in env.items()) or DASH,
                str(s.get("torch_threads", DASH)),
                DASH if s.get("copy_gb_per_s") is None else f"{s['copy_gb_per_s']:.1f}",
                DASH if s.get("gemm_gflop_per_s") is None else f"{s['gemm_gflop_per_s']:.0f}",
                "-".join(dict.fromkeys(f"{s[k]:.1f}" for k in ("load_average_start", "load_average_end") if k in s))
                or DASH,
                s.get("error", ""),
            ]
        )
    head = ["threads", "environment", "torch threads", "copy GB/s", "GEMM GFLOP/s", "load", "note"]
    return (
        "Thread settings, each run in a process of its own started with this environment; the rates, measured"
        " in that process at its start and end (the higher is used), set each row's physical limit:\n\n"
        + table(head, rows, right=(2, 3, 4, 5))
    )


def _cells(run: Run) -> Dict[Tuple[str, ...], Dict[str, Any]]:
    """Rows by (family, mode, contender, *group)."""
    return {(r["family"], r["mode"], r["contender"], *_group(run, r)): r for r in run.results}


def limit_table(run: Run, contenders: List[str]) -> str:
    """A run of format 2: the physical limit per family and setting, and the share of it each
    contender reached (limit ms / its ms)."""
    cells, modes = _cells(run), ordered(r["mode"] for r in run.results)
    limits = {(r["family"], r["mode"], *_group(run, r)): r.get("limit_ms") for r in run.results}
    cons = [c for c in contenders if any(k[2] == c and v.get("limit_fraction") for k, v in cells.items())]
    rows = []
    for fam, gr in _lines(run):
        row = [f"`{fam}`", *gr, " / ".join(f_ms(limits.get((fam, m, *gr))) for m in modes)]
        for c in cons:
            vals = [cells.get((fam, m, c, *gr), {}).get("limit_fraction") for m in modes]
            row.append(DASH if all(v is None for v in vals) else " / ".join(f_pct(v) for v in vals))
        rows.append(row)
    head = ["family", *GROUP_HEAD, "limit ms"] + cons
    return (
        f"Physical limit, ms ({' / '.join(modes)}): the larger of the bytes that must move at the copy bandwidth"
        " and the flops that must run at the GEMM rate (`benchmarks/limits.py`), and the share of it each"
        " contender reached (limit / its time):\n\n" + table(head, rows, right=range(3, len(head)))
    )


def kernel_sections(run: Run) -> List[str]:
    contenders = ordered((r["contender"] for r in run.results), KERNEL_ORDER)
    cells, lines = _cells(run), _lines(run)
    gh = GROUP_HEAD if _is_v2(run) else []
    out = []
    if run.config.get("family_info"):
        out.append(family_table(run))
    if _is_v2(run):
        out.append(settings_table(run))
    modes = ordered(r["mode"] for r in run.results)
    for mode in modes:
        cons = [c for c in contenders if any(k[1] == mode and k[2] == c for k in cells)]
        rows = []
        for fam, gr in lines:
            row = [f"`{fam}`", *gr]
            for c in cons:
                r = cells.get((fam, mode, c, *gr))
                row.append(DASH if r is None else f_ms(r["ms"]) if r["ms"] is not None else skipped(r["note"]))
            rows.append(row)
        right = range(1 + len(gh), 1 + len(gh) + len(cons))
        out.append(f"**{mode}**, ms (median):\n\n" + table(["family"] + gh + cons, rows, right=right))
    if _is_v2(run):
        out.append(limit_table(run, contenders))
    if all(r.get("peak_extra_mib") is None for r in run.results):
        return out
    rows = []
    mem_cons = [c for c in contenders if any(k[2] == c and cells[k]["peak_extra_mib"] is not None for k in cells)]
    for fam, gr in lines:
        row = [f"`{fam}`", *gr]
        for c in mem_cons:
            vals = [cells.get((fam, m, c, *gr), {}).get("peak_extra_mib") for m in modes]
            row.append(DASH if all(v is None for v in vals) else " / ".join(f_int(v) for v in vals))
        rows.append(row)
    right = range(1 + len(gh), 1 + len(gh) + len(mem_cons))
    out.append(
        f"Peak extra memory, MiB ({' / '.join(modes)}):\n\n" + table(["family"] + gh + mem_cons, rows, right=right)
    )
    return out


def kernels_main(run: Run) -> str:
    parts = [header(run)]
    parts += kernel_sections(run)
    if run.config.get("ratios"):
        ratios, met, total = kernel_ratios(run)
        parts.append(
            "The ratios the CPU targets are about, fwd / fwd+bwd (`csr` fwd+bwd / fwd: its forward+backward time"
            " over its forward time; `auto`'s share of the limit: the family's physical limit over its forward"
            f" time); bold: outside the target. {met} of {total} meet their target.\n\n" + ratios
        )
    parts.append(LEGEND)
    parts.append(plot(run))
    return "\n\n".join(p for p in parts if p)


def thp_table(off: Run, on: Run) -> str:
    a, b = by_key(off.results, "family", "mode", "contender"), by_key(on.results, "family", "mode", "contender")
    families = ordered(r["family"] for r in off.results)
    contenders = ordered(r["contender"] for r in off.results)
    rows = []
    for fam in families:
        for c in contenders:
            row = [f"`{fam}`", f"`{c}`"]
            for mode in ("fwd", "fwd+bwd"):
                x, y = a.get((fam, mode, c), {}).get("ms"), b.get((fam, mode, c), {}).get("ms")
                row += [f_ms(x), f_ms(y), f_x(x / y) if x and y else DASH]
            rows.append(row)
    head = ["family", "contender", "fwd without", "fwd with", "gain", "fwd+bwd without", "fwd+bwd with", "gain"]
    return "ms (median); gain = without / with:\n\n" + table(head, rows, right=range(2, 8))


def thp_headline(off: Run, on: Run) -> str:
    a, b = by_key(off.results, "family", "mode", "contender"), by_key(on.results, "family", "mode", "contender")
    best = max(
        ((a[k]["ms"] / b[k]["ms"], k) for k in a if k in b and a[k]["ms"] and b[k]["ms"] and k[2] == "auto"),
        default=None,
    )
    if best is None:
        return ""
    _, (fam, mode, _) = best
    return f"`THP_MEM_ALLOC_ENABLE=1`: `auto` {mode} on `{fam}` {f_ms(a[best[1]]['ms'])} -> {f_ms(b[best[1]]['ms'])} ms"


KERNELS_INTRO = """\
`python -m benchmarks.bench_kernels` times every backend, `auto` and the peers on its graph
families (windows, uniform random, power-law, batches of dense blocks:
`benchmarks/families.py`), forward (under `no_grad`) and forward+backward, H=8 heads of D=64,
float32, at each thread setting and input scale. Each contender's output is first checked against
the reference (against `csr` where the reference would not fit the memory budget). A time is the
median of up to `--reps` calls after warm-up calls; the contenders run in interleaved rounds, every
other round in reverse order, so that load changes hit them alike. Peak extra memory is the peak
resident set during one call minus the resident set before it (a `Graph`'s cached index, built
before, is not in it). Timing runs at glibc's steady-state 32 MiB mmap threshold, what a
long-running process settles to; the harness switches to a 64 KiB threshold only while it measures
memory, so that every block shows up in the resident set.

Contenders: the backends `csr` and `dense`; `auto` (its pick per family is in the first table);
`auto (raw)`, the same call on the raw `(2, E)` edge_index, which validates and builds the index
inside every call; `auto (compiled)`, `torch.compile(fullgraph=True)` of the call (inductor);
`sdpa`, `F.scaled_dot_product_attention` on uniform batches of blocks (exact softmax);
`sdpa-masked`, a padded batch with a boolean mask, as a user would write it; `pyg`,
torch_geometric's TransformerConv path (`utils.softmax` and `utils.scatter`, tested equal to the
exact reference in `tests/test_benchmark_peers.py`). DGL runs in its own environment: see
[Against DGL](dgl.md).

Inputs: q, k, v ~ N(0, σ²) for each `--input-scale` σ (default 0.5). At N(0, 0.25) no score reaches
the clamp, and clamp-mode and exact-softmax contenders compute the same numbers; clamp-mode `auto`
runs at SDPA's speed on equal-length blocks there, because a per-row Cauchy-Schwarz bound proves
the clamp cannot bind. At σ = 1 (scores of standard deviation 1, a trained model's range) the clamp
binds on a few scores and the bound no longer holds; the exact-softmax peers are then checked
against the exact reference.

Threads: each `--threads` count (default 1 and 2), with each `--omp-wait-policy` (default: unset,
then `PASSIVE`) where it has more than one thread, runs in a process of its own started with
`OMP_NUM_THREADS` and `OMP_WAIT_POLICY` set, since OpenMP reads them once at start; the run's
settings table names each one's environment. Physical limit: each of those processes measures its
copy bandwidth and float32 GEMM rate; a family's limit is the larger of the bytes that must move
(q, k, v and the index read, the output written; the gradients too for forward+backward) over that
bandwidth and the flops that must run over that rate (formulas in `benchmarks/limits.py`), and a
contender's share of it is limit / its time. Runs stored before these options hold one thread
setting, σ = 0.5 and no limit.

Options: `--quick` (small graphs, a minute), `--families`, `--contenders`, `--threads`,
`--omp-wait-policy`, `--input-scale`, `--flex all` (FlexAttention, compiled; no backward on the
CPU), `--budget-gib`, and `--baseline DIR`, which times another checkout's `csr` and `auto` in the
same rounds (a `git worktree` of another commit) and adds `<name>/baseline` ratios. Absolute times
move between runs on a shared virtual machine; ratios within one run are the comparison."""

THP_INTRO = """\
**Large graphs on the CPU: set `THP_MEM_ALLOC_ENABLE=1`.** A PyTorch setting, read once at the
first allocation (set it in the environment before Python starts), that backs large CPU tensors
with 2 MiB transparent huge pages, so a fresh buffer takes 512x fewer page faults. Calls that
allocate large tensors gain most (the gain column; below 1, it did not help in this run). The other
tables on this page run without it, as a default environment does."""


def page_kernels(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['kernels']}", KERNELS_INTRO], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        main = [r for r in group if not r.variant]
        off = next((r for r in group if r.variant == "thp-off"), None)
        on = next((r for r in group if r.variant == "thp-on"), None)
        lines = []
        for run in main:
            parts.append(kernels_main(run))
            lines.append(kernels_headline(run))
        if off is not None and on is not None:
            parts += ["### `THP_MEM_ALLOC_ENABLE=1`", THP_INTRO, header(off), header(on), thp_table(off, on)]
            parts += [plot(off), plot(on)]
            lines.append(thp_headline(off, on))
        for run in group:
            if run.variant and run not in (off, on):
                parts += [f"### Variant `{run.variant}`", kernels_main(run)]
                line = kernels_headline(run)
                lines.append(f"`{run.variant}`: {line}" if line else "")
        heads[machine] = "; ".join(x for x in lines if x)
    return join(parts), heads


def kernels_headline(run: Run) -> str:
    ratios = run.config.get("ratios", {})
    pyg = [v[-1] for _, r in _ratio_lines(run) for k, v in r.items() if k == "pyg/auto" and v and v[-1] is not None]
    out = []
    if pyg:
        out.append(f"`auto` {f_x(min(pyg))[:-1]}-{f_x(max(pyg))} faster than torch_geometric forward+backward")
    if ratios:
        _, met, total = kernel_ratios(run)
        out.append(f"{met} of {total} target ratios met")
    return ", ".join(out)


# ---- DGL ----------------------------------------------------------------------------------------

DGL_INTRO = """\
`python -m benchmarks.bench_dgl --dgl-python DGL_VENV/bin/python`. DGL 2.1 needs torch <= 2.2.1, so
it runs in its own virtual environment (the install line is in the script's docstring), as a
subprocess that imports only dgl, torch and numpy; sparseattn runs on its own torch. Same graphs and
inputs on both sides; every output is checked against the reference; the two processes' timings are
interleaved over the rounds, each the median of a few calls. Pairs: `auto exact` (`clamp=None`)
against DGL fused, `dgl.ops.u_dot_v` -> `edge_softmax` -> `u_mul_e_sum` (exact softmax); `auto clamp`
against the DGL tutorial's recipe, `apply_edges(fn.u_dot_v)`, a scaled clamped exp,
`update_all(fn.u_mul_e, fn.sum)` and `update_all(fn.copy_e, fn.sum)`. The target is `auto` at least
3x faster than DGL fused on every sparse family. DGL's CPU time goes to the per-edge dot product and
the SpMM with (E, H, 1) weights broadcast over D (`edge_softmax` itself is cheap); peak extra
memory is in the log."""


def dgl_table(run: Run) -> str:
    cells = by_key(run.results, "family", "mode", "contender")
    rows = []
    for fam in ordered(r["family"] for r in run.results):
        for mode in ordered(r["mode"] for r in run.results):
            ours_e, theirs_e = cells.get((fam, mode, "auto exact")), cells.get((fam, mode, "dgl fused"))
            ours_c, theirs_c = cells.get((fam, mode, "auto clamp")), cells.get((fam, mode, "dgl builtin"))
            row = [f"`{fam}`", f_int((ours_e or ours_c or {}).get("edges")), mode]
            for ours, theirs in ((ours_e, theirs_e), (ours_c, theirs_c)):
                a = ours["ms"] if ours else None
                b = theirs["ms"] if theirs else None
                row += [f_ms(a), f_ms(b) if theirs is None or b is not None else skipped(theirs["note"])]
                row.append(f_x(b / a) if a and b else DASH)
            rows.append(row)
    head = ["family", "edges", "pass", "`auto exact`", "DGL fused", "DGL / auto", "`auto clamp`", "DGL tutorial"]
    return "ms (median of rounds):\n\n" + table(head + ["DGL / auto"], rows, right=(1, 3, 4, 5, 6, 7, 8))


def dgl_headline(run: Run) -> str:
    cells = by_key(run.results, "family", "mode", "contender")
    ratios = [
        cells[(f, m, "dgl fused")]["ms"] / r["ms"]
        for (f, m, c), r in cells.items()
        if c == "auto exact" and m == "fwd+bwd" and r["ms"] and cells.get((f, m, "dgl fused"), {}).get("ms")
    ]
    if not ratios:
        return "DGL not measured"
    span = f"{f_x(min(ratios))[:-1]}-{f_x(max(ratios))}"
    return f"`auto` {span} faster than DGL fused forward+backward ({len(ratios)} families)"


def page_dgl(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['dgl']}", DGL_INTRO], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in group:
            if run.variant:
                parts.append(f"### Variant `{run.variant}`")
            parts += [header(run), dgl_table(run), plot(run)]
        heads[machine] = dgl_headline(group[0])
    return join(parts), heads


# ---- layers -------------------------------------------------------------------------------------

LAYERS_INTRO = """\
`python -m benchmarks.bench_layers`: `sparseattn.nn.TransformerConv(512, 64, heads=8, edge_dim=16)`
against PyG's `TransformerConv` of the same shape, both from one state dict, on a random graph
(in-degree 16) and a window graph (radius 8) of 50,000 nodes, float32. Warm rows: interleaved
rounds after one warm-up call with a reused `Graph` (PyG: its edge_index). Cold rows: each
contender's first forward+backward in a fresh process with a raw edge_index (int64, or transposed
int32 for sparseattn), index building, first page faults and lazy initialisation included, imports
not; one sample each. Peak memory: peak resident set during a call minus the resident set before
it. sparseattn's layer never builds PyG's (E, H, C) edge embedding, which is where most of PyG's
memory goes. Targets: forward+backward at least 3x faster and at most 1/8 of PyG's peak memory.

Edge terms on `csr` alone (H=8, D=64, exact softmax, unit-scale inputs, forward+backward),
against the same call without them (target: at most 1.6x): per-head `edge_key` and `edge_value` of
shape (E, H, D), and one shared (E, 1, D) row used as both. Per-head terms read two (E, H, D)
inputs and write two (E, H, D) gradients. Edge terms run in csr's interleaved layout; the call
without them trains head-major on the random graph (no locality) and interleaved on the window
graph."""


def layers_tables(run: Run) -> List[str]:
    rows = run.results
    cells = by_key(rows, "family", "contender", "mode")
    ours_name, theirs_name = "sparseattn.nn.TransformerConv", "PyG TransformerConv"
    families = ordered(r["family"] for r in rows)
    warm, cold, terms = [], [], []
    for fam in families:
        for mode in ("fwd", "fwd+bwd"):
            a, b = cells.get((fam, ours_name, mode)), cells.get((fam, theirs_name, mode))
            if a is None or b is None:
                continue
            warm.append(
                [
                    f"`{fam}`",
                    f_int(a["edges"]),
                    mode,
                    f_ms(a["ms"]),
                    f_int(a["peak_extra_mib"]),
                    f_ms(b["ms"]),
                    f_int(b["peak_extra_mib"]),
                    f_x(b["ms"] / a["ms"]),
                    f"1/{b['peak_extra_mib'] / a['peak_extra_mib']:.1f}",
                ]
            )
        pyg_cold = cells.get((fam, theirs_name + ", raw int64 edge_index", "fwd+bwd cold"))
        for r in rows:
            if r["family"] == fam and r["mode"] == "fwd+bwd cold" and r["contender"].startswith(ours_name):
                how = r["contender"][len(ours_name) + 2 :].replace(" edge_index", "")
                theirs = pyg_cold["ms"] if pyg_cold else None
                cold.append([f"`{fam}`", how, f_ms(r["ms"]), f_ms(theirs), f_x(theirs / r["ms"]) if theirs else DASH])
        base = cells.get((fam, "csr, no edge term", "fwd+bwd"))
        if base is not None:
            row = [f"`{fam}`", f_ms(base["ms"]), f_int(base["peak_extra_mib"])]
            for name in ("csr, edge_key + edge_value (E,H,D)", "csr, one shared (E,1,D) row as both"):
                t = cells.get((fam, name, "fwd+bwd"))
                row += (
                    [DASH] * 3 if t is None else [f_ms(t["ms"]), f_int(t["peak_extra_mib"]), f_x(t["ms"] / base["ms"])]
                )
            terms.append(row)
    errs = [r["max_err_vs_reference"] for r in rows if r["contender"] == ours_name and r.get("max_err_vs_reference")]
    out = []
    if warm:
        head = ["graph", "edges", "pass", "sparseattn ms", "MiB", "PyG ms", "MiB", "speed", "peak memory"]
        note = f" Outputs equal PyG's within {max(errs):.1e}." if errs else ""
        out.append(
            f"Warm calls, ms (median) and peak extra MiB; speed = PyG time / sparseattn time.{note}\n\n"
            + table(head, warm, right=(1, 3, 4, 5, 6, 7, 8))
        )
    if cold:
        head = ["graph", "sparseattn edge_index", "sparseattn ms", "PyG ms (raw int64)", "speed"]
        out.append("Cold: first forward+backward in a fresh process, ms:\n\n" + table(head, cold, right=(2, 3, 4)))
    if terms:
        head = [
            "graph",
            "no edge term, ms",
            "MiB",
            "(E, H, D) terms, ms",
            "MiB",
            "x",
            "shared (E, 1, D), ms",
            "MiB",
            "x",
        ]
        out.append(
            "Edge terms on `csr`, forward+backward; x = time over the call without edge terms:\n\n"
            + table(head, terms, right=range(1, 9))
        )
    return out


def layers_headline(run: Run) -> str:
    cells = by_key(run.results, "family", "contender", "mode")
    out = []
    for fam in ordered(r["family"] for r in run.results):
        a = cells.get((fam, "sparseattn.nn.TransformerConv", "fwd+bwd"))
        b = cells.get((fam, "PyG TransformerConv", "fwd+bwd"))
        if a and b and a["ms"] and b["ms"]:
            mem = b["peak_extra_mib"] / a["peak_extra_mib"]
            out.append(f"{f_x(b['ms'] / a['ms'])} faster at 1/{mem:.1f} of the peak memory on `{fam}`")
        if len(out) == 2:
            break
    return "TransformerConv forward+backward against PyG's: " + ", ".join(out) if out else ""


def page_layers(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['layers']}", LAYERS_INTRO], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in group:
            if run.variant:
                parts.append(f"### Variant `{run.variant}`")
            parts += [header(run)] + layers_tables(run) + [plot(run)]
        heads[machine] = layers_headline(group[0])
    return join(parts), heads


# ---- training step ------------------------------------------------------------------------------

TRAIN_INTRO = """\
`python -m benchmarks.bench_train --data-dir data/multi30k` times a training step (forward,
label-smoothed cross entropy, backward, Adam) of each task's preset graph Transformer (the
`<task>-transformer` preset, backend `auto`, dropout 0) against `torch.nn.Transformer` of the same
size (`norm_first=True`, `batch_first=True`) with the same shared embeddings, sinusoidal positions
and generator. Both see the same batches: the first Multi30k training batches of 4,096 tokens and
the first 16 copy batches of 16 sequences. nn.Transformer gets source, target and memory
key-padding masks and a causal mask, so its attention runs in SDPA's fused kernels (column "SDPA");
its generator and loss see only real tokens. Given the graph model's weights, nn.Transformer's
log-probabilities match the graph model's, so both compute the same function. The contenders
alternate batch by batch over the rounds after a warm-up pass; the ratio is the median of the
per-round ratios, with their range. Padding is the share of nn.Transformer's token slots that are
padding, which the graph model does not compute: on a CPU a step is mostly matrix multiplies
(the profiles are in the log), so that share is the graph model's margin. On CUDA both models run
under bfloat16 autocast, each step synchronized."""


def _sdpa(row: Dict[str, Any]) -> str:
    """The fused SDPA kernel nn.Transformer's forward ran, from its profile."""
    prefix = "aten::_scaled_dot_product_"
    kernels = [k[len(prefix) :] for k in row.get("sdpa_kernels", []) if k.startswith(prefix) and "backward" not in k]
    return ", ".join(kernels) or DASH


def train_table(run: Run) -> str:
    rows = run.results
    out = []
    for task in ordered(r["task"] for r in rows):
        for threads in ordered(r["threads"] for r in rows if r["task"] == task):
            group = [r for r in rows if r["task"] == task and r["threads"] == threads]
            ref = next((r for r in group if r["contender"] == "nn.Transformer"), None)
            for r in group:
                if r is ref:
                    continue
                per_round = r.get("ratio_per_round") or []
                out.append(
                    [
                        task,
                        str(threads),
                        f_pct(ref.get("padding")) if ref else DASH,
                        f"`{r['contender'].replace('graph ', '')}`",
                        f_int(r["tokens_per_s"]),
                        f_int(ref["tokens_per_s"]) if ref else DASH,
                        median_range(per_round),
                        f"{f_int(r['peak_extra_mib'])} / {f_int(ref['peak_extra_mib']) if ref else DASH}",
                        _sdpa(ref) if ref else DASH,
                    ]
                )
    head = [
        "task",
        "threads",
        "padding",
        "graph model",
        "graph tok/s",
        "nn.Transformer tok/s",
        "graph / nn.Transformer",
        "peak extra MiB, graph / nn",
        "SDPA",
    ]
    err = max((r.get("same_function_max_err") or 0.0 for r in rows), default=0.0)
    note = f" nn.Transformer's log-probabilities matched the graph model's to {err:.1e}." if err else ""
    return f"Target tokens per second;{note}\n\n" + table(head, out, right=(1, 2, 4, 5))


def train_ratios(run: Run) -> Dict[Tuple[str, Any, str], float]:
    return {
        (r["task"], r["threads"], r["contender"]): statistics.median(r["ratio_per_round"])
        for r in run.results
        if r.get("ratio_per_round")
    }


def train_headline(group: List[Run]) -> str:
    out = []
    for run in group:
        ratios = train_ratios(run)
        if not run.variant:
            per_task: Dict[str, List[str]] = {}
            for (task, threads, _), v in ratios.items():
                per_task.setdefault(task, []).append(
                    f"{f_x(v)} at {threads} thread{'s' if str(threads) != '1' else ''}"
                )
            out.append(
                "graph model / nn.Transformer tokens/s: "
                + "; ".join(f"{t} {', '.join(v)}" for t, v in per_task.items())
            )
        else:
            out.append(
                f"`{run.variant}`: "
                + ", ".join(f"{c.replace('graph ', '')} {f_x(v)}" for (_, _, c), v in ratios.items())
            )
    return "; ".join(out)


def page_train(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['train']}", TRAIN_INTRO], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in group:
            if run.variant:
                parts.append(f"### Variant `{run.variant}`")
            parts += [header(run), train_table(run), plot(run)]
        heads[machine] = train_headline(group)
    return join(parts), heads


# ---- compile ------------------------------------------------------------------------------------

COMPILE_INTRO = """\
`python -m benchmarks.bench_compile` compiles each case with `torch.compile(fullgraph=True)`
(inductor), hands it a graph it has never seen (a fresh `Graph`, or the raw `(2, E)` edge_index for
the `-raw` case) and times compiled and eager code in the same interleaved rounds. The cases:
`edge_attention` alone (H=8, D=64), `EdgeAttention` modules, and a pre-norm layer (LayerNorm,
`EdgeAttention`, 4x feed-forward, residuals). The ratio is eager time / compiled time, so above 1
means compiled is faster; compilation time and graph breaks come with it, and the log holds each
case's profile, compiled and eager. Compiled code runs the same two custom ops as eager code
(`sparseattn::csr_attention_fwd`/`_bwd`), opaque to inductor, and a model's step is mostly matrix
multiplies, so on a CPU compiled code runs at eager speed: what inductor can fuse around the
attention (norms, residuals, activations) is a few percent of the time."""

COMPILE_TRAIN_INTRO = """\
`bench_train --compile`: the Multi30k preset (3+3 layers, d 256) with every
encoder and decoder layer compiled with `fullgraph=True, dynamic=True`, on the same batches as the
eager model, in the same rounds; see [Training step](train.md) for the setup. compiled / eager is
the median (range) of the per-round ratios. A first round far below 1 is a compilation: the
batches' graphs went through compiled code once in the warm-up pass, which cached their structure on
them, so the next call compiles once more for graphs that carry it; from then on the entry is
reused."""


def compile_table(run: Run) -> str:
    cells = by_key(run.results, "family", "mode", "contender")
    rows = []
    for name, case in run.config.get("cases", {}).items():
        row = [f"`{name}`", f"{f_int(case.get('nodes'))} / {f_int(case.get('edges'))}"]
        for mode in ("fwd", "fwd+bwd"):
            eager = cells.get((name, mode, "eager"), {}).get("ms")
            compiled = cells.get((name, mode, "compiled"), {}).get("ms")
            row.append(f"{f_x(case.get('ratio_' + mode))} ({f_ms(eager)} / {f_ms(compiled)} ms)")
        row.append(" / ".join(f"{case.get('compile_s_' + m, 0):.1f}" for m in ("fwd", "fwd+bwd")))
        row.append(str(case.get("breaks", DASH)))
        rows.append(row)
    head = [
        "case",
        "nodes / edges",
        "fwd, eager / compiled",
        "fwd+bwd, eager / compiled",
        "compilation s, fwd / fwd+bwd",
        "graph breaks",
    ]
    out = f"Median of {run.config.get('reps', '?')} interleaved rounds:\n\n" + table(head, rows, right=(4, 5))
    dyn = run.config.get("dynamic")
    if dyn:
        sizes = dyn.get("sizes", [])
        out += (
            f"\n\nUnder `dynamic=True`, {len(sizes)} window graphs of {sizes[0][0]:,}-{sizes[-1][0]:,} nodes made"
            f" {dyn['compiled_entries']} compiled entries (first pass {dyn['first_pass_s']} s, compilation"
            f" included); forward+backward of all of them: eager {f_ms(dyn['eager_ms'])} ms, compiled"
            f" {f_ms(dyn['compiled_ms'])} ms ({f_x(dyn['ratio'])}). Inductor's C++ code guards on N <= 4096 for"
            " float sums over the nodes (the bias gradients) and compiles again above it; sparseattn adds no"
            " guard of its own."
        )
    return out


def compile_train_table(runs: List[Run]) -> str:
    rows = []
    for run in runs:
        for task in ordered(r["task"] for r in run.results):
            group = {r["contender"]: r for r in run.results if r["task"] == task}
            eager, compiled = group.get("graph auto"), group.get("graph auto (compiled)")
            if eager is None or compiled is None:
                continue
            rows.append(
                [
                    f"`{run.variant}`",
                    task,
                    str(len(compiled.get("compiled_speedup_per_round", []))),
                    f_int(eager["tokens_per_s"]),
                    f_int(compiled["tokens_per_s"]),
                    median_range(compiled.get("compiled_speedup_per_round", [])),
                    f"{f_int(compiled['peak_extra_mib'])} / {f_int(eager['peak_extra_mib'])}",
                ]
            )
    head = [
        "run",
        "task",
        "rounds",
        "eager tok/s",
        "compiled tok/s",
        "compiled / eager",
        "peak extra MiB, compiled / eager",
    ]
    return table(head, rows, right=(2, 3, 4))


def compile_headline(group: List[Run]) -> str:
    out = []
    for run in group:
        if run.bench == "compile":
            ratios = [c[f"ratio_{m}"] for c in run.config.get("cases", {}).values() for m in ("fwd", "fwd+bwd")]
            if ratios:
                cases = len(run.config["cases"])
                out.append(
                    f"eager / compiled {f_x(min(ratios))[:-1]}-{f_x(max(ratios))} ({cases} cases, fwd and fwd+bwd)"
                )
    steps = [
        f"{r['task']} {f_x(statistics.median(r['compiled_speedup_per_round']))}"
        f" ({len(r['compiled_speedup_per_round'])} rounds)"
        for run in group
        if run.bench == "train"
        for r in run.results
        if r.get("compiled_speedup_per_round")
    ]
    if steps:
        out.append("training step compiled / eager: " + ", ".join(steps))
    return "; ".join(out)


def page_compile(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['compile']}", COMPILE_INTRO], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in [r for r in group if r.bench == "compile"]:
            if run.variant:
                parts.append(f"### Variant `{run.variant}`")
            parts += [header(run), compile_table(run), plot(run)]
        trains = [r for r in group if r.bench == "train"]
        if trains:
            parts += ["### Training step", COMPILE_TRAIN_INTRO, compile_train_table(trains)]
            for run in trains:
                parts += [f"#### Run `{run.variant}`", header(run), plot(run)]
        heads[machine] = compile_headline(group)
    return join(parts), heads


# ---- triton on a GPU ----------------------------------------------------------------------------

TRITON_INTRO = """\
`benchmarks/bench_triton_gpu.py` times `backend="triton"` (bfloat16, H=8, D=64, clamp (-5, 5) and
exact softmax, forward and forward+backward) against `csr`, `auto`, PyG (`pyg`:
`torch_geometric.utils.softmax` and scatter, as in TransformerConv), FlexAttention (`flex`,
compiled, with a block mask built from the graph) and SDPA (`sdpa`, on complete blocks) on random,
power-law, window (radius 8 and 64) and complete-block (512 and 2048 tokens) graphs. It first
checks every contender's output on all destinations against the float32 reference, and reports
GB/s against the GPU's peak memory bandwidth: the bytes a forward must move at least, over its
time. That is a bandwidth only where each source row is read from memory once per edge (the random
graphs); on windows and blocks neighbouring destinations share sources, which the cache serves, so
the figure passes the peak.

    python benchmarks/bench_triton_gpu.py --out $OUT --budget 400      # the tables, both clamp modes
    python benchmarks/bench_triton_gpu.py --sweep --out $OUT           # forward layouts x tile sizes
    python benchmarks/bench_triton_gpu.py --sweep-backward --out $OUT  # backward edge tiles x warps
    python benchmarks/bench_triton_gpu.py --smoke --out /tmp/bench     # tiny sizes on the CPU: checks the script

Where `auto` takes another backend than `triton` (complete blocks: `dense`, whose clamp mode runs
the fused `triton_blocks` kernel for half types and whose exact mode calls SDPA), its column shows
that backend's time. FlexAttention cannot express graphs whose destinations' sources are not one
contiguous range per block."""

TRITON_ORDER = ("triton", "auto", "csr", "pyg", "flex", "sdpa")


def triton_tables(run: Run) -> List[str]:
    cells = by_key(run.results, "family", "mode", "contender")
    families = ordered(r["family"] for r in run.results)
    contenders = ordered((r["contender"] for r in run.results), TRITON_ORDER)
    kinds = ordered(r["mode"].split(" ", 1)[1] for r in run.results if " " in r["mode"])
    peak = run.info.get("peak_gb_s")
    out = []
    for kind in kinds:
        rows = []
        for fam in families:
            edges = next(r["edges"] for r in run.results if r["family"] == fam)
            row = [f"`{fam}`", f_int(edges)]
            for c in contenders:
                vals = []
                for mode in ("fwd", "fwd+bwd"):
                    r = cells.get((fam, f"{mode} {kind}", c))
                    vals.append(DASH if r is None else f_ms(r["ms"]) if r["ms"] is not None else skipped(r["note"]))
                row.append(vals[0] if vals[1] in (DASH, vals[0]) else " / ".join(vals))
            t = cells.get((fam, f"fwd {kind}", "triton"))
            gbs = t.get("gb_per_s") if t else None
            row.append(f"{gbs:,.0f} ({100 * gbs / peak:.0f}%)" if gbs and peak else DASH)
            rows.append(row)
        head = ["graph", "edges"] + [f"`{c}`" for c in contenders] + ["`triton` fwd GB/s (of peak)"]
        out.append(f"**{kind}**, ms fwd / fwd+bwd (median):\n\n" + table(head, rows, right=range(1, len(head))))
    mem_rows = []
    for fam in families:
        row = [f"`{fam}`"]
        for c in contenders:
            mibs = [cells.get((fam, f"{m} {kinds[0]}", c), {}).get("peak_extra_mib") for m in ("fwd", "fwd+bwd")]
            row.append(DASH if mibs == [None, None] else " / ".join(f_int(v) for v in mibs))
        mem_rows.append(row)
    out.append(
        f"Peak extra GPU memory, MiB fwd / fwd+bwd ({kinds[0]}):\n\n"
        + table(["graph"] + [f"`{c}`" for c in contenders], mem_rows, right=range(1, len(contenders) + 1))
    )
    targets = run.data.get("targets") or {}
    if targets:
        rows = []
        for name, value in targets.items():
            what, _, bound = name.partition(" (")
            bound = bound.rstrip(")").replace(">=", "≥").replace("<=", "≤")
            if value is None:
                shown = DASH
            elif "GB/s" in what:
                shown = f"{value:.2f}"
            else:  # a time ("... ms") or a ratio of two
                shown = f"{f_ms(value)} ms" if what.endswith(" ms") else f_x(value)
            rows.append([what, bound, shown])
        out.append(
            f"Targets ({DASH}: a contender of the ratio did not run):\n\n"
            + table(["ratio", "target", "measured"], rows, right=(2,))
        )
    wrong = run.data.get("wrong") or []
    out.append(
        "Every contender's output matched the reference." if not wrong else f"Outputs off the reference: {wrong}."
    )
    return out


def sweep_table(run: Run) -> str:
    cells = by_key(run.results, "family", "mode", "contender")
    families = ordered(r["family"] for r in run.results)
    modes = ordered(r["mode"] for r in run.results)
    mode = modes[-1]  # the backward sweep times fwd+bwd
    contenders = ordered(r["contender"] for r in run.results if r["mode"] == mode)
    best = {
        f: min((cells[(f, mode, c)]["ms"] for c in contenders if cells.get((f, mode, c), {}).get("ms")), default=None)
        for f in families
    }
    rows = []
    for c in contenders:
        row = [f"`{c}`"]
        for f in families:
            ms = cells.get((f, mode, c), {}).get("ms")
            row.append(f"**{f_ms(ms)}**" if ms is not None and ms == best[f] else f_ms(ms))
        rows.append(row)
    return f"{mode}, ms (median); bold: the fastest per graph:\n\n" + table(
        ["setting"] + [f"`{f}`" for f in families], rows, right=range(1, len(families) + 1)
    )


def triton_headline(group: List[Run]) -> str:
    run = next((r for r in group if not r.variant), None)
    if run is None:
        return ""
    cells = by_key(run.results, "family", "mode", "contender")
    fam = ordered(r["family"] for r in run.results)[0]
    t, c = cells.get((fam, "fwd clamp", "triton")), cells.get((fam, "fwd+bwd clamp", "triton"))
    csr = cells.get((fam, "fwd+bwd clamp", "csr"))
    peak = run.info.get("peak_gb_s")
    if not (t and c and csr and t["ms"] and c["ms"] and csr["ms"]):
        return ""
    share = f" at {100 * t['gb_per_s'] / peak:.0f}% of peak memory bandwidth" if t.get("gb_per_s") and peak else ""
    return (
        f"`{fam}` graph, {t['edges'] / 1e6:.1f}M edges, clamp mode: `triton` forward {f_ms(t['ms'])} ms{share},"
        f" forward+backward {f_x(csr['ms'] / c['ms'])} faster than `csr`"
    )


def page_triton_gpu(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['triton_gpu']}", TRITON_INTRO], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in group:
            if run.variant:
                parts.append(
                    f"### `--{run.variant}`" if run.variant.startswith("sweep") else f"### Variant `{run.variant}`"
                )
                parts += [
                    header(run),
                    sweep_table(run) if run.variant.startswith("sweep") else "\n\n".join(triton_tables(run)),
                ]
            else:
                parts += [header(run)] + triton_tables(run)
            parts.append(plot(run))
        heads[machine] = triton_headline(group)
    return join(parts), heads


# ---- distributed --------------------------------------------------------------------------------

DISTRIBUTED_INTRO = """\
`python -m benchmarks.bench_distributed` trains the model of
`examples/distributed_node_classification.py` (Linear, two `EdgeAttention` + feed-forward layers,
a classifier; DDP, Adam) on a graph partitioned by destination across gloo processes
(`sparseattn.distributed`), and on the whole graph in one process, the reference every ratio
divides by. Families: a window graph split into contiguous id ranges, and a k-nearest-neighbour
graph of random points split two ways, by contiguous ids (neighbours are anywhere, so the halo is
most of the graph) and by METIS (spatial parts, a thin halo). Per rank: nodes and in-edges owned,
halo (remote source rows received per layer), peak resident memory during the training steps,
median step time and the share of it spent inside the halo exchange (`all_to_all_single`) and
waiting for slower ranks. The step-1 loss of every configuration is checked against the one
process's. When the processes share fewer cores than there are ranks, step times are no speed
claim; memory and traffic are the measurement."""


def distributed_tables(run: Run) -> List[str]:
    rows = run.results
    out = []
    per = []
    for name in ordered(r.get("config", "?") for r in rows):
        group = [r for r in rows if r.get("config") == name]
        failed = [r for r in group if r.get("note")]
        if failed:
            per.append([f"`{name}`", str(len(group))] + ["failed: " + failed[0]["note"]] + [""] * 7)
            continue
        per.append(
            [
                f"`{name}`",
                str(len(group)),
                f_int(max(r.get("nodes", 0) for r in group)),
                f_int(max(r.get("edges", 0) for r in group)),
                f_int(max(r.get("halo", 0) for r in group)),
                f"{max(r.get('bytes_in', 0) for r in group) / 2**20:,.1f}",
                f_int(max(r.get("train_peak_mib", 0) for r in group)),
                f"{max(r.get('step_s', 0) for r in group):.2f}",
                f_pct(max(r.get("exchange_share", 0) for r in group)),
                f_pct(max(r.get("wait_share", 0) for r in group)),
            ]
        )
    head = [
        "configuration",
        "ranks",
        "nodes",
        "in-edges",
        "halo rows",
        "MiB in",
        "train peak MiB",
        "step s",
        "exchange",
        "wait",
    ]
    out.append(
        "Per configuration, the largest value over its ranks; MiB in: halo rows received per step (forward and"
        " backward), step: median of the timed steps:\n\n" + table(head, per, right=range(1, 10))
    )
    summary = run.data.get("summary") or {}
    if summary:
        srows = [
            [
                f"`{name}`",
                f_x(s.get("peak_ratio")),
                f_x(s.get("setup_peak_ratio")),
                f_pct(s.get("exchange_share")),
                f_pct(s.get("wait_share")),
                f_x(s.get("step_ratio")),
                DASH if s.get("step1_loss_diff") is None else f"{s['step1_loss_diff']:.1e}",
            ]
            for name, s in summary.items()
        ]
        head = [
            "configuration",
            "train peak / one process",
            "setup peak / one process",
            "exchange share",
            "wait share",
            "slowest step / one process",
            "step-1 loss difference",
        ]
        out.append("Against one process on the whole graph (largest rank):\n\n" + table(head, srows, right=range(1, 7)))
    return out


def distributed_headline(run: Run) -> str:
    summary = run.data.get("summary") or {}
    parts = [f"`{name}` {f_x(s['peak_ratio'])}" for name, s in summary.items() if s.get("peak_ratio")]
    return "largest rank's peak memory against one process: " + ", ".join(parts) if parts else ""


def page_distributed(runs: List[Run]) -> Tuple[str, Dict[str, str]]:
    parts, heads = [f"# {TITLES['distributed']}", DISTRIBUTED_INTRO], {}
    if not runs:
        parts.append(
            "No stored run yet. `python -m benchmarks.bench_distributed` writes"
            f" `{RESULTS_REL}/bench_distributed_<machine>.json`; `python -m benchmarks.tables` then fills"
            " this page."
        )
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in group:
            if run.variant:
                parts.append(f"### Variant `{run.variant}`")
            parts += [header(run)] + distributed_tables(run) + [plot(run)]
        heads[machine] = distributed_headline(group[0])
    return join(parts), heads


# ---- probes -------------------------------------------------------------------------------------


def probe_sections(page: str, results: str) -> str:
    """The page's kept probe logs, as they are: one-off measurements behind a setting (no JSON)."""
    parts = []
    for stem, (where, title, about) in PROBES.items():
        path = os.path.join(results, stem + ".log")
        if where != page or not os.path.exists(path):
            continue
        with open(path) as f:
            text = f.read().rstrip("\n")
        parts += [f"### {title}", about, f"`{RESULTS_REL}/{stem}.log`:", "```text\n" + text + "\n```"]
    if not parts:
        return ""
    intro = "One-off measurements behind a setting, kept as logs; each names its command, machine and commit."
    return join(["## Probes", intro] + parts)


# ---- pages --------------------------------------------------------------------------------------


def by_machine(runs: List[Run]) -> List[Tuple[str, List[Run]]]:
    """Runs grouped by machine tag, each group's default run first, then its variants by name."""
    groups: Dict[str, List[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.machine, r.bench != r.page, r.variant != "", r.variant)):
        groups.setdefault(run.machine, []).append(run)
    return sorted(groups.items())


def join(parts: Iterable[str]) -> str:
    return "\n\n".join(p.strip("\n") for p in parts if p) + "\n"


RENDER: Dict[str, Callable[[List[Run]], Tuple[str, Dict[str, str]]]] = {
    "kernels": page_kernels,
    "layers": page_layers,
    "train": page_train,
    "compile": page_compile,
    "dgl": page_dgl,
    "triton_gpu": page_triton_gpu,
    "distributed": page_distributed,
}


def index_page(heads: Dict[str, Dict[str, str]], runs: List[Run]) -> str:
    lines = [
        "# Benchmarks",
        "Each page holds the current run of one benchmark on each machine it was measured on: what is"
        " measured, the command, the machine, versions, load, date and commit, and tables generated from the"
        f" JSON files in `{RESULTS_REL}/` by `python -m benchmarks.tables` (so a table cannot disagree with"
        " its file). Each run names the commit it was measured at; `git log <commit>..HEAD -- sparseattn/` lists"
        " what changed since. Headline figures:",
    ]
    items = []
    for page in PAGES:
        for machine, line in heads.get(page, {}).items():
            run = next(r for r in runs if r.page == page and r.machine == machine)
            date = run.info["date"].split(" ")[0]
            items.append(f"- [{TITLES[page]}]({page}.md), {machine_desc(run.info)}, {date}: {line or 'see the page'}")
        if not heads.get(page):
            items.append(f"- [{TITLES[page]}]({page}.md): no stored run yet")
    lines.append("\n".join(items))
    return join(lines)


def generate(results: str = RESULTS) -> Tuple[Dict[str, bytes], List[str]]:
    """{path relative to docs/benchmarks: content} for every page and image, and the stems of the
    JSON files the pages use."""
    runs = load_runs(results)
    out: Dict[str, bytes] = {}
    heads: Dict[str, Dict[str, str]] = {}
    for page in PAGES:
        text, heads[page] = RENDER[page]([r for r in runs if r.page == page])
        out[f"{page}.md"] = join([text, probe_sections(page, results)]).encode()
    out["index.md"] = index_page(heads, runs).encode()
    for run in runs:
        if run.png:
            with open(os.path.join(results, run.stem + ".png"), "rb") as f:
                out[f"img/{run.stem}.png"] = f.read()
    return out, [r.stem for r in runs]


def existing(docs: str = DOCS) -> Dict[str, bytes]:
    """What is in docs/benchmarks now: its pages and images."""
    found: Dict[str, bytes] = {}
    for sub in ("", "img"):
        folder = os.path.join(docs, sub)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if os.path.isfile(path) and (name.endswith(".md") or sub == "img"):
                with open(path, "rb") as f:
                    found[os.path.join(sub, name) if sub else name] = f.read()
    return found


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 if a page or image differs")
    args = ap.parse_args(argv)
    pages, _ = generate()
    have = existing()
    stale = sorted(set(have) - set(pages))
    changed = sorted(p for p in pages if have.get(p) != pages[p])
    if args.check:
        for p in changed + stale:
            print(f"docs/benchmarks/{p}: {'differs from' if p in pages else 'not made by'} the generator")
        return 1 if changed or stale else 0
    os.makedirs(os.path.join(DOCS, "img"), exist_ok=True)
    for p in changed:
        with open(os.path.join(DOCS, p), "wb") as f:
            f.write(pages[p])
    for p in stale:
        os.remove(os.path.join(DOCS, p))
    print(f"docs/benchmarks: {len(changed)} written, {len(stale)} removed, {len(pages) - len(changed)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
