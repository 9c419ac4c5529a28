"""Graph-transformer layers and edge terms: `sparseattn.nn.TransformerConv` against PyG's
`TransformerConv`, and what edge terms cost the csr kernels (docs/benchmarks/layers.md).

    python -m benchmarks.bench_layers                        # 50K-node graphs, 1 thread (~10 min on 2 cores)
    python -m benchmarks.bench_layers --nodes 5000 --threads 2
    python -m benchmarks.bench_layers --molecules              # only the molecule batches (~1 min)
    python -m benchmarks.bench_layers --molecules --global-attention --tag small-graphs  # both small-graph cases
    python -m benchmarks.bench_layers --device cuda --big-layers --nodes 1048576 --dtype bfloat16  # a GPU

Warm, cold (this script with --cold in a fresh process), edge-term, molecule-batch (`_molecule_cases`)
and GraphGPS global-attention rows (`_global_cases`); what each measures: benchmarks/templates/layers.md.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
from typing import Callable, Dict, List

import torch

from sparseattn import edge_attention, graphs
from sparseattn.nn import TransformerConv

from .harness import ROOT, Output, Result, fmt, machine_info, measure, parser, timed_pass, write_times
from .harness import failure as harness_failure

HEADS, CHANNELS, EDGE_DIM = 8, 64, 16
COLD = {  # contender -> (layer, edge_index layout)
    "sparseattn.nn.TransformerConv, raw int64 edge_index": ("sparseattn", "int64"),
    "sparseattn.nn.TransformerConv, raw transposed int32 edge_index": ("sparseattn", "transposed-int32"),
    "PyG TransformerConv, raw int64 edge_index": ("pyg", "int64"),
}


def _graphs(n: int, device: str) -> Dict[str, graphs.Graph]:
    return {
        f"random-{n}": graphs.random(n, n, 16 * n, seed=0, device=device),
        f"window-{n}": graphs.window(n, radius=8, device=device),
    }


def _layer(kind: str, device: str) -> torch.nn.Module:
    """TransformerConv(512, 64, heads=8, edge_dim=16), sparseattn's or ("pyg") PyG's."""
    if kind == "pyg":
        from torch_geometric.nn import TransformerConv as PygTransformerConv

        return PygTransformerConv(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM).to(device)
    return TransformerConv(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM).to(device)


def _features(n: int, e: int, device: str):
    """Seeded node features (n, 512) and edge features (e, 16)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, HEADS * CHANNELS, generator=gen).to(device), torch.randn(e, EDGE_DIM, generator=gen).to(
        device
    )


def _layer_cases(name: str, g, device: str, log: Callable[[str], None]) -> List[Result]:
    x, edge_attr = _features(g.num_dst, g.num_edges, device)
    torch.manual_seed(0)
    pyg = _layer("pyg", device)
    ours = _layer("sparseattn", device)
    ours.load_state_dict(pyg.state_dict())
    with torch.no_grad():
        err = (ours(x, g, edge_attr) - pyg(x, g.edge_index, edge_attr)).abs().max().item()
    log(f"{name}: max |sparseattn - PyG| = {err:.2e}")
    contenders = {"sparseattn.nn.TransformerConv": (ours, g, err), "PyG TransformerConv": (pyg, g.edge_index, 0.0)}
    results: List[Result] = []
    for mode in ("fwd", "fwd+bwd"):
        rows = [Result(name, g.num_edges, label, mode, max_err_vs_reference=c[2]) for label, c in contenders.items()]
        fns = [
            timed_pass(lambda m=module, gr=graph: m(x, gr, edge_attr), mode, list(module.parameters()))
            for module, graph, _ in contenders.values()
        ]
        measure(rows, fns, device, warmup=1, reps=5, budget_s=60)
        results += rows
    return results


def _cold_cases(name: str, nodes: int, threads: int, device: str, log: Callable[[str], None]) -> List[Result]:
    """Each COLD contender's first forward+backward in a fresh process (this script with --cold)."""
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


