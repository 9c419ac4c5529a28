"""What both example scripts share: flags, the optional PyG import, timing and peak-memory
measurement, and the results table."""

from __future__ import annotations

import argparse
import ctypes
import gc
import random
import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

MEMORY_NOTE = (
    "peak_MiB: the process's peak resident memory during one training step (forward, backward, optimizer) "
    "minus its resident memory before it (freed memory returned to the system first, glibc's malloc_trim), "
    "from Linux's /proc/self/status (VmHWM reset through /proc/self/clear_refs); n/a elsewhere"
)


def parse_args(description: str, default_epochs: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=default_epochs)
    parser.add_argument("--small", action="store_true", help="tiny quick mode: a subset of the data, small model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def import_pyg_conv() -> Optional[type]:
    """torch_geometric.nn.TransformerConv, or None (then only the sparseattn model runs)."""
    try:
        from torch_geometric.nn import TransformerConv
    except ImportError:
        print("torch_geometric is not installed: running the sparseattn model only")
        return None
    return TransformerConv


def status_kib(field: str) -> Optional[int]:
    """A /proc/self/status field in KiB ("VmRSS", "VmHWM"), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset VmHWM to the current resident set (Linux; False elsewhere), after a garbage collection."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_step_mib(step: Callable[[], object]) -> Optional[float]:
    """Peak MiB the process's resident memory grows by during `step()` (Linux: VmHWM after resetting it,
    minus VmRSS before, freed memory first handed back to the system by glibc's malloc_trim); None
    where the system does not expose it."""
    gc.collect()
    try:  # hand freed memory back to the system first, so the step's allocations show in its RSS
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    before = status_kib("VmRSS")
    if not reset_peak():
        return None
    step()
    peak = status_kib("VmHWM")
    return None if peak is None or before is None else max(0.0, (peak - before) / 1024)


class Contender(NamedTuple):
    """One model in the comparison. train_epoch() -> mean loss; evaluate(split) -> accuracy for
    split in ("val", "test"); step() runs one optimizer step (what peak memory is measured on)."""

    name: str
    train_epoch: Callable[[], float]
    evaluate: Callable[[str], float]
    step: Callable[[], object]


def minibatch_training(
    model: torch.nn.Module, opt, batches: Dict[str, List], loss: Callable
) -> Tuple[Callable, Callable]:
    """(step, train_epoch) over batches["train"]: step(b) one optimizer step on batch b (default:
    the first) with loss(b) -> a scalar tensor; train_epoch() every batch once in a seeded random
    order (the runner seeds each epoch: the same order for every contender), the mean loss."""

    def step(b: Optional[Dict] = None) -> float:
        model.train()
        opt.zero_grad()
        value = loss(b if b is not None else batches["train"][0])
        value.backward()
        opt.step()
        return value.item()

    def train_epoch() -> float:
        order = torch.randperm(len(batches["train"])).tolist()
        return sum(step(batches["train"][i]) for i in order) / len(order)

    return step, train_epoch


def run_side_by_side(contenders: List[Contender], epochs: int, seed: int, metric: str = "acc") -> None:
    """Train the contenders epoch by epoch, each epoch under the same seed (same feature dropout and
    batch order), print a progress line per epoch, then the results table. evaluate() gives
    accuracy (metric "acc", higher is better) or an error (metric "rmse", lower is better); the
    test score is taken at the best validation epoch."""
    sign = -1.0 if metric == "rmse" else 1.0
    stats = {c.name: {"times": [], "best_val": -float("inf"), "test_acc": float("nan")} for c in contenders}
    for epoch in range(1, epochs + 1):
        parts = []
        for c in contenders:
            s = stats[c.name]
            seed_everything(seed + epoch)
            start = time.perf_counter()
            loss = c.train_epoch()
            s["times"].append(time.perf_counter() - start)
            with torch.no_grad():
                val = c.evaluate("val")
                if sign * val > s["best_val"]:
                    s["best_val"], s["test_acc"] = sign * val, c.evaluate("test")
            parts.append(f"{c.name} loss {loss:.4f} val {val:.4f} ({s['times'][-1]:.3f} s)")
        print(f"epoch {epoch:3d} | " + " | ".join(parts), flush=True)
    rows = []
    for c in contenders:
        seed_everything(seed)
        s = stats[c.name]
        rows.append(
            dict(
                name=c.name,
                test_acc=s["test_acc"],
                best_val=sign * s["best_val"],
                s_per_epoch=mean_epoch_seconds(s["times"]),
                peak_mib=peak_step_mib(c.step),
            )
        )
    print_results(rows, metric)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return (logits.argmax(-1) == labels).float().mean().item() if labels.numel() else float("nan")


def print_results(rows: List[Dict[str, object]], metric: str = "acc") -> None:
    """One row per model: name, test score (at the best validation epoch), best validation score,
    mean seconds per training epoch (first epoch excluded when there are more), peak MiB."""
    print(f"{'model':<12} {'test_' + metric:>8} {'best_val':>8} {'s/epoch':>9} {'peak_MiB':>9}")
    for r in rows:
        peak = r["peak_mib"]
        mem = f"{peak:9.2f}" if isinstance(peak, float) else f"{'n/a':>9}"
        print(f"{r['name']:<12} {r['test_acc']:8.4f} {r['best_val']:8.4f} {r['s_per_epoch']:9.4f} {mem}")
    print(MEMORY_NOTE)


def mean_epoch_seconds(times: List[float]) -> float:
    return statistics.mean(times[1:] if len(times) > 1 else times)
