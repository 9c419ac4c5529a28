"""The tables of a benchmark whose registry line names no renderer: a run's rows (`results`, one
column per field that has a value in some row), each other value the harness stored beside them
(`Output.save(config, results, **extra)`: a list of rows, a mapping of rows or of values, a value),
and the config's plain settings. Numbers as stored, to about three significant digits."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

from .common import DASH, Run, table

# what header(run) shows, or what is not a table
KNOWN = ("commit", "dirty", "command", "commit_note", "machine", "config", "results", "about")
SHORT = 4  # a list of up to this many plain values is one cell; a longer one (the times per rep) is left out


def f_num(x: float) -> str:
    """A float to about three significant digits, a small one in scientific notation."""
    a = abs(x)
    if a == 0 or not math.isfinite(x):
        return f"{x:g}"
    if a < 0.01:
        return f"{x:.2e}"
    return f"{x:,.{0 if a >= 100 else 1 if a >= 10 else 2 if a >= 1 else 3}f}"


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _shown(v: Any) -> bool:
    """Whether a value fills a cell: a plain value other than None and "", or a short list of them."""
    if isinstance(v, (list, tuple)):
        return 0 < len(v) <= SHORT and all(_plain(x) for x in v)
    return _plain(v) and v is not None and v != ""


def value(v: Any) -> str:
    """A cell: None a dash, a bool yes or no, numbers by `f_num` (ints with thousands commas), a short list
    joined by " / "."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f_num(v)
    if isinstance(v, (list, tuple)):
        return " / ".join(value(x) for x in v) if _shown(v) else DASH
    return str(v).replace("|", "\\|").replace("\n", " ")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rows_table(rows: Sequence[Dict[str, Any]]) -> str:
    """A markdown table of the rows: a column per field shown in some row (in order of appearance),
    right-aligned where every value is a number; the field "" (a mapping's keys) first, unnamed."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    keys = [k for k in keys if k == "" or any(_shown(r.get(k)) for r in rows)]
    right = [i for i, k in enumerate(keys) if all(_number(r[k]) for r in rows if r.get(k) is not None)]
    right = [i for i in right if any(r.get(keys[i]) is not None for r in rows)]
    return table([f"`{k}`" if k else "" for k in keys], ([value(r.get(k)) for k in keys] for r in rows), right=right)


def _stored(key: str, v: Any) -> str:
    """One more value of the run's JSON, as a table where it has the shape of one."""
    if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
        return f"`{key}`:\n\n" + rows_table(v)
    if isinstance(v, dict) and v and all(isinstance(r, dict) for r in v.values()):
        return f"`{key}`:\n\n" + rows_table([{"": f"`{name}`", **r} for name, r in v.items()])
    if isinstance(v, dict) and v:
        shown = {k: x for k, x in v.items() if _shown(x)}
        rows = [[f"`{k}`", value(x)] for k, x in shown.items()]
        return f"`{key}`:\n\n" + table(["", "value"], rows, right=(1,)) if rows else ""
    return f"`{key}`: {value(v)}" if _shown(v) else ""


def run_tables(run: Run) -> List[str]:
    """The parts of a run's section after its header: settings, rows, other stored values."""
    settings = ", ".join(f"`{k}={value(v)}`" for k, v in run.config.items() if _shown(v))
    out = [f"Settings: {settings}." if settings else ""]
    rows = [r for r in run.results if isinstance(r, dict)]
    out.append(f"Rows ({len(rows)}):\n\n" + rows_table(rows) if rows else "No rows in this run.")
    out += [_stored(k, v) for k, v in run.data.items() if k not in KNOWN]
    return [p for p in out if p]
