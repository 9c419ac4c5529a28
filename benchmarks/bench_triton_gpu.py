"""GPU benchmark of the triton backend against the issue's targets (standalone; needs CUDA).

    python benchmarks/bench_triton_gpu.py            # all four cases, JSON into benchmarks/results/
    python benchmarks/bench_triton_gpu.py --quick    # 1/16 sizes, a smoke run

Cases (H=8, D=64, bfloat16, median of --rep timed runs after --warmup, CUDA events):
  random   N=1M nodes, mean in-degree 16: forward GB/s against the measured device copy bandwidth
           (bytes = q, k and v rows per edge + the output rows, as the issue counts them) and
           edges/s; forward+backward against a PyG-style gather/softmax/scatter in plain torch.
           Target: forward >= 50% of the roofline, forward+backward >= 3x faster than PyG-style.
  window   L=65536, radius 64, exact softmax, against FlexAttention with its block mask.
           Target: at least FlexAttention's speed.
  complete 16 sequences of 512 tokens (a batch of complete graphs) against SDPA on the padded
           (B, H, L, D) batch; "auto" is timed too. Target: auto within 1.3x of SDPA.
Before timing, the triton output is checked against the reference backend on the first 4096
destinations and every other contender against the triton output (max |err|). A missing
peer or an out-of-memory becomes a null row with its reason. Without CUDA it prints "no CUDA device"
and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from sparseattn import __version__, edge_attention, graphs  # noqa: E402

H, D = 8, 64
DTYPE = torch.bfloat16
DEVICE = "cuda"


def bench(fn, warmup, rep):
    """Median milliseconds of fn() over `rep` runs after `warmup`, and the peak extra MiB."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20


def copy_bandwidth_gbs(rep=20):
    """Device copy bandwidth (read + write) of a 1 GiB buffer: the memory roofline."""
    x = torch.empty(2**29, dtype=torch.int16, device=DEVICE)
    y = torch.empty_like(x)
    ms, _ = bench(lambda: y.copy_(x), 3, rep)
    return 2 * x.numel() * x.element_size() / ms / 1e6


def qkv(n_dst, n_src, requires_grad):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    return [torch.randn(n, H, D, device=DEVICE, dtype=DTYPE, generator=gen).requires_grad_(requires_grad)
            for n in (n_dst, n_src, n_src)]


def pyg_style(q, k, v, g):
    """PyG's recipe (TransformerConv: gather, `softmax` by scatter max and sum, scatter-add) in torch,
    gathers and products in the input dtype, the softmax in float32."""
    src, dst = g.src, g.dst
    score = (q[dst] * k[src]).sum(-1).float() * D ** -0.5  # (E, H)
    m = torch.full((g.num_dst, H), float("-inf"), device=q.device).scatter_reduce(
        0, dst[:, None].expand_as(score), score.detach(), "amax", include_self=True)
    w = torch.exp(score - m[dst])
    z = torch.zeros(g.num_dst, H, device=q.device).index_add_(0, dst, w)
    p = w / z[dst].clamp_min(1e-30)
    return torch.zeros_like(q).index_add_(0, dst, p.to(q.dtype)[..., None] * v[src])  # (N_dst, H, D)


def flex_window(L, radius):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= radius

    block_mask = create_block_mask(mask_mod, 1, 1, L, L, device=DEVICE)
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                    block_mask=block_mask)[0].transpose(0, 1)


