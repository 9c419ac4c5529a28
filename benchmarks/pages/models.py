"""The pages of the benchmarks above the kernels: layers (bench_layers), the training step
(bench_train) and compiled against eager (bench_compile, and bench_train --compile)."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Tuple

from .common import (
    DASH,
    Run,
    by_key,
    by_machine,
    f_int,
    f_ms,
    f_pct,
    f_x,
    header,
    machine_desc,
    median_range,
    ordered,
    plot,
    span,
    table,
)

OURS, THEIRS = "sparseattn.nn.TransformerConv", "PyG TransformerConv"
TERMS = ("csr, edge_key + edge_value (E,H,D)", "csr, one shared (E,1,D) row as both")


PEERS = {"GlobalAttention": "GraphGPS to_dense_batch + nn.MultiheadAttention"}  # layer -> its "PyG" contender


def _layer_rows(rows: List[Dict[str, Any]]) -> List[List[str]]:
    """bench_layers --big-layers: per graph and layer, sparseattn against PyG eager and compiled (each
    pass; a forward-only row names its pass)."""
    cells = by_key(rows, "family", "contender", "mode")
    out = []
    for r in rows:
        if not r["contender"].startswith("sparseattn.nn."):
            continue
        name = r["contender"][len("sparseattn.nn.") :]
        # sparseattn's layer compiled too, or given another input (" (edge_index)"): against the same PyG forms
        base = name.removesuffix(" compiled").split(" (")[0]
        peer = PEERS.get(base, f"PyG {base}")
        eager, comp = (cells.get((r["family"], f"{peer}{s}", r["mode"])) for s in ("", " compiled"))
        name += f" ({r['mode']})" if r["mode"] != "fwd+bwd" else ""
        best = min((x for x in (eager, comp) if x and x["ms"]), key=lambda x: x["ms"], default=None)
        pyg = [v for x in (eager, comp) for v in ((f_ms(x["ms"]), f_int(x["peak_extra_mib"])) if x else (DASH,) * 2)]
        mem = best and best["peak_extra_mib"] and r["peak_extra_mib"] and best["peak_extra_mib"] / r["peak_extra_mib"]
        ratio = [f_x(best["ms"] / r["ms"]), f"1/{mem:.1f}" if mem else DASH] if best else []
        out.append([f"`{r['family']}`", name, f_ms(r["ms"]), f_int(r["peak_extra_mib"]), *pyg, *(ratio or [DASH] * 2)])
    return out


def _train_step_table(rows: List[dict]) -> str:
    """bench_layers --gps: a model's training step per contender, against PyG's eager and compiled model."""
    cells = {r["contender"]: r for r in rows}
    body = []
    for r in rows:
        ms, alone = r["ms"], " (standalone)" if r["contender"].endswith(" (standalone)") else ""
        # standalone rows against PyG's standalone rows: each ratio from one kind of measurement
        peers = (cells.get(f"PyG GPS model{s}{alone}", {}).get("ms") for s in ("", " compiled"))
        vs = [f_x(x / ms) if x and ms else DASH for x in peers]
        row = [f"`{r['family']}`", r["contender"], f_ms(ms), f_int(r["peak_extra_mib"]), *vs]
        body.append(row + [r.get("note") or ""])
    errs = [r["max_err_vs_reference"] for r in rows if r.get("max_err_vs_reference") is not None]
    check = f" The two models' predictions on the first batch agree within {max(errs):.1e} (float32)." if errs else ""
    head = ["batches", "model", "ms per step", "peak MiB", "PyG eager / this", "PyG compiled / this", "compile"]
    return (
        "A training step (forward, backward, Adam), ms per batch (median of interleaved epochs), peak extra MiB of "
        f'an epoch; compile time apart. Rows "(standalone)" ran one after another, each in a fresh process '
        f"(median of 5 epochs): their ratios are against PyG's standalone rows, and this shared machine's "
        f"speed drifts between them.{check}\n\n" + table(head, body, right=(2, 3, 4, 5))
    )


def layers_tables(run: Run) -> List[str]:
    rows = run.results
    if any(r["mode"] == "train step" for r in rows):
        return [_train_step_table([r for r in rows if r["mode"] == "train step"])]
    cells = by_key(rows, "family", "contender", "mode")
    warm, cold, terms = [], [], []
    big = _layer_rows(rows) if any(r["contender"].endswith(" compiled") for r in rows) else []
    for fam in ordered(r["family"] for r in rows) if not big else ():
        for mode in ("fwd", "fwd+bwd"):
            a, b = cells.get((fam, OURS, mode)), cells.get((fam, THEIRS, mode))
            if a is not None and b is not None:
                rest = [f_int(a["peak_extra_mib"]), f_ms(b["ms"]), f_int(b["peak_extra_mib"]), f_x(b["ms"] / a["ms"])]
                warm.append([f"`{fam}`", f_int(a["edges"]), mode, f_ms(a["ms"]), *rest])
                warm[-1].append(f"1/{b['peak_extra_mib'] / a['peak_extra_mib']:.1f}")
        pyg_cold = cells.get((fam, THEIRS + ", raw int64 edge_index", "fwd+bwd cold"))
        theirs = pyg_cold["ms"] if pyg_cold else None
        for r in rows:
            if r["family"] == fam and r["mode"] == "fwd+bwd cold" and r["contender"].startswith(OURS):
                how = r["contender"][len(OURS) + 2 :].replace(" edge_index", "")
                cold.append([f"`{fam}`", how, f_ms(r["ms"]), f_ms(theirs), f_x(theirs / r["ms"]) if theirs else DASH])
        base = cells.get((fam, "csr, no edge term", "fwd+bwd"))
        if base is not None:
            row = [f"`{fam}`", f_ms(base["ms"]), f_int(base["peak_extra_mib"])]
            for t in (cells.get((fam, name, "fwd+bwd")) for name in TERMS):
                row += [f_ms(t["ms"]), f_int(t["peak_extra_mib"]), f_x(t["ms"] / base["ms"])] if t else [DASH] * 3
            terms.append(row)
    errs = [r["max_err_vs_reference"] for r in rows if r["contender"] == OURS and r.get("max_err_vs_reference")]
    out = []
    if big:
        head = ["graph", "layer", "sparseattn ms", "MiB", "PyG ms", "MiB", "PyG compiled ms", "MiB", "speed", "memory"]
        out.append(
            "Forward+backward, ms (median) and peak extra MiB; speed and memory against PyG's faster form here:\n\n"
            + table(head, big, right=(2, 3, 4, 5, 6, 7, 8, 9))
        )
    if warm:
        head = ["graph", "edges", "pass", "sparseattn ms", "MiB", "PyG ms", "MiB", "speed", "peak memory"]
        note = f" Outputs equal PyG's within {max(errs):.1e}." if errs else ""
        out.append(
            f"Warm calls, ms (median) and peak extra MiB; speed = PyG time / sparseattn time.{note}\n\n"
            + table(head, warm, right=(1, 3, 4, 5, 6, 7, 8))
        )
    if cold:
        head = ["graph", "sparseattn edge_index", "sparseattn ms", "PyG ms (raw int64)", "speed"]
        out.append("Cold: first forward+backward in a fresh process, ms:\n\n" + table(head, cold, right=2))
    if terms:
        head = ["graph", "no edge term, ms", "MiB", "(E, H, D) terms, ms", "MiB", "x", "shared (E, 1, D), ms"]
        out.append(
            "Edge terms on `csr`, forward+backward; x = time over the call without edge terms:\n\n"
            + table(head + ["MiB", "x"], terms, right=1)
        )
    return out


def layers_headline(group: List[Run]) -> str:
    cells = by_key(group[0].results, "family", "contender", "mode")
    out = []
    for fam in ordered(r["family"] for r in group[0].results):
        a = cells.get((fam, OURS, "fwd+bwd"))
        theirs = [cells.get((fam, THEIRS + s, "fwd+bwd")) for s in ("", " compiled")]
        b = min((x for x in theirs if x and x["ms"]), key=lambda x: x["ms"], default=None)  # PyG's faster form
        if a and b and a["ms"]:
            mem = b["peak_extra_mib"] / a["peak_extra_mib"]
            out.append(f"{f_x(b['ms'] / a['ms'])} faster at 1/{mem:.1f} of the peak memory on `{fam}`")
    compiled = any(r["contender"] == THEIRS + " compiled" for r in group[0].results)
    if not compiled:  # eager figures never stand alone in a headline
        return "TransformerConv against eager PyG only (no compiled PyG in this run; the `gat-cpu` run has it)"
    return "TransformerConv forward+backward against the faster of eager and compiled PyG: " + ", ".join(out[:2])


def _sdpa(row: Dict[str, Any]) -> str:
    """The fused SDPA kernel nn.Transformer's forward ran, from its profile."""
    prefix = "aten::_scaled_dot_product_"
    kernels = [k[len(prefix) :] for k in row.get("sdpa_kernels", []) if k.startswith(prefix) and "backward" not in k]
    return ", ".join(kernels) or DASH


