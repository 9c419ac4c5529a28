"""The triton backend against its peers on the graphs of issues 16 and 30 (a GPU; --smoke checks the script on CPU).

    python benchmarks/bench_triton_gpu.py --out $OUT --budget 400             # the table, both clamp modes
    python benchmarks/bench_triton_gpu.py --cases random,window8 --contenders triton,pyg --no-backward
    python benchmarks/bench_triton_gpu.py --cases random --contenders triton --dtype float32 --out $OUT
    python benchmarks/bench_triton_gpu.py --cases random --contenders triton --dtype float32 --float32-scores wide
    python benchmarks/bench_triton_gpu.py --sweep --cases random,window8 --out $OUT  # forward layouts x tiles
    python benchmarks/bench_triton_gpu.py --sweep-backward --cases random,window8 --modes clamp --out $OUT
    python benchmarks/bench_triton_gpu.py --smoke --contenders csr,reference,pyg --out /tmp/b  # tiny, CPU

Cases, contenders and the tables: docs/benchmarks/triton_gpu.md. An output (computed in NaN-poisoned
memory) off the float32 reference by more than TOL is marked WRONG, not timed, and the exit status is 1.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from benchmarks import harness, peers  # noqa: E402
from benchmarks.families import powerlaw_edges  # noqa: E402
from sparseattn import Graph, edge_attention, graphs  # noqa: E402

H, D = 8, 64
SCALE = D**-0.5
CLAMPS = {"clamp": (-5.0, 5.0), "exact": None}
TOL = {torch.bfloat16: 4e-2, torch.float16: 1e-2, torch.float32: 1e-4}  # |out - ref| <= TOL (1 + |ref|)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PEAK_GBS = [("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350), ("A100-SXM4-80GB", 2039)]
PEAK_GBS += [("A100", 1555)]  # datasheet HBM GB/s, by the first substring of the device name that matches
SWEEP_BACKWARD = {  # the two backward kernels' layouts and launch settings (backward_config)
    "tile": dict(BLOCK_E=(4, 8, 16, 32), num_warps=(1, 2, 4), num_stages=(None,)),
    "heads": dict(BLOCK_E=(2, 4, 8, 16), num_warps=(2, 4, 8), num_stages=(1, 2)),
}
SWEEP = {
    "tile": dict(BLOCK_E=(16, 32, 64), num_warps=(2, 4, 8), num_stages=(None,)),
    "lanes": dict(BLOCK_E=(8, 16, 32), num_warps=(2, 4), num_stages=(1, 2, 3)),
    "heads": dict(BLOCK_E=(4, 8, 16), num_warps=(4, 8), num_stages=(1, 2)),
}


def complete(size, device) -> Graph:  # size = (B, L): B complete graphs of L tokens
    return graphs.from_blocks([("full", size[1], size[1])] * size[0], device=device)


CASES = {  # name: (graph builder (size, device) -> Graph, size on a GPU, size in --smoke)
    "random": (lambda n, dev: graphs.random(n, n, 16 * n, device=dev), 2**20, 64),
    "powerlaw": (lambda n, dev: Graph(powerlaw_edges(n, 16, 0.0, 2 / 3, device=dev), n, n), 2**20, 64),
    "window8": (lambda n, dev: graphs.window(n, 8, device=dev), 2**16, 64),
    "window64": (lambda n, dev: graphs.window(n, 64, device=dev), 2**16, 160),
    "complete512": (complete, (16, 512), (2, 32)),
    "complete2048": (complete, (4, 2048), (1, 96)),
}


def moved_bytes(num_dst: int, num_src: int, num_edges: int, heads: int, dim: int, elem: int) -> Tuple[int, int]:
    """The bytes (fwd, bwd) must move at least, D = Dv = dim, elem bytes per value. Forward: q, out per
    destination, k, v and the int64 index per edge. Backward: a dq pass (q, out, grad_out, dq per destination,
    k, v, index per edge) and a dk/dv pass (k, v, dk, dv per source, q, grad_out, float32 lse and delta per edge)."""
    fwd = (num_dst + num_edges) * heads * 2 * dim * elem + 8 * num_edges
    dq_pass = num_dst * heads * 4 * dim * elem + num_edges * heads * 2 * dim * elem + 8 * num_edges
    dkdv_pass = (num_src * heads * 4 * dim + num_edges * heads * 2 * dim) * elem + 8 * num_edges * heads + 8 * num_edges
    return fwd, dq_pass + dkdv_pass


class Skip(Exception):
    """The contender does not apply to this case; the message says why."""


@dataclass
class Row(harness.Result):
    """A harness.Result with the rates of both passes: a "fwd" row's gb_per_s and fraction of the peak, a
    "fwd+bwd" row's backward (bwd_ms = its ms - the fwd row's ms) rate and fraction (gb_per_s None)."""

    fwd_bytes: Optional[int] = None
    fwd_peak_fraction: Optional[float] = None
    bwd_bytes: Optional[int] = None
    bwd_ms: Optional[float] = None
    bwd_gb_per_s: Optional[float] = None
    bwd_peak_fraction: Optional[float] = None


@dataclass
class Run:
    fn: Callable[[], torch.Tensor]  # () -> out (N_dst, H, Dv), from the inputs it closes over
    detail: str = ""
    poison: bool = True  # False where outputs are not allocated by torch.empty (compiled code)
    backward: bool = True  # False: forward only


def make_backend(name, backward=None, **settings):
    """A sparseattn backend; for triton, optionally with `forward_config` and `backward_config` (a dict) forced."""

    def make(g, clamp, q, k, v):
        from sparseattn.kernels import choose_auto

        if name == "auto" and choose_auto(q, g) == "triton":
            raise Skip("auto picks triton here")
        if settings or backward:
            from sparseattn.kernels.triton import backward_config, forward_config

        def fn():
            with contextlib.ExitStack() as stack:
                if settings:
                    stack.enter_context(forward_config(**settings))
                if backward:  # in force when the forward runs, so its backward uses them
                    stack.enter_context(backward_config(**backward))
                return edge_attention(q, k, v, g, scale=SCALE, clamp=clamp, backend=name)

        return Run(fn)

    return make


def pyg(g, clamp, q, k, v):
    try:
        fn, _, label = peers.make_pyg(g, q, k, v, clamp)
    except ImportError as e:
        raise Skip(f"torch_geometric is not importable ({e})") from None
    return Run(fn, label)


def pyg_compiled(g, clamp, q, k, v):
    """make_pyg's recipe under torch.compile (static shapes); its compile, the first fwd+bwd, timed apart."""
    fn = torch.compile(pyg(g, clamp, q, k, v).fn, dynamic=False)
    t = time.perf_counter()
    fn().float().sum().backward()
    torch.cuda.synchronize() if q.is_cuda else None
    for x in (q, k, v):
        x.grad = None
    return Run(fn, f"torch.compile; first fwd+bwd (compile) {time.perf_counter() - t:.1f} s", poison=False)


