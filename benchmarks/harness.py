"""Benchmark plumbing shared by the benchmark scripts: interleaved, synchronized timing, peak memory,
the machine and provenance every result records, and a run's JSON, PNG and log (`Output`).

Peak memory on CPU: the peak resident set (VmHWM, reset through /proc/self/clear_refs) during a call
minus the resident set before it, with glibc's mmap threshold at 64 KiB so that freed blocks leave it.
Timing runs at 32 MiB, where glibc's dynamic threshold settles in a long-running process.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, is_dataclass
from statistics import median as median  # re-exported for the scripts
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from sparseattn.kernels import memory

from .records import RESULTS, ROOT, Result, fmt  # noqa: F401  (re-exported for the scripts)


def parser(doc: Optional[str], tag: bool = True, **threads: Any) -> argparse.ArgumentParser:
    """A bench's parser: its docstring's first paragraph, --out (default RESULTS), --tag (a suffix of the
    result file names) unless tag=False, and --threads with add_argument's `threads` keywords if given."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--out", default=RESULTS, help="folder of the run's JSON, PNG and log")
    if tag:
        ap.add_argument("--tag", default="", help="suffix of the result file names")
    if threads:
        ap.add_argument("--threads", **threads)
    return ap


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_interleaved(
    fns: List[Callable[[], object]], device: str = "cpu", warmup: int = 3, reps: int = 10, budget_s: float = 20.0
) -> List[Any]:
    """Each fn `warmup` times (once if that run takes over budget_s / 4), then up to `reps` synchronized
    timed runs of each in rounds (fewer for one that has spent `budget_s`), every other round in reverse
    order, so that load changes hit every contender alike and none always follows the same neighbour.
    Returns per contender its times in ms, or the exception it raised."""
    times: List[Any] = [[] for _ in fns]
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


def timed_pass(call: Callable[[], torch.Tensor], mode: str, leaves: Sequence[torch.Tensor], grad=None) -> Callable:
    """What a pass times: call() under no_grad ("fwd"), or call() and its backward (grad, or ones),
    the leaves' gradients dropped after it, so that every call starts from none held."""

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return call()

    def fwd_bwd() -> torch.Tensor:
        out = call()
        out.backward(torch.ones_like(out) if grad is None else grad)
        for x in leaves:
            x.grad = None
        return out

    return fwd if mode == "fwd" else fwd_bwd


def failure(exc: BaseException) -> str:
    """A row's note for a contender that raised: "failed: <type>: <first line of the message>"."""
    return f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def measure(rows: Sequence[Any], fns: Sequence[Callable[[], object]], device: str = "cpu", memory=True, **timing):
    """`time_interleaved` (timing: warmup, reps, budget_s) into the rows' times_ms and ms, then with
    `memory` each one's `peak_extra_mib` (without it a peak the caller measured stays); a contender that
    raised gets `failure` as its note."""
    for r, fn, times in zip(rows, fns, time_interleaved(list(fns), device, **timing)):
        if isinstance(times, Exception):
            r.note = failure(times)
        elif times:
            r.ms, r.times_ms = median(times), times
            if memory:
                r.peak_extra_mib = peak_extra_mib(fn, device)


def time_ms(fn: Callable[[], object], device: str = "cpu", warmup: int = 3, reps: int = 10, budget_s: float = 20.0):
    """`time_interleaved` of one contender: its times in ms; what it raised is raised."""
    (times,) = time_interleaved([fn], device, warmup, reps, budget_s)
    if isinstance(times, Exception):
        raise times
    return times


try:
    import ctypes

    _LIBC: Any = ctypes.CDLL("libc.so.6")
except OSError:
    _LIBC = None
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _malloc_for(measuring_memory: bool) -> None:
    """glibc's thresholds for measuring memory (big blocks mmapped) or for timing (its steady state)."""
    if _LIBC is not None:
        mmap = 64 * 1024 if measuring_memory else 32 * 2**20
        _LIBC.mallopt(_M_MMAP_THRESHOLD, mmap)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, mmap if measuring_memory else 2 * mmap)


