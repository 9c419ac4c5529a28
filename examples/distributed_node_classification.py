"""Node classification on one large graph split across processes: each rank owns a range of nodes,
holds only their rows and in-edges, and fetches the few rows its edges read from other ranks (its
halo) in every attention layer (`sparseattn.distributed`). Parameters are replicated with
DistributedDataParallel; no rank ever holds the whole graph or all features.

The task is synthetic and needs the neighbourhood: every node carries a hidden random signal s
(its first feature; the other 15 are noise), and its label is the sign of the sum of s over its
in-neighbours (on the default window graph: the 17 nodes within distance 8). Features, signal and
labels are generated per global node id, so every rank makes exactly the rows one process would.

    python examples/distributed_node_classification.py                           # one process, whole graph
    torchrun --nproc_per_node 4 examples/distributed_node_classification.py       # 4 ranks (gloo, CPU)
    torchrun --nproc_per_node 2 examples/distributed_node_classification.py --small   # seconds
    python examples/distributed_node_classification.py --nodes 500000 --steps 10 --threads 2

Defaults: a window graph of 2,000,000 nodes, radius 8 (34M edges), width 32, 4 heads, 5 Adam
steps, 1 thread per process. Prints per step the global loss and accuracy, then per rank its peak
memory (VmHWM of /proc/self/status: during setup, and during training after a reset), median step
time, the rows and bytes it traded per step and the exchange's share of the step. One process
trains on the whole `Graph`; P processes compute the same losses up to float32 rounding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import reset_peak, status_kib
from torch import Tensor, nn

from sparseattn import EdgeAttention, Graph
from sparseattn.distributed import HaloExchange, Shard, local_shard

BLOCK = 4096  # node ids per random block: rows are drawn per block, so any node set gets the same rows
FEATURES, CLASSES = 16, 2


def per_node_randn(ids: Tensor, cols: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """(len(ids), cols) standard normal rows, each a function of (seed, node id) only.

    ids: (M,) int64 global node ids, ascending. Rows are drawn per block of BLOCK ids from a
    generator seeded with the block, so a rank generating its own ids gets what one process gets.
    """
    out = torch.empty(ids.numel(), cols, dtype=dtype)
    blocks, counts = torch.unique_consecutive(ids // BLOCK, return_counts=True)
    start = 0
    for block, count in zip(blocks.tolist(), counts.tolist()):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + block)
        rows = torch.randn(BLOCK, cols, generator=gen, dtype=dtype)
        out[start : start + count] = rows[ids[start : start + count] - block * BLOCK]
        start += count
    return out


def window_in_edges(lo: int, hi: int, n: int, radius: int) -> Tensor:
    """(2, E) edges into destinations lo..hi-1 of `graphs.window(n, radius)`, in its order
    (destination-major, sources ascending): row 0 source, row 1 destination, global ids."""
    offsets = torch.arange(-radius, radius + 1)
    dst = torch.arange(lo, hi).repeat_interleave(offsets.numel())
    src = dst + offsets.repeat(hi - lo)
    keep = (src >= 0) & (src < n)
    return torch.stack([src[keep], dst[keep]])


def make_task(edge_index: Tensor, nodes: Tensor, seed: int) -> Dict[str, Tensor]:
    """Features x (N_own, 16) and labels y (N_own,) of `nodes` (ascending global ids) from their
    in-edges (2, E_own): s = per-node signal, x = [s, noise], y = [sum of s over the in-neighbours > 0]."""
    src, dst = edge_index
    sources = torch.unique(src)  # sorted
    s_src = per_node_randn(sources, 1, seed, torch.float64)[:, 0]
    total = torch.zeros(nodes.numel(), dtype=torch.float64)
    total.index_add_(0, torch.searchsorted(nodes, dst), s_src[torch.searchsorted(sources, src)])  # edge order
    x = per_node_randn(nodes, FEATURES, seed + 1)
    x[:, 0] = per_node_randn(nodes, 1, seed, torch.float64)[:, 0].float()
    return {"x": x, "y": (total > 0).long()}


GraphArg = Union[Graph, HaloExchange]


class Block(nn.Module):
    """Pre-norm residual attention, then a pre-norm residual feed-forward: (N, d) -> (N, d)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = EdgeAttention(width, heads)
        self.ffn = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: Tensor, graph: GraphArg) -> Tensor:
        x = x + self.attn(self.norm1(x), graph)  # a HaloExchange: this rank's rows, halo fetched inside
        return x + self.ffn(self.norm2(x))


