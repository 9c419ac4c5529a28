"""Training on a graph partitioned across gloo processes (`sparseattn.distributed`): per-rank memory, step
time and halo traffic with 1 and 4 processes, for the model of examples/distributed_node_classification.py
(docs/benchmarks/distributed.md); each configuration (`configs`) is one torchrun launch of this script.

    python -m benchmarks.bench_distributed                     # default sizes (~15 min on 2 cores)
    python -m benchmarks.bench_distributed --quick             # 20K-node graphs, 2 steps: a smoke run
    python -m benchmarks.bench_distributed --nodes 500000 --knn-nodes 250000 --world 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch

from .harness import _LIBC, ROOT, Output, _reset_cpu_peak, _status_kib, machine_info, parser, write_bars

EXAMPLE = os.path.join(ROOT, "examples", "distributed_node_classification.py")
SEED, WIDTH, HEADS, LR = 0, 32, 4, 0.003


class Config(NamedTuple):
    family: str  # "window" or "knn"
    partition: str  # "whole" (one process), "contiguous" or "metis"
    world: int

    @property
    def name(self) -> str:
        return f"{self.family}-{self.partition}-P{self.world}"


def configs(world: int) -> List[Config]:
    parts = [("window", "whole"), ("window", "contiguous"), ("knn", "whole"), ("knn", "contiguous"), ("knn", "metis")]
    return [Config(family, part, 1 if part == "whole" else world) for family, part in parts]


@dataclass
class RankResult:
    """One rank of one configuration; per-step numbers are medians over the timed steps."""

    config: str
    family: str
    partition: str
    world: int
    rank: int
    nodes: int = 0
    edges: int = 0
    halo: int = 0
    sent: int = 0
    setup_s: float = 0.0
    setup_peak_mib: float = 0.0
    rss_after_setup_mib: float = 0.0
    train_peak_mib: float = 0.0
    step_s: float = 0.0
    exchange_s: float = 0.0
    wait_s: float = 0.0
    exchange_share: float = 0.0
    wait_share: float = 0.0
    rows_in: float = 0.0
    rows_out: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    step_times_s: List[float] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    load_average: Optional[float] = None
    note: str = ""


def _example() -> Any:
    """examples/distributed_node_classification.py as a module (its model, data and training loop)."""
    spec = importlib.util.spec_from_file_location("distributed_node_classification", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def knn_edges(n: int, k: int, seed: int) -> torch.Tensor:
    """(2, n * k) in-edges of each of n uniform random points in [0, 1)^2 from its k nearest points
    (itself included), destination-major. Point i is node i: ids carry no spatial order."""
    import numpy as np
    from scipy.spatial import cKDTree  # type: ignore[import-untyped]

    points = np.random.default_rng(seed).random((n, 2))
    _, nbr = cKDTree(points).query(points, k=k, workers=-1)
    src = torch.from_numpy(np.ascontiguousarray(nbr).reshape(-1)).long()
    return torch.stack([src, torch.arange(n).repeat_interleave(k)])


def write_knn_parts(edges: torch.Tensor, n: int, world: int, data_dir: str, log: Callable[[str], None]) -> None:
    """The knn graph's files: whole/edges.pt, and per partition its ownership and rank{r}.pt in-edges
    (a rank loads only its own; window ranks build theirs)."""
    from sparseattn import Graph
    from sparseattn.distributed import partition

    os.makedirs(os.path.join(data_dir, "whole"))
    torch.save(edges, os.path.join(data_dir, "whole", "edges.pt"))
    start = time.perf_counter()
    shards = partition(Graph(edges, num_src=n, num_dst=n), world, method="metis")
    metis_owner = torch.empty(n, dtype=torch.long)
    for shard in shards:
        metis_owner[shard.nodes] = shard.rank
    del shards
    log(f"knn: METIS partition into {world} parts (distributed.partition): {time.perf_counter() - start:.1f} s")
    ranges = [n * r // world for r in range(world + 1)]
    contiguous = torch.repeat_interleave(torch.arange(world), torch.tensor(ranges).diff())
    for name, owner in (("contiguous", contiguous), ("metis", metis_owner)):
        folder = os.path.join(data_dir, name)
        os.makedirs(folder)
        torch.save(ranges if name == "contiguous" else owner, os.path.join(folder, "ownership.pt"))
        edge_owner = owner[edges[1]]
        for rank in range(world):
            torch.save(edges[:, edge_owner == rank].clone(), os.path.join(folder, f"rank{rank}.pt"))


def launch(cfg: Config, args: argparse.Namespace, data_dir: str, log: Callable[[str], None]) -> List[RankResult]:
    """One configuration under torchrun (--nproc_per_node world); each rank's RankResult."""
    out_dir = os.path.join(data_dir, "out", cfg.name)
    os.makedirs(out_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(cfg.world)]
    cmd += ["-m", "benchmarks.bench_distributed", "--worker", cfg.name, "--data-dir", data_dir, "--out-dir", out_dir]
    cmd += ["--nodes", str(args.nodes), "--radius", str(args.radius), "--knn-nodes", str(args.knn_nodes)]
    cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=ROOT)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
        errors = [line for line in run.stderr.splitlines() if "Error" in line and "ChildFailedError" not in line]
        failure = "" if run.returncode == 0 else f"exit {run.returncode}: {(errors or ['?'])[-1].strip()}"
    except subprocess.TimeoutExpired:
        failure = f"timed out after {args.timeout} s"
    log(f"{cfg.name}: {time.perf_counter() - start:.0f} s wall (load average before {load:.2f}) {failure}")
    rows = []
    for rank in range(cfg.world):
        path = os.path.join(out_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                rows.append(RankResult(**json.load(f)))
        else:
            rows.append(RankResult(cfg.name, cfg.family, cfg.partition, cfg.world, rank, note=failure or "no result"))
    return rows


def ratios(results: List[RankResult]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per distributed configuration: max-rank train peak / one-process train peak, the largest
    exchange and wait shares, and the step-1 loss's largest difference from the one process."""
    summary: Dict[str, Dict[str, Optional[float]]] = {}
    for name in dict.fromkeys(r.config for r in results):
        rows = [r for r in results if r.config == name]
        whole = [r for r in results if r.family == rows[0].family and r.partition == "whole" and not r.note]
        if rows[0].partition == "whole" or not whole or any(r.note for r in rows):
            continue
        ref = whole[0]
        summary[name] = {
            "peak_ratio": max(r.train_peak_mib for r in rows) / ref.train_peak_mib if ref.train_peak_mib else None,
            "setup_peak_ratio": max(r.setup_peak_mib for r in rows) / ref.setup_peak_mib,
            "exchange_share": max(r.exchange_share for r in rows),
            "wait_share": max(r.wait_share for r in rows),
            "step_ratio": max(r.step_s for r in rows) / ref.step_s,
            "step1_loss_diff": max(abs(r.losses[0] - ref.losses[0]) for r in rows) if ref.losses else None,
        }
    return summary


def main(argv: Optional[List[str]] = None) -> None:
    p = parser(__doc__, type=int, default=1, help="torch threads per process")
    p.add_argument("--nodes", type=int, default=2_000_000, help="window graph nodes")
    p.add_argument("--radius", type=int, default=8, help="window radius")
    p.add_argument("--knn-nodes", type=int, default=2_000_000, help="knn graph points")
    p.add_argument("--k", type=int, default=16, help="in-edges per knn node (self included)")
    p.add_argument("--world", type=int, default=4, help="processes of the distributed runs")
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--families", default="window,knn")
    p.add_argument("--quick", action="store_true", help="20K-node graphs, 2 timed steps")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per configuration")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a configuration's name: run as one of its ranks
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.nodes, args.knn_nodes, args.steps = 20_000, 20_000, 2
    info = dict(machine_info(), load_average_1_5_15=list(os.getloadavg()))
    out = Output("benchmarks.bench_distributed", argv, args.out, info, args.tag)
    out.log(
        f"window: {args.nodes} nodes, radius {args.radius} | knn: {args.knn_nodes} points, k={args.k} | width "
        f"{WIDTH}, {HEADS} heads, 2 layers, float32 | {args.world} processes vs 1 | 1 warm-up + {args.steps} "
        f"timed steps | {args.threads} thread(s) per process, gloo"
    )
    families = args.families.split(",")
    results: List[RankResult] = []
    data_dir = tempfile.mkdtemp(prefix="bench_distributed_")
    try:
        for cfg in configs(args.world):
            if cfg.family not in families:
                continue
            if cfg.family == "knn" and not os.path.exists(os.path.join(data_dir, "whole")):
                start = time.perf_counter()
                edges = knn_edges(args.knn_nodes, args.k, SEED)
                out.log(f"knn: {edges.shape[1]} edges built in {time.perf_counter() - start:.1f} s (cKDTree)")
                write_knn_parts(edges, args.knn_nodes, args.world, data_dir, out.log)
                del edges
            results += launch(cfg, args, data_dir, out.log)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    info["load_average_1_5_15_end"] = list(os.getloadavg())
    config = {k: v for k, v in vars(args).items() if k not in ("worker", "data_dir", "out_dir", "out")}
    out.save(config, results, summary=ratios(results))
    ok = {f"{r.config} r{r.rank}": r for r in results if not r.note}
    memory = {k: {"setup": r.setup_peak_mib / 1024, "train": r.train_peak_mib / 1024} for k, r in ok.items()}
    compute = {k: max(r.step_s - r.exchange_s - r.wait_s, 0.0) for k, r in ok.items()}
    steps = {k: {"compute": compute[k], "exchange": r.exchange_s, "wait": r.wait_s} for k, r in ok.items()}
    panels = {"peak resident GiB per rank (VmHWM)": memory, "s per step (median)": steps}
    write_bars(out.png, out.header, panels, "GiB / s")
    out.close()


def worker(args: argparse.Namespace) -> None:
    """One rank of one configuration (under torchrun): setup, training steps, its RankResult to --out-dir."""
    import torch.distributed as dist

    ex = _example()
    family, partition, _ = args.worker.split("-")
    world = ex.init_distributed()
    rank = dist.get_rank() if world > 1 else 0
    start = time.perf_counter()
    num_nodes = args.nodes if family == "window" else args.knn_nodes
    folder = os.path.join(args.data_dir, partition)
    if family == "window":
        ranges = ex.contiguous_ranges(args.nodes, world)
        edges = ex.window_in_edges(ranges[rank], ranges[rank + 1], args.nodes, args.radius)
        built = ex.build(edges, world, SEED, ranges=ranges)
    elif partition == "whole":
        edges = torch.load(os.path.join(folder, "edges.pt"))
        built = ex.build(edges, world, SEED, ranges=[0, num_nodes])
    else:
        edges = torch.load(os.path.join(folder, f"rank{rank}.pt"))
        ownership = torch.load(os.path.join(folder, "ownership.pt"))
        built = ex.build(edges, world, SEED, **{"ranges" if partition == "contiguous" else "owner": ownership})
    del edges
    model = ex.make_model(world, SEED, WIDTH, HEADS)
    setup_s = time.perf_counter() - start
    setup_peak = _status_kib("VmHWM") or 0
    if _LIBC is not None:
        _LIBC.malloc_trim(0)  # setup's freed heap pages are not training's
    rss = _status_kib("VmRSS") or 0
    _reset_cpu_peak()
    records = ex.train(model, built.data, built.graph, num_nodes, 1 + args.steps, LR, log=False)
    train_peak = _status_kib("VmHWM") or 0
    med = ex.summary(records)  # medians over the timed steps, by RankResult's names
    names = dict(step_s="s", exchange_s="seconds", wait_s="wait_seconds", rows_in="rows_received")
    names.update(rows_out="rows_sent", bytes_in="bytes_received", bytes_out="bytes_sent")
    r = RankResult(args.worker, family, partition, world, rank, nodes=int(built.data["y"].numel()), edges=built.edges)
    r.halo, r.sent = (built.shard.halo_size, built.shard.num_sent) if built.shard is not None else (0, 0)
    r.setup_s, r.setup_peak_mib, r.rss_after_setup_mib = setup_s, setup_peak / 1024, rss / 1024
    r.train_peak_mib, r.load_average = train_peak / 1024, os.getloadavg()[0]
    r.exchange_share, r.wait_share = med["exchange_share"], med["wait_share"]
    for field_name, key in names.items():
        setattr(r, field_name, med[key])
    r.step_times_s, r.losses = [x["s"] for x in records], [x["loss"] for x in records]
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(asdict(r), f)
    if world > 1:
        del model  # DDP's reducer must not outlive the group it holds (see docs/guide/distributed.md)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
