"""Benchmark plumbing shared by the benchmark scripts: one warmup + synchronized timing loop for
every contender, peak-memory measurement, a machine header, and JSON/PNG writers.

Peak memory: on CUDA, `torch.cuda.max_memory_allocated` over one call minus the memory allocated
before it. On CPU, the process's peak resident set (VmHWM in /proc/self/status, reset by writing
"5" to /proc/self/clear_refs) during one call minus the resident set (VmRSS) just before it: what
the call added on top of its inputs, including allocator and cached-index overhead. So that the
resident set follows what is live, glibc is told to serve allocations above 64 KiB with mmap
(returned to the OS on free) while memory is measured, and free heap pages are trimmed before each
measurement. Where the kernel cannot reset the peak, memory is reported as null.

Timing runs with glibc's mmap threshold fixed at 32 MiB, the value its dynamic threshold settles
at in a long-running process (it grows to the largest block freed, up to 32 MiB on 64-bit):
blocks below it are reused from the heap, as in a training loop. Timing under the 64 KiB setting
would charge every contender page faults on each large tensor (a 16 MiB copy: ~12 ms instead of
~2 ms here), which no default process pays.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import re
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, List, Optional

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_ms(
    fn: Callable[[], object], device: str = "cpu", warmup: int = 3, reps: int = 10, budget_s: float = 20.0
) -> List[float]:
    """Run fn `warmup` times, then up to `reps` synchronized timed runs (fewer when one run is slow,
    so a contender spends about `budget_s` at most). Returns the per-run times in ms."""
    t0 = time.perf_counter()
    for i in range(warmup):
        fn()
        _sync(device)
        if i == 0 and time.perf_counter() - t0 > budget_s / 4:
            break  # a slow contender: one warmup is enough
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < reps:
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
        if len(times) >= 3 and time.perf_counter() - start > budget_s:
            break
    return times


def time_interleaved(
    fns: List[Callable[[], object]], device: str = "cpu", warmup: int = 3, reps: int = 10, budget_s: float = 20.0
) -> List[object]:
    """time_ms for several contenders at once, in rounds (one timed run of each per round), so that
    load changes on a shared machine hit every contender alike; every other round runs them in
    reverse order, so that none always follows the same neighbour (one that frees large blocks
    leaves the next to fault its pages in again). Returns per contender its list of times in ms, or
    the exception it raised."""
    times: List[object] = [[] for _ in fns]
    for i, fn in enumerate(fns):
        try:
            t0 = time.perf_counter()
            for w in range(warmup):
                fn()
                _sync(device)
                if w == 0 and time.perf_counter() - t0 > budget_s / 4:
                    break
        except Exception as exc:  # noqa: BLE001 (reported by the caller)
            times[i] = exc
    spent = [0.0] * len(fns)
    for round_ in range(reps):
        active = [
            i
            for i, t in enumerate(times)
            if isinstance(t, list) and len(t) < reps and not (len(t) >= 3 and spent[i] > budget_s)
        ]
        if not active:
            break
        for i in active if round_ % 2 == 0 else reversed(active):
            try:
                _sync(device)
                t = time.perf_counter()
                fns[i]()
                _sync(device)
                times[i].append((time.perf_counter() - t) * 1e3)
                spent[i] += times[i][-1] / 1e3
            except Exception as exc:  # noqa: BLE001
                times[i] = exc
    return times


def _libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _malloc_for(measuring_memory: bool) -> None:
    """glibc's thresholds for measuring memory (big blocks via mmap, unmapped on free) or for timing
    (the steady state of its default dynamic threshold)."""
    if _LIBC is not None:
        mmap = 64 * 1024 if measuring_memory else 32 * 2**20
        _LIBC.mallopt(_M_MMAP_THRESHOLD, mmap)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, mmap if measuring_memory else 2 * mmap)


_malloc_for(measuring_memory=False)


def _status_kib(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_cpu_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_extra_mib(fn: Callable[[], object], device: str = "cpu") -> Optional[float]:
    """Peak memory one call of fn adds on top of what was allocated before it (MiB), or None."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    _malloc_for(measuring_memory=True)
    try:
        if _LIBC is not None:
            _LIBC.malloc_trim(0)
        before = _status_kib("VmRSS")
        if before is None or not _reset_cpu_peak():
            return None
        fn()
        peak = _status_kib("VmHWM")
        return None if peak is None else max(0.0, (peak - before) / 1024)
    finally:
        _malloc_for(measuring_memory=False)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str = "cpu") -> dict:
    import sparseattn

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else "no GPU"
    return {
        "sparseattn": sparseattn.__version__,
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector ISA torch's CPU kernels use
        "env": {k: os.environ[k] for k in _ENV_NOTED if k in os.environ},
        "gpu": gpu,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# settings that change CPU timings, named in every result they were set for
_ENV_NOTED = (
    "THP_MEM_ALLOC_ENABLE",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
)
_OPENMP_ENV = ("OMP_", "GOMP_", "KMP_", "MKL_NUM_THREADS")  # what OpenMP and MKL read at start


def openmp_settings() -> dict:
    """This process's OpenMP-related environment and a summary of torch.__config__.parallel_info():
    {"env": {name: value}, "parallel_info": {"backend": "OpenMP", "OpenMP": "201511 ...",
    "at::get_num_threads()": "2", "omp_get_max_threads()": "2", ...}} (its environment section left
    out: "env" holds it)."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_OPENMP_ENV)}
    summary = {}
    for line in torch.__config__.parallel_info().splitlines():
        line = line.strip()
        if line.startswith("Environment variables"):
            break
        if line.startswith("OpenMP "):
            summary["OpenMP"] = line[len("OpenMP ") :]
        elif " : " in line:
            key, value = line.split(" : ", 1)
            summary[key.strip()] = value.strip()
    backend = re.search(r"ATen parallel backend: (.*)", torch.__config__.parallel_info())
    if backend:
        summary["backend"] = backend.group(1).strip()
    return {"env": env, "parallel_info": summary}


def env_note(info: dict) -> str:
    """' | KEY=value' for each timing-relevant setting `machine_info` found, for a header's end."""
    return "".join(f" | {k}={v}" for k, v in info.get("env", {}).items())


def machine_header(info: dict) -> str:
    return (
        f"sparseattn {info['sparseattn']} | torch {info['torch']} | {info['cpu']} "
        f"({info.get('cpu_capability', '?')}), {info['threads']} threads | "
        f"{info['gpu']} | {info['date']} | load {info['load_average']:.1f}{env_note(info)}"
    )


def machine_tag(info: dict) -> str:
    """File-name-safe machine name, e.g. 'intel-xeon-processor-2t-cpu'."""
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|@.*", "", info["cpu"].lower())
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu).strip("-")
    gpu = "cpu" if info["gpu"] == "no GPU" else re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
    return f"{cpu}-{info['threads']}t-{gpu}"