class Net(nn.Module):
    """Linear(16 -> width) -> 2 x Block -> LayerNorm -> Linear(width -> 2 classes)."""

    def __init__(self, width: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, CLASSES))

    def forward(self, x: Tensor, graph: GraphArg) -> Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, graph)
        return self.head(h)


def train(
    model: nn.Module,
    data: Dict[str, Tensor],
    graph: GraphArg,
    num_nodes: int,
    steps: int,
    lr: float,
    log: bool = True,
) -> List[Dict[str, float]]:
    """`steps` Adam steps on all nodes (full batch). Each rank's loss is its share of the global mean
    (DDP averages gradients over ranks, hence the factor world size). Returns per step: loss, acc
    (global), seconds, and the exchange's counters of the step (zero in one process)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    exchange = graph if isinstance(graph, HaloExchange) else None
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    records = []
    for step in range(1, steps + 1):
        if exchange is not None:
            exchange.reset_counters()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(data["x"], graph)
        loss_sum = F.cross_entropy(logits, data["y"], reduction="sum")
        (loss_sum * (world / num_nodes)).backward()
        opt.step()
        seconds = time.perf_counter() - start
        totals = torch.stack([loss_sum.detach().double(), (logits.argmax(1) == data["y"]).sum().double()])
        if world > 1:
            dist.all_reduce(totals)
        rec = {"step": step, "loss": float(totals[0]) / num_nodes, "acc": float(totals[1]) / num_nodes, "s": seconds}
        for key in ("seconds", "wait_seconds", "rows_sent", "rows_received", "bytes_sent", "bytes_received"):
            rec[key] = getattr(exchange, key) if exchange is not None else 0
        records.append(rec)
        if log:
            print(f"step {step:3d} | loss {rec['loss']:.7f} | acc {rec['acc']:.4f} | {seconds:.2f} s", flush=True)
    return records


def summary(records: List[Dict[str, float]]) -> Dict[str, float]:
    """Medians over the steps after the first (the first builds cached structure), or the only one."""
    timed = records[1:] if len(records) > 1 else records
    med = {k: statistics.median(r[k] for r in timed) for k in timed[0] if k not in ("step", "loss", "acc")}
    med["exchange_share"] = med["seconds"] / med["s"] if med["s"] else 0.0
    med["wait_share"] = med["wait_seconds"] / med["s"] if med["s"] else 0.0
    return med


def contiguous_ranges(n: int, world: int) -> List[int]:
    """world + 1 offsets: rank r owns ids ranges[r] .. ranges[r + 1] - 1 (equal counts)."""
    return [n * r // world for r in range(world + 1)]


def init_distributed() -> int:
    """Join the gloo group torchrun describes (WORLD_SIZE > 1); return the world size."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(minutes=30))
    return world


@dataclass
class Built:
    """What a rank trains on: its task rows, what the model attends over, its in-edge count and shard."""

    data: Dict[str, Tensor]
    graph: GraphArg
    edges: int
    shard: Optional[Shard] = None


def build(
    edge_index: Tensor, world: int, seed: int, *, ranges: Optional[Sequence[int]] = None, owner: Optional[Tensor] = None
) -> Built:
    """This rank's task data and what its model attends over, from its in-edges (2, E_own), global ids:
    the whole `Graph` in one process, else a timed `HaloExchange` on its `local_shard` (own group)."""
    if world == 1:
        n = int(ranges[-1]) if ranges is not None else int(owner.numel())  # type: ignore[union-attr]
        data = make_task(edge_index, torch.arange(n), seed)
        return Built(data, Graph(edge_index, num_src=n, num_dst=n), edge_index.shape[1])
    shard = local_shard(edge_index, ranges=ranges, owner=owner)
    data = make_task(edge_index, shard.nodes, seed)
    exchange = HaloExchange(shard, group=dist.new_group(backend="gloo"), timed=True)
    return Built(data, exchange, edge_index.shape[1], shard)