def sdpa(g, clamp, q, k, v):
    if clamp is not None:
        raise Skip("SDPA computes the exact softmax only")
    try:
        fn = peers.make_sdpa_exact(g, q, k, v)
    except ValueError as e:
        raise Skip(str(e)) from None
    return Run(fn, "SDPA kernel: " + peers.sdpa_kernel_name(fn))


def make_flex(g, clamp, q, k, v):
    """peers.make_flex: compiled on a GPU, eager on CPU (dense math, forward only)."""
    torch._dynamo.config.recompile_limit = 64  # one compile per case and mode; not eager after the 8th
    if not q.is_cuda:  # FlexAttention has no backward on CPU, nor a forward for inputs that require grad
        q, k, v = (x.detach() for x in (q, k, v))
    try:
        fn, detail = peers.make_flex(g, q, k, v, clamp, compiled=q.is_cuda, scale=SCALE)
    except ValueError as e:
        raise Skip(str(e)) from None
    return Run(fn, detail, poison=False, backward=q.is_cuda)


def local_tiles(tiles: str, **constants):
    """The local backend with kernel_options local_tiles=`tiles` ("torch" or "triton"), and for the
    Triton tiles other launch constants (`local.triton_tiles` BLOCK_N, TILE_ROWS) for the call."""

    def make(g, clamp, q, k, v):
        def fn():
            with contextlib.ExitStack() as stack:
                if constants:
                    from sparseattn.kernels.local import triton_tiles

                    stack.enter_context(mock.patch.multiple(triton_tiles, **constants))
                options = {"local_tiles": tiles}
                return edge_attention(q, k, v, g, scale=SCALE, clamp=clamp, backend="local", kernel_options=options)

        return Run(fn)

    return make


