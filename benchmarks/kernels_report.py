"""What bench_kernels stores besides its rows: the row type (`KernelResult`), the target ratios per
setting (the kernels page renders them) and the bars of its plot."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from .records import Result, fmt
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
    check_ms: Optional[float] = None  # `auto` on a tile kernel: median ms per call inside its finiteness check


def group_of(r: KernelResult) -> Tuple[str, float]:
    return setting_label(r.threads, r.omp_wait_policy), r.input_scale


RATIOS = {"auto/sdpa": ("auto", "sdpa"), "raw/Graph": ("auto (raw)", "auto")}  # name -> numerator, denominator
RATIOS.update({"compiled/eager": ("auto (compiled)", "auto"), "pyg/auto": ("pyg", "auto")})
RATIOS.update({"compiled pyg/auto": ("pyg (compiled)", "auto"), "checked/unchecked": ("auto", "auto (unchecked)")})
RATIOS.update({"standalone compiled pyg/auto": ("pyg (compiled, standalone)", "auto (standalone)")})
RATIOS.update({"harness/standalone pyg": ("pyg (compiled)", "pyg (compiled, standalone)")})
# the finiteness check's time inside `auto`'s calls over their time (kernels/guard.py), per pass
MODES = ("fwd", "fwd+bwd")
Bound = Tuple[str, float]
# Issue 44's targets against compiled PyG, per family by name prefix (the first that matches)
COMPILED_PYG_TARGETS = [("window-", (">=", 3.0)), ("random-", (">=", 1.5)), ("powerlaw-", (">=", 1.5))]
COMPILED_PYG_TARGETS += [("knn-", (">=", 2.0)), ("mesh-", (">=", 2.0))]
TARGETS = {  # every ratio in the kernels page's order: its column head there and target (None: none, or per family)
    "auto/sdpa": ("clamp-mode `auto` / `sdpa`", ("<=", 1.2)),
    "raw/Graph": ("`auto (raw)` / `auto`", ("<=", 1.5)),
    "checked/unchecked": ("`auto` / `auto (unchecked)`", None),
    "check share": ("`auto`'s time in its finiteness check", ("<=", 0.03)),
    "csr fwd+bwd/fwd": ("`csr` fwd+bwd / fwd", ("<=", 3.2)),  # csr's forward+backward time over its forward time
    "compiled pyg/auto": ("`pyg (compiled)` / `auto`", None),  # COMPILED_PYG_TARGETS
    "standalone compiled pyg/auto": ("the same, each in a fresh process as a user writes it", None),
    "harness/standalone pyg": ("`pyg (compiled)` here / in a fresh process", None),
    "compiled pyg/auto memory": ("`pyg (compiled)` / `auto` peak memory, fwd+bwd", (">=", 2.0)),
    "auto/floor": ("`auto` fwd / gather floor", None),  # FLOOR_TARGETS
    "shuffled/local": ("`auto` shuffled ids / local order", ("<=", 1.2)),  # *-shuffled over its *-local twin
    "reordered/local": ("`auto (locality order)` shuffled ids / `auto` local order", ("<=", 1.2)),
    "pyg/auto": ("`pyg` (eager) / `auto`", None),
    "compiled/eager": ("`auto (compiled)` / `auto`", None),
    "auto limit share": ("`auto` fwd, share of the limit (≥ 30% on windows)", None),  # limit time / auto's
    "auto 1 thread/this": ("`auto` at 1 thread / here", (">=", 1)),  # auto's time at 1 thread over its time here
}
SHARE_TARGETS = [("window-", (">=", 0.30))]  # "auto limit share" per family prefix
FLOOR_TARGETS = [("random-", ("<=", 1.2)), ("powerlaw-", ("<=", 1.2))]  # "auto/floor" per family prefix
PER_FAMILY = {"compiled pyg/auto": COMPILED_PYG_TARGETS, "auto limit share": SHARE_TARGETS, "auto/floor": FLOOR_TARGETS}


def target_of(ratio: str, family: str) -> Optional[Bound]:
    """The target of a ratio on a family: TARGETS' own, or for the per-family ratios the first prefix of
    PER_FAMILY[ratio] that the family's name starts with (None: no target there)."""
    if ratio in PER_FAMILY:
        return next((bound for prefix, bound in PER_FAMILY[ratio] if family.startswith(prefix)), None)
    return TARGETS[ratio][1]


def ratio_table(results: List[KernelResult]) -> List[dict]:
    """TARGETS' ratios per thread setting, input scale and family, as records {"threads", "input_scale",
    "family", "ratio", "values"} (values: [fwd, fwd+bwd], one value for csr fwd+bwd/fwd and the limit share)."""
    ms = {(*group_of(r), r.family, r.contender, r.mode): r.ms for r in results if r.ms}
    auto = [r for r in results if r.contender == "auto" and r.ms and r.limit_fraction]
    share = {(*group_of(r), r.family, r.mode): r.limit_fraction for r in auto}
    mib = {(*group_of(r), r.family, r.contender): r.peak_extra_mib for r in results if r.mode == "fwd+bwd"}
    mib = {k: v for k, v in mib.items() if v}
    floor = {(*group_of(r), r.family): r.floor_ms for r in results if r.mode == "fwd" and r.floor_ms}
    checked = [r for r in results if r.contender == "auto" and r.check_ms is not None]
    check = {(*group_of(r), r.family, r.mode): r.check_ms for r in checked}
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
            checked = [check.get((*grp, fam, m)) for m in MODES]
            shares = [c is not None and at("auto", m) and c / at("auto", m) for c, m in zip(checked, MODES)]
            if any(c is not None for c in checked):
                add(grp, fam, "check share", shares)
            f, fb = at("csr", "fwd"), at("csr", "fwd+bwd")
            if f and fb:
                add(grp, fam, "csr fwd+bwd/fwd", [fb / f])
            peak = lambda c, g=grp, f=fam: mib.get((*g, f, c))
            if peak("pyg (compiled)") and peak("auto"):
                add(grp, fam, "compiled pyg/auto memory", [peak("pyg (compiled)") / peak("auto")])
            if at("auto", "fwd") and floor.get((*grp, fam)):
                add(grp, fam, "auto/floor", [at("auto", "fwd") / floor[(*grp, fam)]])
            if fam.endswith("-shuffled"):
                twin = fam[: -len("shuffled")] + "local"
                for ratio, c in (("shuffled/local", "auto"), ("reordered/local", "auto (locality order)")):
                    vals = [at(c, m) and ms.get((*grp, twin, "auto", m)) for m in ("fwd", "fwd+bwd")]
                    if all(vals):
                        add(grp, fam, ratio, [at(c, m) / ms[(*grp, twin, "auto", m)] for m in ("fwd", "fwd+bwd")])
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


STREAM_CONTENDERS = ("auto", "pyg (compiled)", "pyg")  # bench_kernels --stream (stream.py)


def stream_table(rows: List[dict]) -> List[str]:
    """The --stream run's table: one line per contender, first and second pass in s, and each over `auto`'s."""
    at = {(r["contender"], r["pass"]): r["s"] for r in rows}
    lines = ["| contender | first pass, s | second pass, s | first / auto | second / auto |", "|---|---|---|---|---|"]
    for name in STREAM_CONTENDERS:
        cells = [at.get((name, p)) for p in (1, 2)]
        ratios = [c and at.get(("auto", p)) and c / at[("auto", p)] for p, c in zip((1, 2), cells)]
        lines.append(f"| {name} | " + " | ".join(fmt(x, ".2f") for x in cells + ratios) + " |")
    return lines
