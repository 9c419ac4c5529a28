"""The kernels page (bench_kernels: a section per run, with its settings, times, physical limit,
memory and target ratios; the THP pair side by side) and the DGL page (bench_dgl)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..kernels_report import TARGETS, KernelResult, ratio_table, target_of
from ..kernels_report import stream_table as stream_rows
from ..threads import setting_label
from .common import (
    DASH,
    Run,
    by_key,
    by_machine,
    cell,
    f_int,
    f_ms,
    f_pct,
    f_x,
    header,
    joined,
    machine_desc,
    ordered,
    plot,
    span,
    table,
)

KERNEL_ORDER = ("csr", "dense", "auto", "auto (raw)", "auto (compiled)", "sdpa", "sdpa-masked", "dense bmm", "pyg")
KERNEL_ORDER += ("pyg (compiled)",)
Bound = Optional[Tuple[str, float]]
GROUP_HEAD = ["family", "threads", "input σ"]  # each table line: a family at a thread setting and input scale
MOVED = (("bytes", 1e6, 0), ("flops", 1e9, 2))  # must_move's bytes in MB and flops in GFLOP, with decimals
RATES = (("copy_gb_per_s", 1), ("gemm_gflop_per_s", 0))
SETTINGS = (
    "Thread settings, each run in a process of its own started with this environment; the rates, measured"
    " in that process at its start and end (the higher is used), set each row's physical limit:\n\n"
)


def _misses(value: Optional[float], target: Bound) -> bool:
    if value is None or target is None:
        return False
    return value > target[1] if target[0] == "<=" else value < target[1]


def _group(row: Dict[str, Any]) -> Tuple[str, str]:
    """The thread setting ('2 passive') and input scale a row was measured at."""
    return setting_label(row.get("threads"), row.get("omp_wait_policy", "default")), f"{row.get('input_scale'):g}"


def _lines(run: Run) -> List[Tuple[str, Tuple[str, str]]]:
    """(family, group) per table line, families in run order, then groups in run order."""
    groups = ordered(_group(r) for r in run.results)
    have = {(r["family"], _group(r)) for r in run.results}
    return [(f, gr) for f in ordered(r["family"] for r in run.results) for gr in groups if (f, gr) in have]


def _grid(run: Run, columns: List[str], value) -> List[List[str]]:
    """A row per table line: its family, group, and value(row by (family, mode, contender, *group), mode)
    per mode of each column's contender, as `joined` cells when value gives a number per mode."""
    cells = {(r["family"], r["mode"], r["contender"], *_group(r)): r for r in run.results}
    modes = ordered(r["mode"] for r in run.results)
    return [
        [f"`{f}`", *gr, *(value(lambda m, c=c, f=f, gr=gr: cells.get((f, m, c, *gr)), modes) for c in columns)]
        for f, gr in _lines(run)
    ]


def _ratio(fraction: Optional[float]) -> Optional[float]:
    """A time over its floor from floor / time (None stays None)."""
    return 1 / fraction if fraction else None


def _per_mode(key: str, fmt):
    return lambda row, modes: joined([(row(m) or {}).get(key) for m in modes], fmt)


def _ratio_lines(run: Run) -> List[Tuple[List[str], Dict[str, List[Optional[float]]]]]:
    """Each table line's first cells and its ratios by name, by today's definitions from the rows."""
    by_line: Dict[Tuple[str, Tuple[str, str]], Dict[str, List[Optional[float]]]] = {}
    for rec in ratio_table([KernelResult(**r) for r in run.results]):
        line = (rec["family"], (rec["threads"], f"{rec['input_scale']:g}"))
        by_line.setdefault(line, {})[rec["ratio"]] = rec["values"]
    return [([f"`{f}`", *gr], by_line[f, gr]) for f, gr in _lines(run) if (f, gr) in by_line]


def kernel_ratios(run: Run) -> Tuple[str, int, int]:
    """The target-ratio table, and how many of its ratios meet their target, of how many."""
    lines = _ratio_lines(run)
    present = [(k, head, t) for k, (head, t) in TARGETS.items() if any(k in ratios for _, ratios in lines)]
    rows, met, total = [], 0, 0
    for first, ratios in lines:
        row = list(first)
        for key, _, _ in present:
            cells = []
            target = target_of(key, first[0].strip("`"))
            for v in ratios.get(key, []):
                if v is not None and target is not None:
                    total += 1
                    met += not _misses(v, target)
                text = f_pct(v) if key in ("auto limit share", "check share") else f_x(v)
                cells.append(f"**{text}**" if _misses(v, target) else text)
            row.append(" / ".join(cells) if cells else DASH)
        rows.append(row)
    bounds = [f" ({t[0].replace('<=', '≤').replace('>=', '≥')} {t[1]:g})" if t else "" for _, _, t in present]
    return table(GROUP_HEAD + [h + b for (_, h, _), b in zip(present, bounds)], rows, right=3), met, total


