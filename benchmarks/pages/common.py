"""What every page is made of: the stored runs (`load_runs`), number formats, markdown tables and
each run's header (its about text, command, machine, versions, date, commit, load, files)."""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

RESULTS_REL = "benchmarks/results"
MACHINE_RE = r"[a-z0-9]+(?:-[a-z0-9]+)*-\d+(?:-\d+)?t-[a-z0-9]+(?:-[a-z0-9]+)*"
DASH = "–"


@functools.lru_cache(maxsize=None)
def name_re(benches: Tuple[str, ...]) -> "re.Pattern[str]":
    """`bench_<one of benches>_<machine>[_<variant>].{json,png,log}` or a probe's `probe_<name>_<machine>...`."""
    return re.compile(
        rf"^(?P<bench>bench_(?:{'|'.join(map(re.escape, benches))})|probe_[a-z0-9]+(?:_[a-z0-9]+)*?)"
        rf"_(?P<machine>{MACHINE_RE})(?:_(?P<variant>[a-z0-9]+(?:-[a-z0-9]+)*))?\.(?P<ext>json|png|log)$"
    )


def parse_name(filename: str, benches: Sequence[str]) -> Optional[Dict[str, str]]:
    """bench, machine, variant ("" for the default run) and ext of a results file of one of `benches`
    (the registry's names), or None."""
    m = name_re(tuple(benches)).match(filename)
    return None if m is None else dict(m.groupdict(), variant=m["variant"] or "")


@dataclass
class Run:
    """A stored run: `<bench>_<machine>[_<variant>].json` and whether a .png and .log lie beside it;
    its machine `info`, `config` and `results` from the JSON, and the `page` it goes on."""

    stem: str
    bench: str  # "kernels", "train", ...
    machine: str
    variant: str
    data: Dict[str, Any]
    png: bool
    log: bool

    def __post_init__(self) -> None:
        self.info: Dict[str, Any] = self.data["machine"]
        self.config: Dict[str, Any] = self.data.get("config", {})
        self.results: List[Dict[str, Any]] = self.data.get("results", [])
        self.page = "compile" if self.bench == "train" and self.config.get("compile") else self.bench


def load_runs(results: str, benches: Sequence[str]) -> List[Run]:
    """The runs of `benches` stored in `results`, by file name."""
    names = set(os.listdir(results))
    runs = []
    for name in sorted(names):
        parsed = parse_name(name, benches)
        if parsed is None or parsed["ext"] != "json" or not parsed["bench"].startswith("bench_"):
            continue
        stem = name[: -len(".json")]
        with open(os.path.join(results, name)) as f:
            data = json.load(f)
        bench, has = parsed["bench"][len("bench_") :], (stem + ".png" in names, stem + ".log" in names)
        runs.append(Run(stem, bench, parsed["machine"], parsed["variant"], data, *has))
    return runs


def f_ms(x: Optional[float]) -> str:
    """Milliseconds to about three significant digits."""
    return DASH if x is None else f"{x:,.{0 if x >= 100 else 1 if x >= 10 else 2 if x >= 1 else 3}f}"


def f_x(r: Optional[float]) -> str:
    return DASH if r is None else f"{r:.{0 if r >= 100 else 1 if r >= 10 else 2}f}x"


def f_int(x: Optional[float]) -> str:
    return DASH if x is None else f"{x:,.0f}"


def f_pct(x: Optional[float]) -> str:
    return DASH if x is None else f"{100 * x:.1f}%"


def cell(row: Optional[Dict[str, Any]]) -> str:
    """A contender's time, or why it has none (`skipped`); a dash where it has no row."""
    return DASH if row is None else f_ms(row["ms"]) if row["ms"] is not None else skipped(row["note"])


def joined(values: Sequence[Optional[float]], fmt) -> str:
    """'a / b' of the values by `fmt` (one per pass), a dash where none is there."""
    return DASH if all(v is None for v in values) else " / ".join(fmt(v) for v in values)


