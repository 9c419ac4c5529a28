"""The Triton-on-a-GPU page (bench_triton_gpu: per clamp mode a table, memory, targets; the sweeps
as one table each) and the several-processes page (bench_distributed)."""

from __future__ import annotations

from typing import Dict, List, Tuple

from .common import DASH, Run, by_key, cell, f_int, f_ms, f_pct, f_x, joined, ordered, sections, table

TRITON_ORDER = ("triton", "auto", "csr", "pyg", "flex", "sdpa")
PASSES = ("fwd", "fwd+bwd")


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
            row = [f"`{fam}`", f_int(next(r["edges"] for r in run.results if r["family"] == fam))]
            for c in contenders:
                vals = [cell(cells.get((fam, f"{mode} {kind}", c))) for mode in PASSES]
                row.append(vals[0] if vals[1] in (DASH, vals[0]) else " / ".join(vals))
            t = cells.get((fam, f"fwd {kind}", "triton"))
            gbs = t.get("gb_per_s") if t else None
            rows.append(row + [f"{gbs:,.0f} ({100 * gbs / peak:.0f}%)" if gbs and peak else DASH])
        head = ["graph", "edges"] + [f"`{c}`" for c in contenders] + ["`triton` fwd GB/s (of peak)"]
        out.append(f"**{kind}**, ms fwd / fwd+bwd (median):\n\n" + table(head, rows, right=1))

    def mib(fam: str, c: str) -> str:
        return joined([cells.get((fam, f"{m} {kinds[0]}", c), {}).get("peak_extra_mib") for m in PASSES], f_int)

    mem = [[f"`{fam}`"] + [mib(fam, c) for c in contenders] for fam in families]
    head = ["graph"] + [f"`{c}`" for c in contenders]
    out.append(f"Peak extra GPU memory, MiB fwd / fwd+bwd ({kinds[0]}):\n\n" + table(head, mem, right=1))
    rows = []
    for name, value in (run.data.get("targets") or {}).items():
        what, _, bound = name.partition(" (")
        bound = bound.rstrip(")").replace(">=", "≥").replace("<=", "≤")
        ms = f"{f_ms(value)} ms" if what.endswith(" ms") else f_x(value)  # a time or a ratio of two
        rows.append([what, bound, DASH if value is None else f"{value:.2f}" if "GB/s" in what else ms])
    if rows:
        head = ["ratio", "target", "measured"]
        out.append(f"Targets ({DASH}: a contender of the ratio did not run):\n\n" + table(head, rows, right=(2,)))
    wrong = run.data.get("wrong") or []
    out.append(f"Outputs off the reference: {wrong}." if wrong else "Every contender's output matched the reference.")
    return out


def sweep_table(run: Run) -> str:
    cells = by_key(run.results, "family", "mode", "contender")
    families = ordered(r["family"] for r in run.results)
    mode = ordered(r["mode"] for r in run.results)[-1]  # the backward sweep times fwd+bwd
    contenders = ordered(r["contender"] for r in run.results if r["mode"] == mode)
    times = {f: [cells.get((f, mode, c), {}).get("ms") for c in contenders] for f in families}
    best = {f: min((ms for ms in times[f] if ms), default=None) for f in families}
    bold = lambda t, f: f"**{f_ms(t)}**" if t is not None and t == best[f] else f_ms(t)
    rows = [[f"`{c}`"] + [bold(times[f][i], f) for f in families] for i, c in enumerate(contenders)]
    head = ["setting"] + [f"`{f}`" for f in families]
    return f"{mode}, ms (median); bold: the fastest per graph:\n\n" + table(head, rows, right=1)


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


def page_triton_gpu(runs: List[Run], snippet) -> Tuple[List[str], Dict[str, str]]:
    def body(run: Run) -> List[str]:
        return [sweep_table(run)] if run.variant.startswith("sweep") else triton_tables(run)

    def title(variant: str) -> str:
        return f"### `--{variant}`" if variant.startswith("sweep") else f"### Variant `{variant}`"

    return sections(runs, body, triton_headline, title)


PER_CONFIG = (  # head, the field (its largest value over the ranks), its format
    *(("nodes", "nodes", f_int), ("in-edges", "edges", f_int), ("halo rows", "halo", f_int)),
    ("MiB in", "bytes_in", lambda b: f"{b / 2**20:,.1f}"),
    *(("train peak MiB", "train_peak_mib", f_int), ("step s", "step_s", lambda s: f"{s:.2f}")),
    *(("exchange", "exchange_share", f_pct), ("wait", "wait_share", f_pct)),
)
AGAINST_ONE = (  # head, the summary's field, its format
    *(("train peak / one process", "peak_ratio", f_x), ("setup peak / one process", "setup_peak_ratio", f_x)),
    *(("exchange share", "exchange_share", f_pct), ("wait share", "wait_share", f_pct)),
    ("slowest step / one process", "step_ratio", f_x),
    ("step-1 loss difference", "step1_loss_diff", lambda d: DASH if d is None else f"{d:.1e}"),
)


def distributed_tables(run: Run) -> List[str]:
    per = []
    for name in ordered(r.get("config", "?") for r in run.results):
        group = [r for r in run.results if r.get("config") == name]
        failed = [r["note"] for r in group if r.get("note")]
        top = [fmt(max(r.get(k, 0) for r in group)) for _, k, fmt in PER_CONFIG]
        per.append([f"`{name}`", str(len(group)), *(["failed: " + failed[0]] + [""] * 7 if failed else top)])
    out = [
        "Per configuration, the largest value over its ranks; MiB in: halo rows received per step (forward and"
        " backward), step: median of the timed steps:\n\n"
        + table(["configuration", "ranks", *(h for h, _, _ in PER_CONFIG)], per, right=1)
    ]
    summary = run.data.get("summary") or {}
    if summary:
        rows = [[f"`{name}`", *(fmt(s.get(k)) for _, k, fmt in AGAINST_ONE)] for name, s in summary.items()]
        head = ["configuration", *(h for h, _, _ in AGAINST_ONE)]
        out.append("Against one process on the whole graph (largest rank):\n\n" + table(head, rows, right=1))
    return out


def distributed_headline(group: List[Run]) -> str:
    summary = group[0].data.get("summary") or {}
    parts = [f"`{name}` {f_x(s['peak_ratio'])}" for name, s in summary.items() if s.get("peak_ratio")]
    return "largest rank's peak memory against one process: " + ", ".join(parts) if parts else ""