CONTENDERS = {name: make_backend(name) for name in ("triton", "csr", "reference", "auto")}
CONTENDERS.update({"local-torch": local_tiles("torch"), "local-triton": local_tiles("triton")})
CONTENDERS.update({f"local-triton-n{n}": local_tiles("triton", BLOCK_N=n) for n in (16, 64)})
CONTENDERS.update({f"local-triton-t{t}": local_tiles("triton", TILE_ROWS=t) for t in (32, 64)})
CONTENDERS["triton-tile-bwd"] = make_backend("triton", backward=dict(layout="tile"))  # the backward's other layout
CONTENDERS.update(pyg=pyg, **{"pyg-compiled": pyg_compiled}, flex=make_flex, sdpa=sdpa)


def sweep_contenders(backward: bool) -> dict:
    """The default triton, then every SWEEP ("lanes E16 w2 s3") or SWEEP_BACKWARD ("bwd heads E4 w4 s2") setting."""
    out = {"triton": make_backend("triton")}
    for layout, axes in (SWEEP_BACKWARD if backward else SWEEP).items():
        for values in itertools.product(*axes.values()):
            cfg = dict(zip(axes, values))
            name = "bwd " * backward + f"{layout} E{cfg['BLOCK_E']} w{cfg['num_warps']} s{cfg['num_stages']}"
            settings = {"backward": dict(layout=layout, **cfg)} if backward else dict(layout=layout, **cfg)
            out[name] = make_backend("triton", **settings)
    return out


@contextlib.contextmanager
def poisoned_memory():
    """Inside, torch.empty and its kin return NaN-filled memory (deterministic mode, warnings only)."""
    state = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(state[0], warn_only=state[1])
        torch.utils.deterministic.fill_uninitialized_memory = fill


def reference_output(q, k, v, g: Graph, clamp, chunk_edges: int = 2**20) -> torch.Tensor:
    """The float32 reference backend's (N_dst, H, Dv) output, over destination ranges a..b-1 of about
    chunk_edges in-edges each (it gathers (E, H, D) tensors), each a graph over only the sources it reads."""
    ptr, idx, _ = g.csr()
    starts = ptr.cpu()
    chunks, a = [], 0
    while a < g.num_dst:
        b = min(g.num_dst, max(a + 1, int(torch.searchsorted(starts, starts[a] + chunk_edges, right=True)) - 1))
        src, local = torch.unique(idx[int(starts[a]) : int(starts[b])], return_inverse=True)  # (S,), (E_ab,)
        dst = torch.repeat_interleave(torch.arange(b - a, device=q.device), ptr[a + 1 : b + 1] - ptr[a:b])
        sub = Graph(torch.stack([local, dst]), len(src), b - a)
        q32, k32, v32 = q[a:b].detach().float(), k.detach()[src].float(), v.detach()[src].float()  # k, v: (S, H, D)
        chunks.append(edge_attention(q32, k32, v32, sub, scale=SCALE, clamp=clamp, backend="reference"))
        a = b
    return torch.cat(chunks)


def compare(out: torch.Tensor, ref: torch.Tensor, tol: float) -> Tuple[float, int]:
    """out, ref (n, H, Dv): max |out - ref| (inf for NaN) and the number of rows off by more than tol (1 + |ref|)."""
    err = (out.detach().float() - ref).abs()
    bad = int((~(err <= tol * (1 + ref.abs()))).flatten(1).any(1).sum())  # NaN counts as bad
    return (err.nan_to_num(float("inf")).max().item() if err.numel() else 0.0), bad


