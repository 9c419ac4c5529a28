"""GPU probe: where a training step's host time goes (needs CUDA; not part of the test run).

    python -m benchmarks.probe_train_host_gpu --data-dir data/multi30k

For the Multi30k preset graph Transformer (`auto`) and its padded nn.Transformer twin, as
`bench_train.py` builds and steps them (bf16 autocast, 4 batches, after a warm-up pass): the
calls that synchronize with the GPU, from `torch.cuda.set_sync_debug_mode("warn")`, grouped by
the project's call sites, and a cProfile of the same steps (top functions by own time, then
sparseattn's functions by cumulative time). Each step ends with one deliberate synchronize.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import tempfile
import time
import traceback
import types
import warnings

import torch

from .bench_train import build_models, make_step, setup_task


def sync_sites(step, n: int) -> collections.Counter:
    """{call site: count} of the synchronizing CUDA calls over n steps."""
    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        stack = [f for f in traceback.extract_stack() if "sparseattn" in f.filename or "bench_train" in f.filename]
        sites[" <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in reversed(stack[-4:]))] += 1

    shown = warnings.showwarning
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            for i in range(n):
                step(i)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = shown
    return sites


def profiled(step, n: int) -> str:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(n):
        step(i)
    prof.disable()
    lines = [f"  wall {1e3 * (time.perf_counter() - t0):.0f} ms for {n} steps (under cProfile)"]
    for order, restrict in (("tottime", 25), ("cumtime", "sparseattn")):
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out).sort_stats(order)
        stats.print_stats(restrict) if isinstance(restrict, int) else stats.print_stats(restrict, 30)
        lines += [line[:160] for line in out.getvalue().splitlines()[4:45] if line.strip()]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True, help="Multi30k-format folder")
    ap.add_argument("--batches", type=int, default=4)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_train_host_gpu needs a CUDA device")
    ns = types.SimpleNamespace(
        data_dir=args.data_dir, run=tempfile.mkdtemp(), batches=args.batches, copy_batches=16, device="cuda"
    )
    cfg, task, batches = setup_task("multi30k", ns)
    models = build_models(cfg, task, ["auto"], "cuda")
    steps = {n: make_step(n, m, batches, cfg.run.label_smoothing, "cuda") for n, m in models.items()}
    for step in steps.values():  # warm-up: kernels compiled, Adam state made
        for i in range(len(batches)):
            step(i)
    for name, step in steps.items():
        sites = sync_sites(step, len(batches))
        print(f"\n== {name}: synchronizing calls over {len(batches)} steps: {sum(sites.values())}")
        for site, count in sites.most_common(15):
            print(f"  {count:4d}  {site}")
        print(profiled(step, len(batches)))


if __name__ == "__main__":
    main()