_malloc_for(measuring_memory=False)


def _status_kib(key: str) -> Optional[int]:
    found = re.search(rf"^{key}:\s*(\d+)", _read("/proc/self/status"), re.M)
    return int(found.group(1)) if found else None


def _reset_cpu_peak() -> bool:
    """Reset VmHWM; False where the kernel does not let it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            return f.write("5") == 1
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
        memory.release()  # sparseattn's pooled buffers too, so that the call's peak counts them
        before = _status_kib("VmRSS")
        if before is None or not _reset_cpu_peak():
            return None
        fn()
        peak = _status_kib("VmHWM")
        return None if peak is None else max(0.0, (peak - before) / 1024)
    finally:
        _malloc_for(measuring_memory=False)


def profile_top(
    fn: Callable[[], object], runs: int = 1, rows: int = 8, cuda: bool = False
) -> Tuple[List[dict], List[str], float]:
    """The `rows` operators with the most self CPU time (with `cuda`: self CUDA time, as a share of the
    device events' total) over `runs` calls of fn: [{"op", "self_ms" (per call), "share", "calls"}],
    every operator's name, and the total in ms."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        for _ in range(runs):
            fn()
    events = prof.key_averages()

    def self_us(e) -> float:
        return float(getattr(e, "self_device_time_total", 0.0)) if cuda else e.self_cpu_time_total

    total = sum(self_us(e) for e in events if not cuda or e.device_type == torch.autograd.DeviceType.CUDA) or 1
    top = [(e, self_us(e)) for e in sorted(events, key=self_us, reverse=True)[:rows]]
    tops = [dict(op=e.key, self_ms=round(t / 1e3 / runs, 2), share=round(t / total, 3), calls=e.count) for e, t in top]
    return tops, [e.key for e in events], total / 1e3


def profile_lines(tops: List[dict]) -> str:
    return "\n".join("    {op:60.60s} {self_ms:9.1f} ms {share:6.1%} {calls:6d} calls".format(**t) for t in tops)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _version(package: str) -> Optional[str]:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load() -> Optional[float]:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine_info(device: str = "cpu") -> dict:
    """The machine a run measures on: CPU (and its vector ISA), GPU, versions, thread settings,
    timing-relevant environment, date and load average."""
    import sparseattn

    cuda = device.startswith("cuda")
    model = re.search(r"^model name\s*:\s*(.*)$", _read("/proc/cpuinfo"), re.M)
    cpu = model.group(1).strip() if model else platform.processor() or platform.machine()
    info = dict(sparseattn=sparseattn.__version__, torch=torch.__version__, cpu=cpu, threads=torch.get_num_threads())
    info.update(cpu_capability=torch.backends.cpu.get_cpu_capability())  # the vector ISA torch's CPU kernels use
    info.update(env={k: os.environ[k] for k in _ENV_NOTED if k in os.environ})
    info.update(gpu=torch.cuda.get_device_name(0) if cuda else "no GPU", python=platform.python_version())
    info.update(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), load_average=_load())
    info.update(torch_threads=torch.get_num_threads(), thread_env=openmp_settings()["env"])
    info.update({name: _version(name) for name in ("triton", "torch_geometric")})
    return dict(info, cuda=torch.version.cuda if cuda else None)


# settings that change CPU timings, named in every result they were set for and in its command
_ENV_NOTED = (
    "THP_MEM_ALLOC_ENABLE ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS OMP_NUM_THREADS OMP_WAIT_POLICY "
    "MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_ MALLOC_TOP_PAD_ MALLOC_ARENA_MAX LD_PRELOAD"  # the C allocator's
).split()
_OPENMP_ENV = ("OMP_", "GOMP_", "KMP_", "MKL_")  # what OpenMP and MKL read at start