def make_model(world: int, seed: int, width: int, heads: int) -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights on every rank and in one process
    model = Net(width, heads)
    return nn.parallel.DistributedDataParallel(model) if world > 1 else model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2_000_000)
    parser.add_argument("--radius", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--small", action="store_true", help="4000 nodes, 2 steps: seconds")
    args = parser.parse_args()
    if args.small:
        args.nodes, args.steps = 4000, 2
    torch.set_num_threads(args.threads)
    world = init_distributed()
    rank = dist.get_rank() if world > 1 else 0
    ranges = contiguous_ranges(args.nodes, world)
    start = time.perf_counter()
    edges = window_in_edges(ranges[rank], ranges[rank + 1], args.nodes, args.radius)
    built = build(edges, world, args.seed, ranges=ranges)
    del edges
    model = make_model(world, args.seed, args.width, args.heads)
    setup_s = time.perf_counter() - start
    if rank == 0:
        total_edges = args.nodes * (2 * args.radius + 1) - args.radius * (args.radius + 1)
        print(
            f"window graph: {args.nodes} nodes, radius {args.radius}, {total_edges} edges | {world} process(es), "
            f"{args.threads} thread(s) each | width {args.width}, {args.heads} heads, {args.steps} steps",
            flush=True,
        )
    setup_peak = status_kib("VmHWM")
    reset_peak()
    records = train(model, built.data, built.graph, args.nodes, args.steps, args.lr, log=rank == 0)
    row: Dict[str, Any] = {
        "rank": rank,
        "edges": built.edges,
        "setup_s": setup_s,
        "setup_peak_mib": (setup_peak or 0) / 1024,
        "train_peak_mib": (status_kib("VmHWM") or 0) / 1024,
        **summary(records),
    }
    rows = [row]
    if world > 1:
        rows = [{} for _ in range(world)]
        dist.all_gather_object(rows, row)
    if rank == 0:
        print(f"final loss {records[-1]['loss']:.7f} | acc {records[-1]['acc']:.4f}")
        print_ranks(rows)
    if world > 1:
        del model  # DDP's reducer must not outlive the group it holds (see docs/guide/distributed.md)
        dist.destroy_process_group()


def print_ranks(rows: List[Dict[str, Any]]) -> None:
    """One line per rank: memory, median step, the exchange's traffic and share of the step."""
    print(
        f"{'rank':>4} {'edges':>10} {'setup_peak_MiB':>14} {'train_peak_MiB':>14} {'step_s':>7} "
        f"{'halo_rows_in':>12} {'rows_out':>9} {'MiB_in':>7} {'MiB_out':>7} {'exch_s':>7} {'wait_s':>7} {'exch%':>6}"
    )
    for r in rows:
        print(
            f"{r['rank']:>4} {r['edges']:>10} {r['setup_peak_mib']:>14.0f} {r['train_peak_mib']:>14.0f} {r['s']:>7.2f} "
            f"{r['rows_received']:>12.0f} {r['rows_sent']:>9.0f} {r['bytes_received'] / 2**20:>7.2f} "
            f"{r['bytes_sent'] / 2**20:>7.2f} {r['seconds']:>7.3f} {r['wait_seconds']:>7.3f} "
            f"{100 * r['exchange_share']:>5.1f}%"
        )
    print(
        "per step (median over steps after the first), forward + backward: halo rows received (k, v rows in "
        "forward, gradients of sent rows in backward) and sent; exch_s: time in all_to_all_single (transfer), "
        "wait_s: at the barrier before it (waiting for slower ranks); exch% = exch_s / step"
    )


if __name__ == "__main__":
    main()
