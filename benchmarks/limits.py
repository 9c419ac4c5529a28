"""The physical limit of one edge-attention call: the time the bytes that must move take at the
machine's measured copy bandwidth, or the flops that must run at its measured GEMM rate, whichever
is longer; bench_kernels reports limit_ms and limit_ms / ms per contender. The byte and flop
formulas, and how the rates are measured: docs/benchmarks/kernels.md ("Physical limit").

The gather floor (`gather_floor`): the time to read every k and every v row once in the graph's edge
order (destination-major, as the CSR walks it), summed per destination by `embedding_bag`, the fastest of
two layouts: interleaved ((N_src, H*D) rows, one row per edge) and head-major (H tables of (N_src, D),
one pass per head). A forward that gathers k and v once per edge cannot beat it."""

from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F

from sparseattn import graphs

from . import harness


def must_move(g: graphs.Graph, heads: int, dim: int, dim_v: int) -> Dict[str, Dict[str, float]]:
    """{"bytes": {"fwd": .., "fwd+bwd": ..}, "flops": {...}}: what one call on `g` must move and
    compute, float32 (formulas in the module docstring)."""
    q, kv = g.num_dst * heads * dim, g.num_src * heads * (dim + dim_v)
    o, s = g.num_dst * heads * dim_v, g.num_dst * heads
    blocks_only = bool(g.blocks) and sum(b.num_edges for b in g.blocks) == g.num_edges
    index = 0 if blocks_only else 8 * (g.num_edges + g.num_dst + 1)
    fwd_flops = 2 * g.num_edges * heads * (dim + dim_v)
    return {
        "bytes": {"fwd": 4 * (q + kv + o) + index, "fwd+bwd": 4 * (3 * (q + kv + o) + 2 * s) + 2 * index},
        "flops": {"fwd": fwd_flops, "fwd+bwd": 3 * fwd_flops},
    }


def limit_ms(bytes_: float, flops: float, copy_gb_per_s: float, gemm_gflop_per_s: float) -> float:
    """max(bytes / bandwidth, flops / GEMM rate), in ms."""
    return max(bytes_ / (copy_gb_per_s * 1e9), flops / (gemm_gflop_per_s * 1e9)) * 1e3


def measure_rates(copy_mib: int = 256, gemm_n: int = 2048, reps: int = 9) -> Dict[str, float]:
    """This process's copy bandwidth (GB/s) and float32 GEMM rate (GFLOP/s), each the median of its runs
    after warm-up, at its current thread setting, with the sizes used."""
    src = torch.ones(copy_mib * 2**20 // 4)
    dst = torch.zeros_like(src)  # written once here, so its pages are in before the timed copies
    a, b, c = torch.randn(gemm_n, gemm_n), torch.randn(gemm_n, gemm_n), torch.empty(gemm_n, gemm_n)
    copy_ms, gemm_ms = (
        harness.median(harness.time_ms(fn, warmup=2, reps=n, budget_s=float("inf")))
        for fn, n in ((lambda: dst.copy_(src), reps), (lambda: torch.mm(a, b, out=c), max(3, reps // 2)))
    )
    return {
        "copy_gb_per_s": 2 * copy_mib * 2**20 / copy_ms / 1e6,
        "gemm_gflop_per_s": 2 * gemm_n**3 / gemm_ms / 1e6,
        "copy_mib": copy_mib,
        "gemm_n": gemm_n,
    }


def gather_floor(g: graphs.Graph, heads: int, dim: int, reps: int = 5, budget_s: float = 10.0) -> Dict[str, float]:
    """ms (median of `reps` after warm-up) to sum k and v rows (each (N_src, heads, dim), float32) per
    destination over the graph's edges in CSR order by `F.embedding_bag`: "interleaved" ((N_src, H*D)
    tables), "head_major" (H tables of (N_src, D) each), and "floor", the smaller; at this process's
    thread setting."""
    ptr, idx, _ = g.csr()
    offsets = ptr[:-1]
    k, v = (torch.randn(g.num_src, heads, dim) for _ in range(2))
    kh, vh = (x.transpose(0, 1).contiguous() for x in (k, v))  # (H, N_src, D)

    def interleaved() -> None:
        for x in (k, v):
            F.embedding_bag(idx, x.view(g.num_src, -1), offsets, mode="sum")

    def head_major() -> None:
        for x in (kh, vh):
            for h in range(heads):
                F.embedding_bag(idx, x[h], offsets, mode="sum")

    times = harness.time_interleaved([interleaved, head_major], warmup=1, reps=reps, budget_s=budget_s)
    out = {name: harness.median(t) for name, t in zip(("interleaved", "head_major"), times) if isinstance(t, list)}
    out["floor"] = min(out.values())
    return out
