"""GPU probe for the dense backend's clamp-mode path (needs CUDA; not part of the test run).

    python -m benchmarks.probe_dense_blocks_gpu            # fused vs materialized vs SDPA, bf16 and fp16
    python -m benchmarks.probe_dense_blocks_gpu --sweep    # and a tile sweep of the fused kernel

For batches of equal complete or causal blocks (H=8, D=64) it times `edge_attention(...,
backend="auto")` in clamp mode, forward and forward+backward (CUDA events, median of 20 after 3
warm-up runs), three ways: as shipped (`triton_blocks`, the fused kernel), with the fused kernel
switched off (`dense.FUSED_CLAMP_DTYPES = ()`: the materialized batched-matmul path), and exact
SDPA on the same blocks as the floor. `--sweep` times the fused kernel under other tile settings
(`triton_blocks._tiles` replaced) on three shapes, and the shipped tiles at D = 32, 128, 256.
The tables print to stdout; the runs behind the shipped settings are in benchmarks/results/
(`probe_dense_blocks_gpu_*.log`).
"""

from __future__ import annotations

import argparse
import functools
from typing import Callable, Tuple
from unittest import mock

import torch
import torch.nn.functional as F

from sparseattn import edge_attention, graphs
from sparseattn.kernels import triton_blocks as tb
from sparseattn.kernels.dense import dispatch as dense

CLAMP = (-5.0, 5.0)
SHAPES = [("full", 16, 512), ("full", 4, 2048), ("full", 32, 128), ("causal", 32, 128), ("causal", 8, 512)]
TILES = [(64, 64, 4, None), (128, 64, 4, None), (128, 64, 8, None), (64, 32, 4, None), (128, 128, 8, None)]
TILES += [(64, 64, 4, 3), (128, 64, 8, 3)]  # BLOCK_M, BLOCK_N, num_warps, num_stages (None: Triton's default)


def median_ms(fn: Callable[[], object], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def fwd_and_bwd(fn: Callable[[], torch.Tensor]) -> Tuple[float, float]:
    return median_ms(fn), median_ms(lambda: fn().float().sum().backward())


def fused_and_materialized(g, q, k, v) -> Tuple[Tuple[float, float], Tuple[float, float]]:
    """`auto` in clamp mode, fwd and fwd+bwd ms, as shipped and with the fused kernel switched off
    (`dense.FUSED_CLAMP_DTYPES = ()`: the materialized batched-matmul path)."""
    auto = lambda: edge_attention(q, k, v, g, clamp=CLAMP, backend="auto")  # noqa: E731
    fused = fwd_and_bwd(auto)
    with mock.patch.object(dense, "FUSED_CLAMP_DTYPES", ()):
        return fused, fwd_and_bwd(auto)


def inputs(kind: str, b: int, length: int, heads: int, d: int, dtype: torch.dtype):
    g = graphs.from_blocks([(kind, length, length)] * b, device="cuda")
    q, k, v = (torch.randn(b * length, heads, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    return g, q, k, v


def compare(dtype: torch.dtype) -> None:
    for kind, b, length in SHAPES:
        g, q, k, v = inputs(kind, b, length, 8, 64, dtype)
        fused, mat = fused_and_materialized(g, q, k, v)
        qb, kb, vb = (t.detach().view(b, length, 8, 64).transpose(1, 2).requires_grad_() for t in (q, k, v))
        floor = fwd_and_bwd(functools.partial(F.scaled_dot_product_attention, qb, kb, vb, is_causal=kind == "causal"))
        print(
            f"{str(dtype)[6:]:9s} {kind:6s} {b:3d}x{length:<5d} fused {fused[0]:7.3f} / {fused[1]:7.3f}  "
            f"materialized {mat[0]:7.3f} / {mat[1]:7.3f}  sdpa (exact) {floor[0]:7.3f} / {floor[1]:7.3f} ms",
            flush=True,
        )


def sweep() -> None:
    print("\ntile sweep (bf16, H=8, D=64): fwd / fwd+bwd ms")
    for bm, bn, warps, stages in TILES:
        setting = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, **({"num_stages": stages} if stages else {}))
        cells = []
        with mock.patch.object(tb, "_tiles", lambda d, dv, s=setting: s):
            for kind, b, length in [("full", 16, 512), ("full", 4, 2048), ("causal", 8, 512)]:
                g, q, k, v = inputs(kind, b, length, 8, 64, torch.bfloat16)
                f, fb = fwd_and_bwd(lambda g=g, q=q, k=k, v=v: edge_attention(q, k, v, g, clamp=CLAMP, backend="auto"))
                cells.append(f"{kind} {b}x{length}: {f:.3f}/{fb:.3f}")
        print(f"  BLOCK_M {bm:3d} BLOCK_N {bn:3d} warps {warps} stages {stages}: " + "; ".join(cells), flush=True)
    for d in (32, 128, 256):
        fused, mat = fused_and_materialized(*inputs("full", 8, 512, 4, d, torch.bfloat16))
        print(f"H=4 D={d} full 8x512 bf16: fused {fused[0]:.3f}/{fused[1]:.3f} materialized {mat[0]:.3f}/{mat[1]:.3f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also sweep the fused kernel's tiles")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_dense_blocks_gpu needs a CUDA device")
    print(f"torch {torch.__version__} | {torch.cuda.get_device_name(0)} | shipped tiles at D=64: {tb._tiles(64, 64)}")
    for dtype in (torch.bfloat16, torch.float16):
        compare(dtype)
    if args.sweep:
        sweep()


if __name__ == "__main__":
    main()
