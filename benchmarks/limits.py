"""The physical limit of one edge-attention call: the time the bytes that must move take at the
machine's measured copy bandwidth, or the flops that must run at its measured GEMM rate, whichever
is longer. bench_kernels reports, for every contender, limit_ms and the fraction limit_ms / ms.

Sizes in float32 elements, with Q = N_dst*H*D, K = N_src*H*D, V = N_src*H*Dv, O = N_dst*H*Dv and
S = N_dst*H (one per-destination statistic, e.g. the log-sum-exp the backward needs), and I the
index bytes: 8 * (E + N_dst + 1) for the int64 CSR a sparse graph is read through (its sources and
row pointers), 0 for a graph made only of dense blocks (block bounds, no per-edge index):

    bytes  fwd      = 4 * (Q + K + V + O) + I                       read q, k, v and the index; write out
           fwd+bwd  = 4 * (3Q + 3K + 3V + 3O + 2S) + 2I             forward, plus S written for the backward;
                                                                    backward reads q, k, v, out, grad_out, S
                                                                    and the index, writes grad_q/k/v
    flops  fwd      = 2 * E * H * (D + Dv)                          scores <k[s], q[t]>, then sum of w * v[s]
           fwd+bwd  = 6 * E * H * (D + Dv)                          + dP = grad_out . v, grad_v, grad_q,
                                                                    grad_k: twice the forward (a backward
                                                                    that recomputes the scores adds 2*E*H*D)

    limit_ms = max(bytes / copy bandwidth, flops / GEMM rate) * 1e3,   fraction = limit_ms / measured ms

A lower bound no real kernel reaches (each tensor moves once, exp is free, no (E, H) intermediate goes to
memory): it says how far a contender is from what the hardware allows. `measure_rates` measures the rates
in the process that times the contenders: copy bandwidth = 2 * bytes / time of a preallocated
`dst.copy_(src)` (read + write, as STREAM counts it), GEMM rate = 2 n^3 / time of an (n, n) float32 mm.
"""

from __future__ import annotations

from typing import Dict

import torch

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
