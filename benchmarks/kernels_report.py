"""What bench_kernels stores besides its rows: the row type (`KernelResult`), the target ratios per
setting (the kernels page renders them) and the bars of its plot."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from .harness import Result
from .threads import setting_label

DEFAULT_SCALE = 0.5  # inputs N(0, 0.25): no score reaches the clamp


@dataclass
class KernelResult(Result):
    """A Result with the setting it was measured at and its distance to the physical limit."""

    threads: int = 1
    omp_wait_policy: str = "default"
    input_scale: float = DEFAULT_SCALE
    gflop_per_s: Optional[float] = None
    limit_ms: Optional[float] = None
    limit_fraction: Optional[float] = None
    load_average: Optional[float] = None
    floor_ms: Optional[float] = None  # fwd rows: the family's gather floor at this setting (limits.gather_floor)
    floor_fraction: Optional[float] = None  # floor_ms / ms
    compile_s: Optional[float] = None  # compiled contenders: seconds of the build's first call, not timed


def group_of(r: KernelResult) -> Tuple[str, float]:
    return setting_label(r.threads, r.omp_wait_policy), r.input_scale


RATIOS = {"auto/sdpa": ("auto", "sdpa"), "raw/Graph": ("auto (raw)", "auto")}  # name -> numerator, denominator
RATIOS.update({"compiled/eager": ("auto (compiled)", "auto"), "pyg/auto": ("pyg", "auto")})
TARGETS = {  # every ratio (issue 31) in the kernels page's order: its column head there and target, or None
    "auto/sdpa": ("clamp-mode `auto` / `sdpa`", ("<=", 1.15)),
    "raw/Graph": ("`auto (raw)` / `auto`", ("<=", 1.5)),
    "csr fwd+bwd/fwd": ("`csr` fwd+bwd / fwd", ("<=", 2.5)),  # csr's forward+backward time over its forward time
    "pyg/auto": ("`pyg` / `auto`", (">=", 30)),
    "compiled/eager": ("`auto (compiled)` / `auto`", None),
    "auto limit share": ("`auto` fwd, share of the limit (≥ 25% on window-65536)", None),  # limit time / auto's
    "auto 1 thread/this": ("`auto` at 1 thread / here", (">=", 1)),  # auto's time at 1 thread over its time here
}
SHARE_TARGETS = {"window-65536": (">=", 0.25)}  # "auto limit share" per family


def ratio_table(results: List[KernelResult]) -> List[dict]:
    """TARGETS' ratios per thread setting, input scale and family, as records {"threads", "input_scale",
    "family", "ratio", "values"} (values: [fwd, fwd+bwd], one value for csr fwd+bwd/fwd and the limit share)."""
    ms = {(*group_of(r), r.family, r.contender, r.mode): r.ms for r in results if r.ms}
    auto = [r for r in results if r.contender == "auto" and r.ms and r.limit_fraction]
    share = {(*group_of(r), r.family, r.mode): r.limit_fraction for r in auto}
    out: List[dict] = []

    def add(group, fam, name, vals):
        out.append({"threads": group[0], "input_scale": group[1], "family": fam, "ratio": name, "values": vals})

    for grp in dict.fromkeys(group_of(r) for r in results):
        for fam in dict.fromkeys(r.family for r in results):
            at = lambda c, m, g=grp, f=fam: ms.get((*g, f, c, m))
            for name, (num, den) in RATIOS.items():
                vals = [at(num, m) and at(den, m) and at(num, m) / at(den, m) for m in ("fwd", "fwd+bwd")]
                if any(vals):
                    add(grp, fam, name, vals)
            f, fb = at("csr", "fwd"), at("csr", "fwd+bwd")
            if f and fb:
                add(grp, fam, "csr fwd+bwd/fwd", [fb / f])
            fwd_share = share.get((*grp, fam, "fwd"))
            if fwd_share:
                add(grp, fam, "auto limit share", [fwd_share])
            one, c = ("1", grp[1]), "auto"
            if grp[0] != "1":
                vals = [at(c, m, one) and at(c, m) and at(c, m, one) / at(c, m) for m in ("fwd", "fwd+bwd")]
                if any(vals):
                    add(grp, fam, f"{c} 1 thread/this", vals)
    return out


def plotted(results: List[KernelResult]) -> List[Result]:
    """The PNG's bars: every contender at the first setting and scale; `auto` at the others."""
    first = group_of(results[0]) if results else None
    out: List[Result] = []
    for r in results:
        if group_of(r) == first:
            out.append(r)
        elif r.contender == "auto":
            label, scale = group_of(r)
            out.append(replace(r, contender=f"auto [{label} t, s={scale:g}]"))
    return out