def openmp_settings() -> dict:
    """{"env": this process's OpenMP and MKL variables, "parallel_info": torch.__config__.parallel_info()'s
    lines above its environment section as {"backend": "OpenMP", "at::get_num_threads()": "2", ...}}."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_OPENMP_ENV)}
    text = torch.__config__.parallel_info()
    summary = {}
    for line in (x.strip() for x in text.split("Environment variables")[0].splitlines()):
        if line.startswith("OpenMP "):
            summary["OpenMP"] = line[len("OpenMP ") :]
        elif " : " in line:
            key, _, value = line.partition(" : ")
            summary[key.strip()] = value.strip()
    backend = re.search(r"ATen parallel backend: (.*)", text)
    if backend:
        summary["backend"] = backend.group(1).strip()
    return {"env": env, "parallel_info": summary}


@functools.lru_cache(maxsize=None)
def git_state() -> tuple:
    """(commit, dirty) of the checkout at the run's start (dirty: tracked files outside benchmarks/results/
    differ); outside a checkout ($SPARSEATTN_COMMIT or None, None)."""

    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return os.environ.get("SPARSEATTN_COMMIT"), None
    changes = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
    return commit, None if changes is None else bool(changes)


def _shown(arg: str) -> str:
    """An argument as a result records it: paths in the repository relative to it, the home folder as ~."""
    flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if os.path.isabs(value):
        absolute = os.path.normpath(value)
        if absolute == ROOT or absolute.startswith(ROOT + os.sep):
            value = os.path.relpath(absolute, ROOT)
        elif absolute.startswith(os.path.expanduser("~") + os.sep):
            value = "~" + absolute[len(os.path.expanduser("~")) :]
    return flag + eq + value


def command(module: str, argv: Optional[Sequence[str]] = None) -> str:
    """This run's command line: the timing-relevant environment settings, `python -m <module>` (or
    `python <path>` for a script run as a file) and argv (sys.argv[1:] by default)."""
    argv = sys.argv[1:] if argv is None else argv
    main = sys.modules.get("__main__")
    path = module.replace(".", "/") + ".py"
    as_file = getattr(main, "__spec__", None) is None and getattr(main, "__file__", "").endswith(path)
    env = [f"{k}={os.environ[k]}" for k in _ENV_NOTED if k in os.environ]
    return shlex.join([*env, "python", *([path] if as_file else ["-m", module]), *map(_shown, argv)])


def provenance(module: str, argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """{"commit", "dirty", "command"}: what reproduces a run of `module` with `argv`."""
    commit, dirty = git_state()
    return {"commit": commit, "dirty": dirty, "command": command(module, argv)}


def machine_header(info: dict) -> str:
    """The machine line of a run's log and plots, ending in ' | KEY=value' per timing-relevant setting."""
    return (
        f"sparseattn {info['sparseattn']} | torch {info['torch']} | {info['cpu']} "
        f"({info.get('cpu_capability', '?')}), {info['threads']} threads | {info['gpu']} | {info['date']} | "
        f"load {info['load_average']:.1f}" + "".join(f" | {k}={v}" for k, v in info.get("env", {}).items())
    )


def machine_tag(info: dict) -> str:
    """File-name-safe machine name, e.g. 'intel-xeon-processor-2t-cpu'."""
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|@.*", "", info["cpu"].lower())
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu).strip("-")
    gpu = "cpu" if info["gpu"] == "no GPU" else re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
    return f"{cpu}-{info['threads']}t-{gpu}"


def row_line(r: Result, extra: str = "") -> str:
    """A row's line in a run's log: pass, contender, ms, peak extra MiB, max |err|, then `extra` and the note."""
    return (
        f"  {r.mode:8s} {r.contender:15s} {fmt(r.ms, '10.3f')} ms  peak +{fmt(r.peak_extra_mib, '.1f')} MiB  "
        f"err {fmt(r.max_err_vs_reference, '.1e')}  {extra}{r.note}"
    )


def write_json(path: str, provenance: dict, info: dict, config: dict, results: Sequence[Any], **extra: Any) -> None:
    """{commit, dirty, command, machine (load average at the end added), config, results, **extra}."""
    info = dict(info, load_average_end=_load())
    rows = [asdict(r) if is_dataclass(r) else r for r in results]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({**provenance, "machine": info, "config": config, "results": rows, **extra}, f, indent=1)


