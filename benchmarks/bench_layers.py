"""Graph-transformer layers and edge terms: `sparseattn.nn.TransformerConv` against PyG's
`TransformerConv`, and what edge terms cost the csr kernels.

    python -m benchmarks.bench_layers                        # 50K-node graphs, 1 thread (~10 min on 2 cores)
    python -m benchmarks.bench_layers --nodes 5000 --threads 2

Layers: TransformerConv(512, 64, heads=8, edge_dim=16) from one state dict, on a random graph of
--nodes nodes (in-degree 16) and a window graph of as many tokens (radius 8, in-degree 17), edge
features (E, 16). Forward (no_grad) and forward+backward (a sum of the output, gradients of every
parameter), timed in interleaved rounds (harness.time_interleaved) after one warm-up call with a
reused `Graph` (PyG: its int64 edge_index), outputs checked against PyG's first, and the peak
memory one call adds (harness.peak_extra_mib, the process's peak resident set). "fwd+bwd cold" is
a user's first call: a fresh process per contender, the raw edge_index as a user holds it (int64,
or int32 stored transposed, (E, 2) pairs viewed as (2, E)), no warm-up, one call timed (index
building, first page faults and lazy initialisation included; imports and the model's
construction not).
Edge terms: `edge_attention` on the csr backend (H=8, D=64, exact softmax, inputs of unit scale) forward+backward with
no edge term, with edge_key and edge_value (E, H, D) each, and with one (E, 1, D) row shared by
the heads as both (TransformerConv's form), on the same graphs: the cost of the terms against the
same call without them. On a CUDA device (--device cuda) the same cases run there.

Writes bench_layers_<machine>.{json,png,log} under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Callable, Dict, List

import torch

from sparseattn import edge_attention, graphs
from sparseattn.nn import TransformerConv

from .harness import (
    RESULTS,
    ROOT,
    Output,
    Result,
    machine_header,
    machine_info,
    machine_tag,
    median,
    peak_extra_mib,
    time_interleaved,
    write_png,
)
from .pages import preview

HEADS, CHANNELS, EDGE_DIM = 8, 64, 16


def _graphs(n: int, device: str) -> Dict[str, graphs.Graph]:
    return {
        f"random-{n}": graphs.random(n, n, 16 * n, seed=0, device=device),
        f"window-{n}": graphs.window(n, radius=8, device=device),
    }


def _layer_cases(name: str, g, device: str, log: Callable[[str], None]) -> List[Result]:
    from torch_geometric.nn import TransformerConv as PygTransformerConv

    gen = torch.Generator().manual_seed(0)
    n, e = g.num_dst, g.num_edges
    x = torch.randn(n, HEADS * CHANNELS, generator=gen).to(device)
    edge_attr = torch.randn(e, EDGE_DIM, generator=gen).to(device)
    torch.manual_seed(0)
    pyg = PygTransformerConv(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM).to(device)
    ours = TransformerConv(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM).to(device)
    ours.load_state_dict(pyg.state_dict())
    index = g.edge_index
    with torch.no_grad():
        err = (ours(x, g, edge_attr) - pyg(x, index, edge_attr)).abs().max().item()
    log(f"{name}: max |sparseattn - PyG| = {err:.2e}")
    contenders = {"sparseattn.nn.TransformerConv": (ours, g), "PyG TransformerConv": (pyg, index)}
    results: List[Result] = []
    for mode in ("fwd", "fwd+bwd"):
        fns = []
        for module, graph in contenders.values():
            fns.append(_call(module, graph, x, edge_attr, mode))
        times = time_interleaved(fns, device, warmup=1, reps=5, budget_s=60)
        for (label, (module, _)), fn, t in zip(contenders.items(), fns, times):
            r = Result(name, e, label, mode, max_err_vs_reference=err if label.startswith("sparseattn") else 0.0)
            if isinstance(t, list) and t:
                r.ms, r.times_ms = median(t), t
                module.zero_grad(set_to_none=True)  # measured from no gradients held
                r.peak_extra_mib = peak_extra_mib(fn, device)
            else:
                r.note = f"failed: {type(t).__name__}: {t}"
            results.append(r)
    return results


COLD = {  # contender -> (layer, edge_index layout)
    "sparseattn.nn.TransformerConv, raw int64 edge_index": ("sparseattn", "int64"),
    "sparseattn.nn.TransformerConv, raw transposed int32 edge_index": ("sparseattn", "transposed-int32"),
    "PyG TransformerConv, raw int64 edge_index": ("pyg", "int64"),
}


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
    import time

    layer, layout = COLD[label]
    g = _graphs(nodes, device)[graph_name]
    edge_index = g.edge_index.clone()
    del g  # nothing cached survives: the call gets only the raw index
    if layout == "transposed-int32":
        edge_index = edge_index.int().t().contiguous().t()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, HEADS * CHANNELS, generator=gen).to(device)
    edge_attr = torch.randn(edge_index.shape[1], EDGE_DIM, generator=gen).to(device)
    if layer == "pyg":
        from torch_geometric.nn import TransformerConv as PygTransformerConv

        module = PygTransformerConv(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM).to(device)
    else:
        module = TransformerConv(HEADS * CHANNELS, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM).to(device)
    t = time.perf_counter()
    module(x, edge_index, edge_attr).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{(time.perf_counter() - t) * 1e3:.3f} {edge_index.shape[1]}")


def _call(module, graph, x, edge_attr, mode: str) -> Callable[[], None]:
    def fwd() -> None:
        with torch.no_grad():
            module(x, graph, edge_attr)

    def fwd_bwd() -> None:
        module.zero_grad(set_to_none=True)
        module(x, graph, edge_attr).sum().backward()

    return fwd if mode == "fwd" else fwd_bwd


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
        def fn() -> None:
            for t in (q, k, v, *kwargs.values()):
                t.grad = None
            edge_attention(q, k, v, g, clamp=None, backend=backend, **kwargs).backward(grad)

        return fn

    fns = [run(kw) for kw in cases.values()]
    times = time_interleaved(fns, device, warmup=1, reps=5, budget_s=40)
    results = []
    base = median(times[0]) if isinstance(times[0], list) and times[0] else None
    for label, fn, t in zip(cases, fns, times):
        r = Result(name, e, label, "fwd+bwd")
        if isinstance(t, list) and t:
            r.ms, r.times_ms = median(t), t
            r.speedup_vs_reference = None if base is None else base / r.ms  # (here: the call without terms)
            for x in (q, k, v, *cases[label].values()):
                x.grad = None  # measured from no gradients held
            r.peak_extra_mib = peak_extra_mib(fn, device)
        else:
            r.note = f"failed: {type(t).__name__}: {t}"
        results.append(r)
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=50_000, help="nodes (tokens) of each graph")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--skip-layers", action="store_true", help="only the edge-term cases (no torch_geometric)")
    p.add_argument("--cold", choices=list(COLD), help=argparse.SUPPRESS)  # the child of a cold case
    p.add_argument("--cold-graph", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cold:
        _cold_child(args.cold, args.cold_graph, args.nodes, args.device)
        return
    info = machine_info(args.device)
    out = Output("benchmarks.bench_layers", argv, args.out, f"bench_layers_{machine_tag(info)}")
    out.log(machine_header(info))
    out.log(f"nodes {args.nodes}, H={HEADS}, C={CHANNELS}, edge_dim={EDGE_DIM}")
    results: List[Result] = []
    for name, g in _graphs(args.nodes, args.device).items():
        if not args.skip_layers:
            results += _layer_cases(name, g, args.device, out.log)
            results += _cold_cases(name, args.nodes, args.threads, args.device, out.log)
        results += _edge_term_cases(name, g, args.device)
    out.save(info, dict(vars(args), out="OUT"), results)
    write_png(out.path + ".png", machine_header(info), [r for r in results if "csr" not in r.contender])
    out.log(preview(out.path + ".json"))
    out.close()


if __name__ == "__main__":
    main()