def family_table(run: Run) -> str:
    rows = []
    for fam in ordered(r["family"] for r in run.results):
        fi = run.config["family_info"].get(fam, {})
        waste = fi.get("dense_waste")
        row = [f"`{fam}`", f_int(fi.get("num_dst")), f_int(fi.get("edges")), f"`{fi.get('auto', '?')}`"]
        row += [DASH if waste is None else f"{100 * waste:.0f}%"]
        row += [f"{f_int(fi.get('max_in_degree'))} / {f_int(fi.get('max_out_degree'))}"]
        for k, d, p in MOVED:
            vals = [fi.get(k, {}).get(m) for m in ("fwd", "fwd+bwd")]
            row.append(" / ".join(DASH if v is None else f"{v / d:,.{p}f}" for v in vals))
        rows.append(row)
    head = ["family", "nodes", "edges", "`auto` picks", "dense padding", "max in / out degree"]
    return table(head + ["MB moved, fwd / fwd+bwd", "GFLOP, fwd / fwd+bwd"], rows, right=(1, 2, 4, 5, 6, 7))


def settings_table(run: Run) -> str:
    """Each thread setting's OpenMP environment and measured rates."""
    rows = []
    for s in run.config.get("settings", []):
        load = "-".join(dict.fromkeys(f"{s[k]:.1f}" for k in ("load_average_start", "load_average_end") if k in s))
        env = " ".join(f"`{k}={v}`" for k, v in s.get("env", {}).items()) or DASH
        rates = [DASH if s.get(k) is None else f"{s[k]:.{p}f}" for k, p in RATES]
        rows.append([s.get("label", "?"), env, str(s.get("torch_threads", DASH)), *rates, load or DASH])
        rows[-1].append(s.get("error", ""))
    head = ["threads", "environment", "torch threads", "copy GB/s", "GEMM GFLOP/s", "load", "note"]
    return SETTINGS + table(head, rows, right=(2, 3, 4, 5))


def kernel_sections(run: Run) -> List[str]:
    contenders = ordered((r["contender"] for r in run.results), KERNEL_ORDER)
    modes = ordered(r["mode"] for r in run.results)

    def having(test) -> List[str]:
        return [c for c in contenders if any(r["contender"] == c and test(r) for r in run.results)]

    out = [family_table(run)] if run.config.get("family_info") else []
    out.append(settings_table(run))
    for mode in modes:
        cons = having(lambda r, mode=mode: r["mode"] == mode)
        rows = _grid(run, cons, lambda row, _, mode=mode: cell(row(mode)))
        out.append(f"**{mode}**, ms (median):\n\n" + table(GROUP_HEAD + cons, rows, right=3))
    limits = {(r["family"], r["mode"], *_group(r)): r.get("limit_ms") for r in run.results}
    cons = having(lambda r: r.get("limit_fraction"))
    rows = _grid(run, cons, _per_mode("limit_fraction", f_pct))
    for row, (fam, gr) in zip(rows, _lines(run)):
        row.insert(3, " / ".join(f_ms(limits.get((fam, m, *gr))) for m in modes))
    out.append(
        f"Physical limit, ms ({' / '.join(modes)}): the larger of the bytes that must move at the copy bandwidth"
        " and the flops that must run at the GEMM rate (`benchmarks/limits.py`), and the share of it each"
        " contender reached (limit / its time):\n\n" + table(GROUP_HEAD + ["limit ms"] + cons, rows, right=3)
    )
    if any(r.get("floor_ms") for r in run.results):
        floors = {(r["family"], *_group(r)): r["floor_ms"] for r in run.results if r.get("floor_ms")}
        cons = having(lambda r: r.get("floor_fraction"))
        rows = _grid(run, cons, lambda row, _: f_x(_ratio((row("fwd") or {}).get("floor_fraction"))))
        for row, (fam, gr) in zip(rows, _lines(run)):
            row.insert(3, f_ms(floors.get((fam, *gr))))
        out.append(
            "Gather floor, ms: the time to read every k and v row once in the graph's edge order (CSR,"
            " destination-major), summed per destination by `embedding_bag`, the faster of interleaved (N, H·D)"
            " rows and H head-major (N, D) tables, measured in the same process; and each contender's forward"
            " time over it (x floor):\n\n" + table(GROUP_HEAD + ["floor ms"] + cons, rows, right=3)
        )
    compiled = [r for r in run.results if r.get("compile_s") is not None]
    if compiled:
        rows = [[f"`{r['family']}`", *_group(r), r["mode"], f"{r['compile_s']:.1f}"] for r in compiled]
        out.append(
            "Compile time of `pyg (compiled)`, s: its first call (and backward for fwd+bwd), not in its timed"
            " runs:\n\n" + table(GROUP_HEAD + ["pass", "compile s"], rows, right=4)
        )
    if any(r.get("peak_extra_mib") is not None for r in run.results):
        cons = having(lambda r: r.get("peak_extra_mib") is not None)
        rows = _grid(run, cons, _per_mode("peak_extra_mib", f_int))
        out.append(f"Peak extra memory, MiB ({' / '.join(modes)}):\n\n" + table(GROUP_HEAD + cons, rows, right=3))
    return out