def train_table(run: Run) -> List[str]:
    rows, out = run.results, []
    for task in ordered(r["task"] for r in rows):
        for threads in ordered(r["threads"] for r in rows if r["task"] == task):
            group = [r for r in rows if r["task"] == task and r["threads"] == threads]
            ref = next((r for r in group if r["contender"] == "nn.Transformer"), None) or {}
            for r in (r for r in group if r is not ref):
                row = [task, str(threads), f_pct(ref.get("padding")), f"`{r['contender'].replace('graph ', '')}`"]
                ratio, mib = median_range(r.get("ratio_per_round") or []), f_int(r["peak_extra_mib"])
                row += [f_int(r["tokens_per_s"]), f_int(ref.get("tokens_per_s")), ratio]
                out.append(row + [f"{mib} / {f_int(ref.get('peak_extra_mib'))}", _sdpa(ref) if ref else DASH])
    head = ["task", "threads", "padding", "graph model", "graph tok/s", "nn.Transformer tok/s"]
    head += ["graph / nn.Transformer", "peak extra MiB, graph / nn", "SDPA"]
    err = max((r.get("same_function_max_err") or 0.0 for r in rows), default=0.0)
    note = f" nn.Transformer's log-probabilities matched the graph model's to {err:.1e}." if err else ""
    return [f"Target tokens per second;{note}\n\n" + table(head, out, right=(1, 2, 4, 5))]