class Output:
    """A run's files, `<out>/<bench>[_quick]_<machine>[_<tag>].{json,png,log}` (`path` without the ending,
    `png` the plot's), `header` its machine line. `log` prints a line and, unless log_file=False, appends it
    to the .log as it goes (first lines: command, commit, header); `save` writes the JSON with the provenance
    taken at the start; `close` prints (and logs) the tables its page will show."""

    def __init__(self, module: str, argv, out: str, info: dict, tag: str = "", quick: bool = False, log_file=True):
        os.makedirs(out, exist_ok=True)
        bench = module.rsplit(".", 1)[-1]
        self.path = os.path.join(out, f"{bench}{'_quick' * quick}_{machine_tag(info)}" + f"_{tag}" * bool(tag))
        self.png, self.info, self.header = self.path + ".png", info, machine_header(info)
        self.provenance = provenance(module, argv)
        self._log: Optional[Any] = None
        self._log_file, self._started = log_file, False

    def log(self, line: str = "") -> None:
        if self._log is None and self._log_file:
            self._log = open(self.path + ".log", "w")
            commit, dirty = self.provenance["commit"], self.provenance["dirty"]
            self._log.write(f"$ {self.provenance['command']}\n# commit {commit}{' (dirty)' * bool(dirty)}\n")
        lines, self._started = [line] if self._started else [self.header, line], True
        for text in lines:
            print(text, flush=True)
            if self._log is not None:
                self._log.write(text + "\n")
                self._log.flush()

    def save(self, config: dict, results: Sequence[Any], **extra: Any) -> None:
        write_json(self.path + ".json", self.provenance, self.info, config, results, **extra)

    def close(self, preview: bool = True) -> None:
        if preview:
            from .pages import preview as page_tables  # the pages import this module

            self.log("\n" + page_tables(self.path + ".json"))
        if self._log is not None:
            self._log.close()
        print(f"wrote {self.path}.json" + ", .log" * bool(self._log) + " and .png" * os.path.exists(self.png))


def nest(rows: Sequence[Any], panel: str, group: str, series: str, value: str) -> Dict[Any, Dict[Any, Dict[Any, Any]]]:
    """{panel: {group: {series: value}}} of the rows (dicts or dataclasses) that have a value, by field names."""
    out: Dict[Any, Dict[Any, Dict[Any, Any]]] = {}
    for r in rows:
        get = r.get if isinstance(r, dict) else functools.partial(getattr, r)
        if get(value) is not None:
            out.setdefault(get(panel), {}).setdefault(get(group), {})[get(series)] = get(value)
    return out


def write_bars(
    path: str, title: str, panels: Dict[str, Dict[str, Dict[str, float]]], ylabel: str, log: bool = False, lines=()
) -> bool:
    """A bar chart per panel ({panel: {group: {series: value}}}), a series in one color on every panel;
    `lines`: (value, label) reference lines. False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not panels:
        return False
    names = list(dict.fromkeys(s for groups in panels.values() for g in groups.values() for s in g))
    colors = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (panel, groups) in zip(axes[0], panels.items()):
        here = [n for n in names if any(n in g for g in groups.values())]
        width = 0.8 / max(1, len(here))
        for i, name in enumerate(here):
            xs = [j + i * width for j, g in enumerate(groups.values()) if name in g]
            ax.bar(xs, [g[name] for g in groups.values() if name in g], width, label=name, color=colors[name])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], list(groups), rotation=30, fontsize=7)
        for value, label in lines:
            ax.axhline(value, color="black", lw=1, ls="--", alpha=0.6, label=label)
        ax.set(yscale="log" if log else "linear", ylabel=ylabel, title=panel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=6, ncol=1 + len(here) // 12)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_times(path: str, title: str, rows: Sequence[Any]) -> bool:
    """The rows' ms, a panel per pass, per family a bar per contender (log scale); False if none drawn."""
    return write_bars(path, title, nest(rows, "mode", "family", "contender", "ms"), "ms (median)", log=True)