@dataclass
class Result:
    """One contender on one graph and pass ("fwd" or "fwd+bwd"). ms is None when it was skipped
    or failed, with the reason in `note`."""

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


def write_json(path: str, info: dict, config: dict, results: List[Result]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": info, "config": config, "results": [asdict(r) for r in results]}, f, indent=1)


def write_png(path: str, title: str, results: List[Result]) -> bool:
    """Time vs edges, one line per contender, one panel per pass. False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    modes = sorted({r.mode for r in results}, key=lambda m: m != "fwd")
    names = list(dict.fromkeys(r.contender for r in results if r.ms is not None))
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}  # one color per contender
    fig, axes = plt.subplots(1, len(modes), figsize=(7 * len(modes), 5.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in results if r.mode == mode and r.ms is not None]
        for name in dict.fromkeys(r.contender for r in rows):
            pts = sorted((r.edges, r.ms, r.family) for r in rows if r.contender == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, alpha=0.8, color=colors[name])
        for e, fam in sorted({(r.edges, r.family) for r in rows}):
            ax.annotate(fam, (e, 1.0), fontsize=6, rotation=90, alpha=0.5, xycoords=("data", "axes fraction"), va="top")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("edges E")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"{mode}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def median(xs: List[float]) -> float:
    return statistics.median(xs)


def replot(json_path: str) -> None:
    """Redraw the PNG beside a results JSON: python -m benchmarks.harness results/<file>.json"""
    with open(json_path) as f:
        data = json.load(f)
    names = {f.name for f in fields(Result)}  # a benchmark's rows may carry fields of their own
    results = [Result(**{k: v for k, v in r.items() if k in names}) for r in data["results"]]
    write_png(json_path[: -len(".json")] + ".png", machine_header(data["machine"]), results)


if __name__ == "__main__":
    import sys

    replot(sys.argv[1])