def measure(name, make, case, mode, g, inputs, check, args, device, warmup: int) -> Tuple[List[Row], bool]:
    """The rows (fwd, fwd+bwd) of one contender: its output checked (check: out -> (max |err|, bad rows)),
    then timed after `warmup` runs, with their peak memory. Returns the rows and whether the output was wrong."""
    dtype = inputs[0].dtype
    rows = [Row(case, g.num_edges, name, f"{p} {mode}") for p in ("fwd", "fwd+bwd")[: 2 - args.no_backward]]
    stage = rows[0]

    def timed(stage: Row, fn: Callable) -> None:  # its times, and on CUDA its peak extra MiB
        stage.times_ms = harness.time_ms(fn, device, warmup, args.rep, budget_s=args.contender_s)
        stage.ms = harness.median(stage.times_ms)
        for t in inputs:  # the last step's gradients would count as live before the measured one
            t.grad = None
        stage.peak_extra_mib = harness.peak_extra_mib(fn, device) if device == "cuda" else None

    try:
        run = make(g, CLAMPS[mode], *inputs)
        with poisoned_memory() if run.poison else contextlib.nullcontext():
            out = run.fn().detach()  # (N_dst, H, Dv)
        stage.max_err_vs_reference, bad = check(out)
        stage.note = run.detail
        del out
        if bad:
            stage.note = f"WRONG: {bad} of {g.num_dst} destinations off by more than {TOL[dtype]:g} (1 + |ref|)"
            return rows[:1], True
        timed(stage, run.fn)
        if len(rows) > 1 and not run.backward:
            rows[1].note = "skipped: no backward here"
        elif len(rows) > 1:
            stage = rows[1]
            grad = torch.randn(g.num_dst, inputs[0].shape[1], inputs[2].shape[2], dtype=dtype, device=device)
            timed(stage, harness.timed_pass(run.fn, "fwd+bwd", inputs, grad))
    except Skip as e:
        rows = rows[:1]
        rows[0].note = f"skipped: {e}"
    except torch.cuda.OutOfMemoryError:
        stage.note = "out of memory"
    except Exception as e:  # a failing contender is a result, not a crash
        stage.note = harness.failure(e)
    for t in inputs:
        t.grad = None
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows, False


def set_rates(rows: List[Row], g: Graph, inputs: Sequence[torch.Tensor], peak: Optional[float]) -> None:
    """Fill in a contender's bytes, GB/s and fractions of peak (`moved_bytes`) from its rows' times."""
    q = inputs[0]
    fwd_bytes, bwd_bytes = moved_bytes(g.num_dst, g.num_src, g.num_edges, q.shape[1], q.shape[2], q.element_size())
    fwd = rows[0]
    fwd.fwd_bytes = fwd_bytes
    if fwd.ms is not None:
        fwd.gb_per_s = fwd_bytes / fwd.ms / 1e6
        fwd.fwd_peak_fraction = fwd.gb_per_s / peak if peak else None
    for both in rows[1:]:
        both.bwd_bytes = bwd_bytes
        if both.ms is not None and fwd.ms is not None:
            both.bwd_ms = both.ms - fwd.ms
            if both.bwd_ms > 0:  # the difference of two medians: noise can make it <= 0 on tiny cases
                both.bwd_gb_per_s = bwd_bytes / both.bwd_ms / 1e6
                both.bwd_peak_fraction = both.bwd_gb_per_s / peak if peak else None


def machine(args, device) -> dict:
    """harness.machine_info with the device's peak and measured copy bandwidth, and a header."""
    info = harness.machine_info(device)
    info["peak_gb_s"], info["copy_gb_s"], extra = args.peak_gbs, None, ""
    if device == "cuda":
        name = torch.cuda.get_device_name()
        info["peak_gb_s"] = info["peak_gb_s"] or next((gbs for key, gbs in PEAK_GBS if key in name), None)
        x = torch.empty(2**29, dtype=torch.int16, device=device)  # 1 GiB, copied: read + write
        y = torch.empty_like(x)
        info["copy_gb_s"] = 2 * x.nbytes / harness.median(harness.time_ms(lambda: y.copy_(x), device, 3, 20)) / 1e6
        extra = f" | CUDA {info['cuda']}, peak HBM {info['peak_gb_s']} GB/s, copy {info['copy_gb_s']:.0f} GB/s"
    versions = f" | triton {info['triton']} | torch_geometric {info['torch_geometric']}"
    info["header"] = harness.machine_header(info) + extra + versions
    return info