def train_headline(group: List[Run]) -> str:
    out = []
    for run in group:
        ratios = {
            (r["task"], r["threads"], r["contender"]): statistics.median(r["ratio_per_round"])
            for r in run.results
            if r.get("ratio_per_round")
        }
        if not run.variant:
            per_task: Dict[str, List[str]] = {}
            for (task, threads, _), v in ratios.items():
                per_task.setdefault(task, []).append(f"{f_x(v)} at {threads} thread{'s' * (str(threads) != '1')}")
            listed = "; ".join(f"{t} {', '.join(v)}" for t, v in per_task.items())
            out.append("graph model / nn.Transformer tokens/s: " + listed)
        else:
            listed = ", ".join(f"{c.replace('graph ', '')} {f_x(v)}" for (_, _, c), v in ratios.items())
            out.append(f"`{run.variant}`: " + listed)
    return "; ".join(out)


def compile_table(run: Run) -> List[str]:
    cells = by_key(run.results, "family", "mode", "contender")
    rows = []
    for name, case in run.config.get("cases", {}).items():
        row = [f"`{name}`", f"{f_int(case.get('nodes'))} / {f_int(case.get('edges'))}"]
        for mode in ("fwd", "fwd+bwd"):
            eager, compiled = (cells.get((name, mode, c), {}).get("ms") for c in ("eager", "compiled"))
            row.append(f"{f_x(case.get('ratio_' + mode))} ({f_ms(eager)} / {f_ms(compiled)} ms)")
        row.append(" / ".join(f"{case.get('compile_s_' + m, 0):.1f}" for m in ("fwd", "fwd+bwd")))
        rows.append(row + [str(case.get("breaks", DASH))])
    head = ["case", "nodes / edges", "fwd, eager / compiled", "fwd+bwd, eager / compiled"]
    head += ["compilation s, fwd / fwd+bwd", "graph breaks"]
    out = f"Median of {run.config.get('reps', '?')} interleaved rounds:\n\n" + table(head, rows, right=4)
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
    return [out]


def compile_train_table(runs: List[Run]) -> str:
    rows = []
    for run in runs:
        for task in ordered(r["task"] for r in run.results):
            group = {r["contender"]: r for r in run.results if r["task"] == task}
            eager, compiled = group.get("graph auto"), group.get("graph auto (compiled)")
            if eager is not None and compiled is not None:
                per_round = compiled.get("compiled_speedup_per_round", [])
                row = [f"`{run.variant}`", task, str(len(per_round)), f_int(eager["tokens_per_s"])]
                mib = f"{f_int(compiled['peak_extra_mib'])} / {f_int(eager['peak_extra_mib'])}"
                rows.append(row + [f_int(compiled["tokens_per_s"]), median_range(per_round), mib])
    head = ["run", "task", "rounds", "eager tok/s", "compiled tok/s", "compiled / eager"]
    return table(head + ["peak extra MiB, compiled / eager"], rows, right=(2, 3, 4))


def compile_headline(group: List[Run]) -> str:
    out = []
    for run in group:
        ratios = [c[f"ratio_{m}"] for c in run.config.get("cases", {}).values() for m in ("fwd", "fwd+bwd")]
        if run.bench == "compile" and ratios:
            out.append(f"eager / compiled {span(ratios)} ({len(run.config['cases'])} cases, fwd and fwd+bwd)")
    trains = [r for run in group if run.bench == "train" for r in run.results]
    speedups = [(r["task"], r.get("compiled_speedup_per_round")) for r in trains]
    steps = [f"{task} {f_x(statistics.median(s))} ({len(s)} rounds)" for task, s in speedups if s]
    if steps:
        out.append("training step compiled / eager: " + ", ".join(steps))
    return "; ".join(out)


def page_compile(runs: List[Run], snippet) -> Tuple[List[str], Dict[str, str]]:
    parts, heads = [], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in [r for r in group if r.bench == "compile"]:
            if run.variant:
                parts.append(f"### Variant `{run.variant}`")
            parts += [header(run)] + compile_table(run) + [plot(run)]
        trains = [r for r in group if r.bench == "train"]
        if trains:
            parts += ["### Training step", snippet("compile_train"), compile_train_table(trains)]
            for run in trains:
                parts += [f"#### Run `{run.variant}`", header(run), plot(run)]
        heads[machine] = compile_headline(group)
    return parts, heads
