"""bench_kernels --stream: a stream of random graphs of varying size (in-degree 16), H=8, D=64, float32,
fwd+bwd on each, passed twice: the first pass pays what a new graph or shape costs (`auto` builds each
Graph's index, compiled PyG compiles), the second runs on what the first built. Contenders: `auto` on
Graphs made at the first pass and kept, PyG's recipe (peers.pyg_attention) eager, and the same under one
`torch.compile` (automatic dynamic shapes: the first graph compiles static, the next one dynamic)."""

from __future__ import annotations

import os
import random
import time
from typing import Callable, Dict, List

import torch

from sparseattn import edge_attention, graphs

from . import harness, peers
from .kernels_report import DEFAULT_SCALE, STREAM_CONTENDERS
from .peers import DIM, HEADS

CONTENDERS = STREAM_CONTENDERS


def stream_sizes(count: int, lo: int, hi: int, seed: int = 0) -> List[int]:
    """`count` node counts drawn uniformly from [lo, hi]."""
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(count)]


def _passes(name: str, edges: List[torch.Tensor], sizes: List[int]) -> Callable[[], float]:
    """A function that runs one pass of `name` over the stream (fwd+bwd on each graph) and returns seconds."""
    kept: Dict[int, graphs.Graph] = {}
    compiled = torch.compile(peers.pyg_attention) if name == "pyg (compiled)" else None

    def one(i: int) -> torch.Tensor:
        n, ei = sizes[i], edges[i]
        torch.manual_seed(i)
        q, k, v = ((torch.randn(n, HEADS, DIM) * DEFAULT_SCALE).requires_grad_() for _ in range(3))
        if name == "auto":
            g = kept.setdefault(i, graphs.Graph(ei, n, n))
            out = edge_attention(q, k, v, g)
        else:
            out = (compiled or peers.pyg_attention)(q, k, v, ei[0], ei[1], n)
        out.backward(torch.ones_like(out))
        return out

    def run() -> float:
        start = time.perf_counter()
        for i in range(len(sizes)):
            one(i)
        return time.perf_counter() - start

    return run


def run_stream(count: int, lo: int, hi: int, threads: int) -> List[dict]:
    """Rows {"contender", "pass", "s", "graphs", "nodes", "edges", "threads", "load_average"}: each contender's
    first and second pass over the same stream, first passes of all contenders before any second pass."""
    torch.set_num_threads(threads)
    sizes = stream_sizes(count, lo, hi)
    edges = [graphs.random(n, n, 16 * n, seed=i).edge_index for i, n in enumerate(sizes)]
    runs = {name: _passes(name, edges, sizes) for name in CONTENDERS}
    rows = []
    for pass_ in (1, 2):
        for name in CONTENDERS if pass_ == 1 else reversed(CONTENDERS):
            try:
                s, note = runs[name](), ""
            except Exception as exc:  # noqa: BLE001 (a missing compiler or PyG: a null with the reason)
                s, note = None, harness.failure(exc)
            rows.append({"contender": name, "pass": pass_, "s": s, "note": note, "graphs": count, "nodes": sum(sizes)})
            rows[-1].update(edges=16 * sum(sizes), threads=threads, load_average=os.getloadavg()[0])
    return rows
