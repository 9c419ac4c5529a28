"""What results and pages share without running anything: where results live, the row type of a
timed contender and the number format of the logs. Imports nothing else from benchmarks/, so the
page renderers (pages/) read results without importing the runners, and the runners print their page
tables through pages/ without a circle."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


@dataclass
class Result:
    """One contender on one graph and pass ("fwd" or "fwd+bwd"); ms None: skipped or failed (`note` says why)."""

    family: str
    edges: int
    contender: str
    mode: str
    ms: Optional[float] = None
    times_ms: List[float] = field(default_factory=list)
    speedup_vs_reference: Optional[float] = None
    peak_extra_mib: Optional[float] = None
    gb_per_s: Optional[float] = None
    max_err_vs_reference: Optional[float] = None
    note: str = ""


def fmt(x: Optional[float], spec: str) -> str:
    """x formatted by spec, "-" for None (as wide as the spec's width)."""
    return format(x, spec) if x is not None else "-".rjust(int(re.match(r"\d*", spec).group() or 0))