def kernels_main(run: Run, legend: str) -> List[str]:
    parts = [header(run)] + kernel_sections(run)
    if run.config.get("ratios"):
        ratios, met, total = kernel_ratios(run)
        parts.append(
            "The ratios the CPU targets are about, fwd / fwd+bwd: times of the peer over `auto`'s"
            " (compiled PyG at least 3x on windows, 1.5x on random and power-law graphs, 2x on structured graphs"
            " with shuffled ids; its fwd+bwd peak memory at least 2x `auto`'s); `csr` fwd+bwd / fwd: its"
            " forward+backward time over its forward time; `auto` fwd over the family's gather floor; `auto` on"
            " shuffled ids over the same graph in a local order; `auto`'s share of the limit: the family's"
            f" physical limit over its forward time. Bold: outside the target. {met} of {total} meet their"
            " target.\n\n" + ratios
        )
    return parts + [legend, plot(run)]


def kernels_headline(run: Run) -> str:
    """Forward+backward of `auto` against compiled PyG's recipe where the run has it, eager PyG beside."""

    def span_of(key: str) -> List[float]:
        return [v[-1] for _, r in _ratio_lines(run) for k, v in r.items() if k == key and v and v[-1] is not None]

    compiled, eager = span_of("compiled pyg/auto"), span_of("pyg/auto")
    out = []
    if compiled:
        out.append(f"`auto` fwd+bwd {span(compiled)} against compiled torch_geometric")
    if eager and compiled:
        out.append(f"{span(eager)} against eager")
    elif eager:  # eager figures never stand alone in a headline
        out.append("no compiled torch_geometric in this run")
    if run.config.get("ratios"):
        _, met, total = kernel_ratios(run)
        out.append(f"{met} of {total} target ratios met")
    return ", ".join(out)


def thp_table(off: Run, on: Run) -> str:
    a, b = (by_key(run.results, "family", "mode", "contender") for run in (off, on))
    rows = []
    for fam in ordered(r["family"] for r in off.results):
        for c in ordered(r["contender"] for r in off.results):
            row = [f"`{fam}`", f"`{c}`"]
            for mode in ("fwd", "fwd+bwd"):
                x, y = a.get((fam, mode, c), {}).get("ms"), b.get((fam, mode, c), {}).get("ms")
                row += [f_ms(x), f_ms(y), f_x(x / y) if x and y else DASH]
            rows.append(row)
    head = ["family", "contender", "fwd without", "fwd with", "gain", "fwd+bwd without", "fwd+bwd with", "gain"]
    return "ms (median); gain = without / with:\n\n" + table(head, rows, right=2)


def thp_headline(off: Run, on: Run) -> str:
    a, b = (by_key(run.results, "family", "mode", "contender") for run in (off, on))
    gains = [(a[k]["ms"] / b[k]["ms"], k) for k in a if k in b and a[k]["ms"] and b[k]["ms"] and k[2] == "auto"]
    if not gains:
        return ""
    _, key = max(gains)
    return f"`THP_MEM_ALLOC_ENABLE=1`: `auto` {key[1]} on `{key[0]}` {f_ms(a[key]['ms'])} -> {f_ms(b[key]['ms'])} ms"