RATIO_TARGETS = [("random", "pyg", "triton", ""), ("random", "pyg-compiled", "triton", " (>= 3)")]
RATIO_TARGETS += [(case, "triton", "flex", " (<= 1.1)") for case in ("window8", "window64")]
RATIO_TARGETS += [(case, "local-triton", "flex", " (<= 1.1)") for case in ("window8", "window64")]
RATIO_TARGETS += [("complete512", "auto", "sdpa", " (<= 1.3)")]


def targets(rows: List[Row]) -> Dict[str, Optional[float]]:
    """Issue 30's targets (and issue 16's that still hold) per clamp mode, from the timed rows, by a
    name that states the bound (None where a side is missing)."""
    by = {(r.family, r.mode, r.contender): r for r in rows if r.ms is not None}

    def ratio(case, mode, a, b):
        x, y = by.get((case, f"fwd+bwd {mode}", a)), by.get((case, f"fwd+bwd {mode}", b))
        return x.ms / y.ms if x and y and x.ms and y.ms else None

    out: Dict[str, Optional[float]] = {}
    for mode in CLAMPS:
        fwd, both = by.get(("random", f"fwd {mode}", "triton")), by.get(("random", f"fwd+bwd {mode}", "triton"))
        out[f"random {mode}: triton fwd GB/s / peak (>= 0.8)"] = fwd.fwd_peak_fraction if fwd else None
        out[f"random {mode}: triton fwd+bwd ms (<= 40)"] = both.ms if both else None
        bwd_ms = both.bwd_ms if both else None
        out[f"random {mode}: triton bwd / fwd time (<= 2)"] = bwd_ms / fwd.ms if fwd and fwd.ms and bwd_ms else None
        for case, a, b, bound in RATIO_TARGETS:
            out[f"{case} {mode}: {a} / {b} fwd+bwd time{bound}"] = ratio(case, mode, a, b)
    return out


def row_line(r: Row) -> str:
    """A row's log line; a fwd+bwd row's rate is its backward's (bwd_ms = fwd+bwd ms - fwd ms)."""
    fwd = r.mode.startswith("fwd ")
    gbs, frac = (r.gb_per_s, r.fwd_peak_fraction) if fwd else (r.bwd_gb_per_s, r.bwd_peak_fraction)
    pct = harness.fmt(None if frac is None else 100 * frac, ".1f")
    return harness.row_line(r, f"{'' if fwd else 'bwd '}{harness.fmt(gbs, '.0f')} GB/s ({pct}% of peak)  ")


def run_cases(args, cases, contenders, device, dtype, info, say, t0: float) -> Tuple[List[Row], List[str]]:
    """Every case and mode: the reference output, then each contender's rows, printed as a table; the
    modes that would start more than --budget seconds after t0 are skipped."""
    rows: List[Row] = []
    wrong: List[str] = []
    for case in cases:
        build, size, smoke_size = CASES[case]
        g = build(smoke_size if args.smoke else size, device)
        g.csr(), g.csc()  # built once, as a model's layers share them
        gen, sizes = torch.Generator(device=device).manual_seed(0), (g.num_dst, g.num_src, g.num_src)  # q, k, v
        inputs = [torch.randn(n, H, D, generator=gen, device=device).to(dtype).requires_grad_() for n in sizes]
        for mode in args.modes.split(","):
            say(f"\n{case} {mode}: N_dst={g.num_dst}, E={g.num_edges}, max in-degree {int(g.in_degree().max())}")
            if args.budget is not None and time.time() - t0 > args.budget:
                rows.append(Row(case, g.num_edges, "-", f"fwd {mode}", note="skipped: --budget reached"))
                say("skipped: --budget reached")
                continue
            check = functools.partial(compare, ref=reference_output(*inputs, g, CLAMPS[mode]), tol=TOL[dtype])
            for name, make in contenders.items():
                new, bad = measure(name, make, case, mode, g, inputs, check, args, device, args.warmup)
                set_rates(new, g, inputs, info["peak_gb_s"])
                rows += new
                wrong += [f"{case} {mode} {name}"] if bad else []
                for r in new:
                    say(row_line(r))
            del check  # and the reference it holds
    return rows, wrong