def sdpa_batch(B, L):
    import torch.nn.functional as F

    def run(q, k, v):  # (B*L, H, D) -> (B, H, L, D) -> back
        qb, kb, vb = (t.view(B, L, H, D).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(qb, kb, vb).transpose(1, 2).reshape(B * L, H, D)
    return run


def triton_output(q, k, v, g):
    """The triton backend's output, with its error against the reference backend on the first 4096
    destinations (the reference gathers (E, H, D) tensors, so it runs on that subgraph only)."""
    try:
        with torch.no_grad():
            out = edge_attention(q, k, v, g, clamp=None, backend="triton")
            sub = g.dst_subgraph(torch.arange(g.num_dst, device=DEVICE) < 4096)
            ref = edge_attention(q, k, v, sub, clamp=None, backend="reference")
        return out, (out[:4096].float() - ref[:4096].float()).abs().max().item()
    except Exception as e:
        print(f"triton failed: {type(e).__name__}: {e}")
        return None, None


def ratio(rows, a, b, key):
    """rows[a][key] / rows[b][key] by contender name, or None if either is missing."""
    by = {r["contender"]: r.get(key) for r in rows}
    return by[a] / by[b] if by.get(a) and by.get(b) else None


def measure(name, fn, inputs, ref, args, backward):
    """One row: check fn against ref, then time forward (and forward+backward)."""
    row = dict(contender=name, ms_fwd=None, ms_fwd_bwd=None, peak_extra_mib=None, max_err=None, note="")
    try:
        with torch.no_grad():
            out = fn(*inputs)
            row["max_err"] = None if ref is None else (out.float() - ref.float()).abs().max().item()
            del out
        with torch.no_grad():
            row["ms_fwd"], row["peak_extra_mib"] = bench(lambda: fn(*inputs), args.warmup, args.rep)
        if backward:
            grad = torch.randn(inputs[0].shape[0], H, D, device=DEVICE, dtype=DTYPE)

            def step():
                for t in inputs:
                    t.grad = None
                fn(*inputs).backward(grad)
            row["ms_fwd_bwd"], mib = bench(step, args.warmup, args.rep)
            row["peak_extra_mib"] = max(row["peak_extra_mib"], mib)
    except ImportError as e:
        row["note"] = f"skipped: {e}"
    except torch.cuda.OutOfMemoryError:
        row["note"] = "out of memory"
    except Exception as e:  # a failing contender is reported, not fatal
        row["note"] = f"failed: {type(e).__name__}: {str(e)[:120]}"
    torch.cuda.empty_cache()
    return row


def case_random(args, roofline):
    n = 2**20 // args.shrink
    g = graphs.random(n, n, 16 * n, seed=0, device=DEVICE)
    q, k, v = qkv(n, n, True)
    g.csr(), g.csc()  # built once per graph, as a model's layers share them

    def triton(q, k, v):
        return edge_attention(q, k, v, g, clamp=None, backend="triton")
    ref, err = triton_output(q, k, v, g)
    rows = [measure("triton", triton, (q, k, v), ref, args, True),
            measure("pyg-style", lambda q, k, v: pyg_style(q, k, v, g), (q, k, v), ref, args, True)]
    rows[0]["max_err"] = err
    moved = g.num_edges * H * 3 * D * q.element_size() + n * H * D * q.element_size()
    for row in rows:
        if row["ms_fwd"]:
            row["gb_s"] = moved / row["ms_fwd"] / 1e6
            row["roofline_frac"] = row["gb_s"] / roofline
            row["edges_per_s"] = g.num_edges / row["ms_fwd"] * 1e3
    targets = {"triton fwd / roofline (>= 0.5)": rows[0].get("roofline_frac"),
               "pyg-style / triton fwd+bwd time (>= 3)": ratio(rows, "pyg-style", "triton", "ms_fwd_bwd")}
    return dict(case=f"random N={n}, mean in-degree 16, E={g.num_edges}", rows=rows, targets=targets)


def case_window(args):
    L, radius = 65536 // args.shrink, 64
    g = graphs.window(L, radius, device=DEVICE)
    q, k, v = qkv(L, L, True)

    def triton(q, k, v):
        return edge_attention(q, k, v, g, clamp=None, backend="triton")
    ref, err = triton_output(q, k, v, g)
    rows = [measure("triton", triton, (q, k, v), ref, args, True)]
    rows[0]["max_err"] = err
    try:
        rows.append(measure("flex_attention", flex_window(L, radius), (q, k, v), ref, args, True))
    except Exception as e:
        rows.append(dict(contender="flex_attention", ms_fwd=None, ms_fwd_bwd=None, note=f"skipped: {e}"))
    targets = {f"triton / flex_attention {what} time (<= 1)": ratio(rows, "triton", "flex_attention", key)
               for what, key in (("fwd", "ms_fwd"), ("fwd+bwd", "ms_fwd_bwd"))}
    return dict(case=f"window L={L}, r={radius}, E={g.num_edges}", rows=rows, targets=targets)


def case_complete(args):
    B, L = 16, 512 // max(1, args.shrink // 4)
    g = graphs.from_blocks([("full", L, L)] * B, device=DEVICE)
    q, k, v = qkv(B * L, B * L, True)
    sdpa = sdpa_batch(B, L)
    ref = sdpa(q, k, v).detach()
    rows = [measure("sdpa", sdpa, (q, k, v), ref, args, True)]
    for backend in ("triton", "auto"):
        rows.append(measure(backend, lambda q, k, v, b=backend: edge_attention(q, k, v, g, clamp=None, backend=b),
                            (q, k, v), ref, args, True))
    targets = {"auto / sdpa fwd+bwd time (<= 1.3)": ratio(rows, "auto", "sdpa", "ms_fwd_bwd"),
               "triton / sdpa fwd+bwd time": ratio(rows, "triton", "sdpa", "ms_fwd_bwd")}
    return dict(case=f"batched complete B={B}, L={L}, E={g.num_edges}", rows=rows, targets=targets)


def _fmt(row, key, spec):
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return format(row[key], spec) if row.get(key) is not None else "-".rjust(width)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/16 of the sizes")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rep", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the triton GPU benchmark needs one; nothing to do")
        return 0
    args.shrink = 16 if args.quick else 1
    device = torch.cuda.get_device_name()
    roofline = copy_bandwidth_gbs()
    header = (f"sparseattn {__version__} | torch {torch.__version__} | {device} | copy bandwidth {roofline:.0f} GB/s"
              f" | {platform.node()} | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(header)
    print(f"H={H}, D={D}, {str(DTYPE)[6:]}, median of {args.rep} after {args.warmup} warmup")
    results = []
    for case in (lambda: case_random(args, roofline), lambda: case_window(args), lambda: case_complete(args)):
        res = case()
        results.append(res)
        print(f"\n{res['case']}")
        print(f"{'contender':16}{'fwd ms':>10}{'fwd+bwd ms':>12}{'GB/s':>8}{'roofline':>10}{'peak MiB':>10}{'max|err|':>10}  note")
        for r in res["rows"]:
            print(f"{r['contender']:16}{_fmt(r, 'ms_fwd', '10.3f')}{_fmt(r, 'ms_fwd_bwd', '12.3f')}"
                  f"{_fmt(r, 'gb_s', '8.0f')}{_fmt(r, 'roofline_frac', '10.0%')}{_fmt(r, 'peak_extra_mib', '10.0f')}"
                  f"{_fmt(r, 'max_err', '10.2g')}  {r.get('note', '')}")
        for name, value in res["targets"].items():
            print(f"  {name}: {'-' if value is None else format(value, '.2f')}")
    os.makedirs(args.out, exist_ok=True)
    name = "".join(c if c.isalnum() else "_" for c in device).strip("_")
    path = os.path.join(args.out, f"bench_triton_gpu_{name}{'_quick' if args.quick else ''}.json")
    with open(path, "w") as f:
        json.dump(dict(header=header, device=device, copy_gb_s=roofline, results=results), f, indent=1)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