def _cold_child(label: str, graph_name: str, nodes: int, device: str) -> None:
    """Build the inputs, time one forward+backward, print "<ms> <edges>" (run by _cold_cases)."""
    layer, layout = COLD[label]
    edge_index = _graphs(nodes, device)[graph_name].edge_index.clone()  # no cached structure survives
    if layout == "transposed-int32":
        edge_index = edge_index.int().t().contiguous().t()
    x, edge_attr = _features(nodes, edge_index.shape[1], device)
    module = _layer(layer, device)
    t = time.perf_counter()
    module(x, edge_index, edge_attr).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{(time.perf_counter() - t) * 1e3:.3f} {edge_index.shape[1]}")


def _edge_term_cases(name: str, g, device: str) -> List[Result]:
    gen = torch.Generator().manual_seed(1)
    n, e, d = g.num_dst, g.num_edges, CHANNELS

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(device).requires_grad_()

    q, k, v = leaf(n, HEADS, d), leaf(n, HEADS, d), leaf(n, HEADS, d)
    grad = torch.randn(n, HEADS, d, generator=gen).to(device)
    cases = {
        "csr, no edge term": {},
        "csr, edge_key + edge_value (E,H,D)": {"edge_key": leaf(e, HEADS, d), "edge_value": leaf(e, HEADS, d)},
    }
    shared = leaf(e, 1, d)
    cases["csr, one shared (E,1,D) row as both"] = {"edge_key": shared, "edge_value": shared}
    backend = "csr" if device == "cpu" else "auto"

    def run(kwargs) -> Callable[[], None]:
        def fn() -> None:  # leaves no gradient held
            edge_attention(q, k, v, g, clamp=None, backend=backend, **kwargs).backward(grad)
            for t in (q, k, v, *kwargs.values()):
                t.grad = None

        return fn

    rows = [Result(name, e, label, "fwd+bwd") for label in cases]
    measure(rows, [run(kw) for kw in cases.values()], device, warmup=1, reps=5, budget_s=40)
    for r in rows:  # here: the time of the call without terms over this one's
        r.speedup_vs_reference = rows[0].ms / r.ms if rows[0].ms and r.ms else None
    return rows