def parse_args(argv):
    parser = harness.parser(__doc__, tag=False)
    parser.add_argument("--cases", default=",".join(CASES), help=", ".join(CASES))
    parser.add_argument("--modes", default=",".join(CLAMPS), help=", ".join(CLAMPS))
    contenders = "triton,csr,auto,pyg,pyg-compiled,flex,sdpa"
    parser.add_argument("--contenders", default=contenders, help=", ".join(CONTENDERS))
    parser.add_argument("--sweep", action="store_true", help="time the triton forward under each SWEEP setting")
    parser.add_argument("--sweep-backward", action="store_true", help="triton fwd+bwd under each SWEEP_BACKWARD one")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes in float32 on CPU")
    parser.add_argument("--no-backward", action="store_true", help="time the forward only")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rep", type=int, default=10)
    parser.add_argument("--contender-s", type=float, default=3.0, help="seconds of timing per contender at most")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; later cases are skipped")
    parser.add_argument("--peak-gbs", type=float, default=None, help="peak HBM GB/s (default: PEAK_GBS by name)")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="of q, k, v on the GPU (--smoke: float32)")
    parser.add_argument(
        "--float32-scores",
        default="saved",
        choices=["saved", "wide"],
        help="float32: the backward reads the forward's scores (saved) or every kernel sums them in float64 (wide)",
    )
    args = parser.parse_args(argv)
    names = args.cases.split(",") + args.modes.split(",") + args.contenders.split(",")
    unknown = [x for x in names if x not in {**CASES, **CLAMPS, **CONTENDERS}]
    if unknown:
        parser.error(f"unknown {unknown}")
    if args.sweep and args.sweep_backward:
        parser.error("--sweep and --sweep-backward are separate runs")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", DTYPES[args.dtype])
    if args.float32_scores == "wide":
        from sparseattn.kernels.triton import launch

        launch.SAVE_FLOAT32_SCORES = False
    if device == "cpu":  # triton on CPU runs interpreted; read when triton (PyG imports it) and the kernels load
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: the GPU benchmark needs one (--smoke runs tiny sizes on CPU); nothing to do")
        return 0
    if args.sweep or args.sweep_backward:
        contenders = sweep_contenders(backward=args.sweep_backward)
    else:
        contenders = {n: CONTENDERS[n] for n in args.contenders.split(",")}
    args.no_backward = args.no_backward or args.sweep  # the backward does not depend on forward settings
    info = machine(args, device)
    dtype_tag = [args.dtype] * (args.dtype != "bfloat16" and not args.smoke)  # bfloat16 keeps the untagged name
    dtype_tag += ["wide"] * (args.float32_scores == "wide")
    kinds = ["sweep"] * args.sweep + ["sweep-backward"] * args.sweep_backward + ["smoke"] * args.smoke
    tag = "-".join(kinds + dtype_tag)
    out = harness.Output("benchmarks.bench_triton_gpu", argv, args.out, info, tag)
    out.header = info["header"]
    out.log(
        f"H={H}, D=Dv={D}, {str(dtype)[6:]}, median of up to {args.rep} runs after {args.warmup} warmup; "
        f"outputs checked on all destinations against the float32 reference (tolerance {TOL[dtype]:g})"
    )
    rows, wrong = run_cases(args, args.cases.split(","), contenders, device, dtype, info, out.log, time.time())
    goals = {} if args.sweep or args.sweep_backward else targets(rows)
    out.log("\ntargets: " + "; ".join(f"{k}: {harness.fmt(v, '.2f')}" for k, v in goals.items()))
    out.log(f"wrong: {', '.join(wrong) or 'none'}")
    config = dict(vars(args), out="OUT", dtype=str(dtype), H=H, D=D, tol=TOL[dtype])  # no machine path
    out.save(config, rows, targets=goals, wrong=wrong)
    harness.write_times(out.png, out.header, rows)
    out.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