def page_kernels(runs: List[Run], snippet) -> Tuple[List[str], Dict[str, str]]:
    parts, heads = [], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        off = next((r for r in group if r.variant == "thp-off"), None)
        on = next((r for r in group if r.variant == "thp-on"), None)
        lines = []
        for run in [r for r in group if not r.variant]:
            parts += kernels_main(run, snippet("kernels_legend"))
            lines.append(kernels_headline(run))
        if off is not None and on is not None:
            parts += ["### `THP_MEM_ALLOC_ENABLE=1`", snippet("kernels_thp"), header(off), header(on)]
            parts += [thp_table(off, on), plot(off), plot(on)]
            lines.append(thp_headline(off, on))
        for run in [r for r in group if r.variant == "gqa"]:
            parts += ["### Variant `gqa`", header(run), gqa_table(run), plot(run)]
        for run in [r for r in group if "stream" in r.data]:
            parts += ["### Variant `stream`", snippet("kernels_stream"), header(run), stream_table(run)]
        for run in group:
            if run.variant and run not in (off, on) and run.variant != "gqa" and "stream" not in run.data:
                parts += [f"### Variant `{run.variant}`"] + kernels_main(run, snippet("kernels_legend"))
                line = kernels_headline(run)
                lines.append(f"`{run.variant}`{_measured_apart(run, group[0])}: {line}" if line else "")
        heads[machine] = "; ".join(x for x in lines if x)
    return parts, heads


def _measured_apart(run: Run, first: Run) -> str:
    """A suffix such as " (AVX2, 2026-11-27)" where a variant ran on another CPU kind or day than the machine's
    first run, whose description and date the index line shows; else ""."""
    bits = []
    if run.info.get("cpu_capability") != first.info.get("cpu_capability"):
        bits.append(str(run.info.get("cpu_capability")))
    if run.info["date"].split(" ")[0] != first.info["date"].split(" ")[0]:
        bits.append(run.info["date"].split(" ")[0])
    return f" ({', '.join(bits)})" if bits else ""


def stream_table(run: Run) -> str:
    """bench_kernels --stream: per contender, seconds of the first and second pass and each over `auto`'s."""
    return "\n".join(stream_rows(run.data.get("stream", [])))


def gqa_table(run: Run) -> str:
    """bench_kernels --gqa: per H_kv and contender, fwd / fwd+bwd ms and the fwd+bwd peak."""
    cells = by_key(run.results, "family", "contender", "mode")
    rows = []
    for f in ordered(r["family"] for r in run.results):
        for c in ordered(r["contender"] for r in run.results):
            fwd, both = cells.get((f, c, "fwd")), cells.get((f, c, "fwd+bwd")) or {}
            if fwd is not None:
                peak = f_int(both.get("peak_extra_mib"))
                rows.append([f"`{f}`", c, cell(fwd), cell(both or None), peak, fwd["note"]])
    return table(["kv heads", "contender", "fwd ms", "fwd+bwd ms", "peak MiB", "note"], rows, right=(2, 3, 4))


def dgl_table(run: Run) -> List[str]:
    cells = by_key(run.results, "family", "mode", "contender")
    rows = []
    for fam in ordered(r["family"] for r in run.results):
        for mode in ordered(r["mode"] for r in run.results):
            ours_e, theirs_e = cells.get((fam, mode, "auto exact")), cells.get((fam, mode, "dgl fused"))
            ours_c, theirs_c = cells.get((fam, mode, "auto clamp")), cells.get((fam, mode, "dgl builtin"))
            row = [f"`{fam}`", f_int((ours_e or ours_c or {}).get("edges")), mode]
            for ours, theirs in ((ours_e, theirs_e), (ours_c, theirs_c)):
                a, b = (ours or {}).get("ms"), (theirs or {}).get("ms")
                row += [f_ms(a), cell(theirs), f_x(b / a) if a and b else DASH]
            rows.append(row)
    head = ["family", "edges", "pass", "`auto exact`", "DGL fused", "DGL / auto", "`auto clamp`", "DGL tutorial"]
    return ["ms (median of rounds):\n\n" + table(head + ["DGL / auto"], rows, right=(1, 3, 4, 5, 6, 7, 8))]


def dgl_headline(group: List[Run]) -> str:
    cells = by_key(group[0].results, "family", "mode", "contender")
    ratios = [
        cells[(f, m, "dgl fused")]["ms"] / r["ms"]
        for (f, m, c), r in cells.items()
        if c == "auto exact" and m == "fwd+bwd" and r["ms"] and cells.get((f, m, "dgl fused"), {}).get("ms")
    ]
    if not ratios:
        return "DGL not measured"
    return f"`auto` {span(ratios)} faster than DGL fused forward+backward ({len(ratios)} families)"