def _molecules(num_batches: int, device: str) -> list:
    """Molecule-like PyG batches, seeded: 32 graphs of 5-60 nodes, each a random tree plus n // 8 ring
    bonds, every bond listed both ways (~2.2 edges per node each way), with x (N, 64), edge_attr (E, 16)."""
    from torch_geometric.data import Batch, Data

    gen, out = torch.Generator().manual_seed(0), []
    for _ in range(num_batches):
        data = []
        for n in torch.randint(5, 61, (32,), generator=gen).tolist():
            a = torch.cat([torch.arange(1, n), torch.randint(0, n, (n // 8,), generator=gen)])
            b = torch.cat([(torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long(), (a[n - 1 :] + 1) % n])
            ei = torch.stack([torch.stack([a, b], 1).view(-1), torch.stack([b, a], 1).view(-1)])
            x, ea = torch.randn(n, 64, generator=gen), torch.randn(ei.shape[1], EDGE_DIM, generator=gen)
            data.append(Data(x=x, edge_index=ei, edge_attr=ea))
        out.append(Batch.from_data_list(data).to(device))
    return out


def _molecule_cases(device: str, log: Callable[[str], None]) -> List[Result]:
    """TransformerConv(64, 16, heads=4, edge_dim=16) fwd+bwd per molecule batch (`_molecules`), each a
    graph never seen before: sparseattn with `graphs.from_pyg(batch)` in the time, PyG eager and
    torch.compile(dynamic=True) (its compile time, the first batches' calls, logged apart)."""
    from torch_geometric.nn import TransformerConv as PygTransformerConv

    batches = _molecules(8, device)
    torch.manual_seed(0)
    pyg = PygTransformerConv(64, 16, heads=4, edge_dim=EDGE_DIM).to(device)
    ours = TransformerConv(64, 16, heads=4, edge_dim=EDGE_DIM).to(device)
    ours.load_state_dict(pyg.state_dict())
    compiled = torch.compile(pyg, dynamic=True)
    t = time.perf_counter()
    for b in batches[:2]:
        compiled(b.x, b.edge_index, b.edge_attr).sum().backward()
    log(f"molecules: PyG torch.compile(dynamic=True) first 2 batches (compile) {time.perf_counter() - t:.1f} s")
    contenders = {
        "sparseattn.nn.TransformerConv": (ours, graphs.from_pyg),
        "PyG TransformerConv": (pyg, lambda b: b.edge_index),
        "PyG TransformerConv compiled": (compiled, lambda b: b.edge_index),
    }

    def run(module, graph_of) -> Callable[[], None]:
        def fn() -> None:  # every batch a graph this call builds
            for b in batches:
                module(b.x, graph_of(b), b.edge_attr).sum().backward()
            for m in (pyg, ours):
                m.zero_grad(set_to_none=True)

        return fn

    edges = sum(b.num_edges for b in batches) // len(batches)
    rows = [Result("molecules-32x5-60", edges, label, "fwd+bwd") for label in contenders]
    measure(rows, [run(*c) for c in contenders.values()], device, warmup=1, reps=15, budget_s=60)
    for r in rows:  # per batch
        r.times_ms = [t / len(batches) for t in r.times_ms]
        r.ms = r.ms / len(batches) if r.ms else None
    for r in rows:
        r.speedup_vs_reference = rows[1].ms / r.ms if rows[1].ms and r.ms else None
        log(f"molecules: {r.contender}: {fmt(r.ms, '.2f')} ms per batch, {fmt(r.speedup_vs_reference, '.2f')}x PyG's")
    return rows


GRAPHGPS = "GraphGPS to_dense_batch + nn.MultiheadAttention"


def _global_cases(device: str, log: Callable[[str], None]) -> List[Result]:
    """`GlobalAttention(64, 4)(x, batch)` against GraphGPS's global branch (`to_dense_batch`,
    `nn.MultiheadAttention(64, 4, batch_first=True)` with the key padding mask, unpad), one state
    dict, on 128 seeded graphs of 20-40 nodes, x requiring grad; fwd and fwd+bwd."""
    from torch_geometric.utils import to_dense_batch

    from sparseattn.nn import GlobalAttention

    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(20, 41, (128,), generator=gen)
    batch = torch.repeat_interleave(torch.arange(128), sizes).to(device)
    x = torch.randn(batch.numel(), 64, generator=gen).to(device).requires_grad_()
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(device)
    ours = GlobalAttention(64, 4).to(device)
    ours.load_state_dict(mha.state_dict())

    def graphgps() -> torch.Tensor:
        h, mask = to_dense_batch(x, batch)
        return mha(h, h, h, key_padding_mask=~mask, need_weights=False)[0][mask]

    with torch.no_grad():
        err = (ours(x, batch) - graphgps()).abs().max().item()
    log(f"graphgps-128x20-40: max |sparseattn - GraphGPS| = {err:.2e}")
    contenders = {"sparseattn.nn.GlobalAttention": lambda: ours(x, batch), GRAPHGPS: graphgps}
    leaves = [x, *mha.parameters(), *ours.parameters()]
    edges = int((sizes * sizes).sum())
    results: List[Result] = []
    for mode in ("fwd", "fwd+bwd"):
        rows = [Result("graphgps-128x20-40", edges, label, mode, max_err_vs_reference=err) for label in contenders]
        measure(rows, [timed_pass(f, mode, leaves) for f in contenders.values()], device, warmup=2, reps=15)
        for r in rows:
            r.speedup_vs_reference = rows[1].ms / r.ms if rows[1].ms and r.ms else None
            speed = fmt(r.speedup_vs_reference, ".2f")
            log(f"graphgps-128x20-40 {mode}: {r.contender}: {fmt(r.ms, '.2f')} ms, {speed}x GraphGPS's")
        results += rows
    return results


BIG_LAYERS = ("TransformerConv", "GATv2Conv", "GATConv")


def _layer_pair(name: str, device: str, dtype: torch.dtype):
    """sparseattn.nn's and PyG's `name`(512, 64, heads=8, edge_dim=16), the same weights."""
    import torch_geometric.nn

    import sparseattn.nn

    torch.manual_seed(0)
    pyg = getattr(torch_geometric.nn, name)(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM)
    ours = getattr(sparseattn.nn, name)(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM)
    ours.load_state_dict(pyg.state_dict())
    return ours.to(device, dtype), pyg.to(device, dtype)


def _big_layer_cases(nodes: int, dtype: torch.dtype, device: str, log: Callable[[str], None]) -> List[Result]:
    """Each BIG_LAYERS layer fwd+bwd on a random graph of in-degree 16 in dtype: sparseattn, PyG eager
    and PyG under torch.compile (static shapes; its compile, the first fwd+bwd, logged apart), with
    peak memory. Each pair is first checked on a 4,096-node graph in float32."""
    small = graphs.random(4096, 4096, 16 * 4096, seed=1, device=device)
    xs, es = _features(4096, small.num_edges, device)
    g = graphs.random(nodes, nodes, 16 * nodes, seed=0, device=device)
    x, edge_attr = (t.to(dtype) for t in _features(nodes, g.num_edges, device))
    name_of = f"random-{nodes}-{str(dtype)[6:]}"
    results: List[Result] = []
    for name in BIG_LAYERS:
        ours, pyg = _layer_pair(name, device, torch.float32)
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
        contenders = {f"sparseattn.nn.{name}": (ours, g), f"PyG {name}": (pyg, g.edge_index)}
        contenders.update({f"PyG {name} compiled": (compiled, g.edge_index)} if compiled is not None else {})
        rows = [Result(name_of, g.num_edges, label, "fwd+bwd") for label in contenders]
        rows[0].max_err_vs_reference = err
        params = list(pyg.parameters()) + list(ours.parameters())
        fns = [timed_pass(lambda m=m, gr=gr: m(x, gr, edge_attr), "fwd+bwd", params) for m, gr in contenders.values()]
        measure(rows, fns, device, warmup=1, reps=5, budget_s=20)
        for r in rows:
            r.speedup_vs_reference = r.ms and rows[-1].ms and rows[-1].ms / r.ms  # over PyG's best form here
            log(f"{name_of} {r.contender}: {fmt(r.ms, '.2f')} ms, peak +{fmt(r.peak_extra_mib, '.0f')} MiB {r.note}")
        results += rows
        del ours, pyg, compiled
        torch.cuda.empty_cache() if device == "cuda" else None
    return results


def main(argv=None) -> None:
    p = parser(__doc__, type=int, default=1)
    p.add_argument("--nodes", type=int, default=50_000, help="nodes (tokens) of each graph")
    p.add_argument("--device", default="cpu")
    p.add_argument("--skip-layers", action="store_true", help="only the edge-term cases (no torch_geometric)")
    p.add_argument("--molecules", action="store_true", help="only the molecule-batch case")
    p.add_argument("--global-attention", action="store_true", help="only GlobalAttention against GraphGPS's")
    p.add_argument("--big-layers", action="store_true", help="only BIG_LAYERS on one random graph, PyG compiled too")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of the --big-layers case")
    p.add_argument("--cold", choices=list(COLD), help=argparse.SUPPRESS)  # the child of a cold case
    p.add_argument("--cold-graph", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cold:
        return _cold_child(args.cold, args.cold_graph, args.nodes, args.device)
    out = Output("benchmarks.bench_layers", argv, args.out, machine_info(args.device), tag=args.tag)
    out.log(f"nodes {args.nodes}, H={HEADS}, C={CHANNELS}, edge_dim={EDGE_DIM}")
    small = args.molecules or args.global_attention  # only the small-graph cases named
    if args.big_layers:
        results = _big_layer_cases(args.nodes, getattr(torch, args.dtype), args.device, out.log)
    else:
        results = [] if args.skip_layers or (small and not args.molecules) else _molecule_cases(args.device, out.log)
        results += _global_cases(args.device, out.log) if args.global_attention else []
    for name, g in _graphs(args.nodes, args.device).items() if not (small or args.big_layers) else ():
        if not args.skip_layers:
            results += _layer_cases(name, g, args.device, out.log)
            results += _cold_cases(name, args.nodes, args.threads, args.device, out.log)
        results += _edge_term_cases(name, g, args.device)
    out.save(dict(vars(args), out="OUT"), results)
    write_times(out.png, out.header, [r for r in results if "csr" not in r.contender])
    out.close()


if __name__ == "__main__":
    main()