def table(head: Sequence[str], rows: Iterable[Sequence[str]], right: Union[int, Iterable[int]] = ()) -> str:
    """A markdown table; columns in `right`, or from index `right` on, are right-aligned (numbers)."""
    right = set(range(right, len(head)) if isinstance(right, int) else right)
    lines = ["| " + " | ".join(head) + " |"]
    lines.append("| " + " | ".join("---:" if i in right else "---" for i in range(len(head))) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def skipped(note: str) -> str:
    """A short cell for a contender that has no time, from its note."""
    n = note.lower()
    pick = n.rsplit(" ", 2)[-2] if "auto picks" in n else ""
    cells = (
        ("out of memory" in n, "out of memory"),
        (n.startswith("not applicable") or "not a batch of equal complete blocks" in n, "n/a"),
        ("needs ~" in n and "budget" in n, "over budget"),
        ("auto picks" in n, "= " + pick),
        ("not one contiguous range" in n, "cannot express"),
        ("exact softmax only" in n, "exact only"),
        ("not installed" in n or "no module" in n, "not installed"),
        (n.startswith(("failed", "error")), "failed"),
    )
    return next((cell for hit, cell in cells if hit), "skipped")


def machine_desc(info: Dict[str, Any]) -> str:
    cpu = info["cpu"] + (f" ({info['cpu_capability']})" if info.get("cpu_capability") else "")
    threads = str(info["threads"])
    threads = threads.replace("-", " and ") + (" thread" if threads == "1" else " threads")
    return f"{cpu}, {threads}, {info.get('gpu', 'no GPU')}"


def versions(info: Dict[str, Any]) -> str:
    out = [f"sparseattn {info['sparseattn']}", f"torch {info['torch']}"]
    names = (("cuda", "CUDA"), ("triton", "triton"), ("torch_geometric",) * 2)
    out += [f"{name} {info[key]}" for key, name in names if info.get(key)]
    dgl = info.get("dgl")
    if isinstance(dgl, dict):
        out.append(f"DGL {dgl['dgl']} on torch {dgl['torch']} (own process)")
    return ", ".join(out + [f"Python {info['python']}"])


def f_load(run: Run) -> str:
    """The load averages the run recorded: at start and end, per row, and in bench_dgl's notes."""
    values = [run.info.get("load_average"), run.info.get("load_average_end")]
    values += [r.get("load_average") for r in run.results if isinstance(r, dict)]
    values += [float(m.group(1)) for r in run.results if (m := re.search(r"load (\d+\.\d+)", str(r.get("note", ""))))]
    values = [float(v) for v in values if isinstance(v, (int, float))]
    if not values:
        return "load not recorded"
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return f"load average {lo}" if lo == hi else f"load average {lo}-{hi}"


def header(run: Run) -> str:
    """The run's about text (if any) and a list: command, machine, versions, measured, environment, files."""
    data, info = run.data, run.info
    if data.get("commit"):
        code = f"commit {data['commit'][:7]}" + (" with uncommitted changes" if data.get("dirty") else "")
        code += f" {data['commit_note']}" if data.get("commit_note") else ""
    else:
        code = "commit not recorded"
    files = [f"`{RESULTS_REL}/{run.stem}.json`"] + [f"`.{e}`" for e, has in (("log", run.log), ("png", run.png)) if has]
    items = [
        f"Command: `{data.get('command', 'not recorded')}`",
        f"Machine: {machine_desc(info)}",
        f"Versions: {versions(info)}",
        f"Measured: {info['date']}, {code}, {f_load(run)}",
    ]
    if info.get("env"):
        items.append("Environment: " + ", ".join(f"`{k}={v}`" for k, v in info["env"].items()))
    items.append("Files: " + ", ".join(files))
    about = (data["about"] + "\n\n") if data.get("about") else ""
    return about + "\n".join(f"- {item}" for item in items)


def plot(run: Run) -> str:
    return f"![{run.stem}](img/{run.stem}.png)" if run.png else ""


def by_key(rows: Iterable[Dict[str, Any]], *keys: str) -> Dict[Tuple[Any, ...], Dict[str, Any]]:
    return {tuple(r[k] for k in keys): r for r in rows}


def ordered(values: Iterable[Any], first: Sequence[Any] = ()) -> List[Any]:
    """The distinct values in order of appearance, those in `first` first."""
    seen = list(dict.fromkeys(values))
    return [v for v in first if v in seen] + [v for v in seen if v not in first]


def median_range(values: Sequence[float]) -> str:
    return f"{f_x(statistics.median(values))} ({span(values)})" if values else DASH


def span(values: Sequence[float]) -> str:
    """'1.2-3.4x': the range of some ratios."""
    return f"{f_x(min(values))[:-1]}-{f_x(max(values))}"


def by_machine(runs: List[Run]) -> List[Tuple[str, List[Run]]]:
    """Runs grouped by machine tag, each group's default run first, then its variants by name."""
    groups: Dict[str, List[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.machine, r.bench != r.page, r.variant != "", r.variant)):
        groups.setdefault(run.machine, []).append(run)
    return sorted(groups.items())


def join(parts: Iterable[str]) -> str:
    return "\n\n".join(p.strip("\n") for p in parts if p) + "\n"


def sections(runs: List[Run], body, headline, title=lambda variant: f"### Variant `{variant}`"):
    """The usual page: per machine a section, its runs one after another (a variant under
    `title(variant)`), each its header, `body(run)` (a list of parts) and plot; per machine
    `headline(its runs)`. Returns the parts and the headlines by machine."""
    parts, heads = [], {}
    for machine, group in by_machine(runs):
        parts.append(f"## {machine_desc(group[0].info)}")
        for run in group:
            if run.variant:
                parts.append(title(run.variant))
            parts += [header(run), *body(run), plot(run)]
        heads[machine] = headline(group)
    return parts, heads
