"""torch.compile of code on sparseattn: compiled vs eager time, compilation, graph breaks and profiles.

    python -m benchmarks.bench_compile                    # every case, 1 thread (~5 min on 2 cores)
    python -m benchmarks.bench_compile --cases attention-window-8192 --threads 2

"dynamic sizes": the layer under dynamic=True on ten window graphs of different N and E, its compiled entries
(1 = no recompilation) and summed time. What each case measures: docs/benchmarks/compile.md.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

from sparseattn import EdgeAttention, Graph, edge_attention, graphs

from . import harness
from .harness import Output, Result, machine_info, measure, time_interleaved, timed_pass


class GraphLayer(nn.Module):
    """A pre-norm graph-transformer layer: x + attn(norm(x)), then x + ff(norm(x))."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = EdgeAttention(dim, heads)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor, graph) -> Tensor:
        x = x + self.attn(self.norm1(x), graph)
        return x + self.ff(self.norm2(x))


class Attention(nn.Module):
    """edge_attention on given q, k, v (N, H, D) as a module, so every case compiles a module."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, graph) -> Tensor:
        return edge_attention(q, k, v, graph)


@dataclass
class Case:
    name: str
    graph: Callable[[], Graph]
    model: Callable[[], nn.Module]
    inputs: Callable[[Graph], List[Tensor]]  # the tensors before the graph argument
    raw: bool = False  # hand the compiled code graph.edge_index instead of the Graph


def _qkv(g: Graph) -> List[Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(n, 8, 64, generator=gen) * 0.5 for n in (g.num_dst, g.num_src, g.num_src)]


def _x(dim: int) -> Callable[[Graph], List[Tensor]]:
    return lambda g: [torch.randn(g.num_dst, dim, generator=torch.Generator().manual_seed(0))]


WINDOW = lambda: graphs.window(8192, 8)  # noqa: E731
RANDOM = lambda: graphs.random(50_000, 50_000, 800_000, seed=0)  # noqa: E731
CASES = {
    c.name: c
    for c in [
        Case("attention-window-8192", WINDOW, Attention, _qkv),
        Case("attention-window-8192-raw", WINDOW, Attention, _qkv, raw=True),
        Case("attention-random-50k", RANDOM, Attention, _qkv),
        Case("EdgeAttention-512-window-8192", WINDOW, lambda: EdgeAttention(512, 8), _x(512)),
        Case("EdgeAttention-128-window-8192", WINDOW, lambda: EdgeAttention(128, 8), _x(128)),
        Case("layer-128-window-8192", WINDOW, lambda: GraphLayer(128, 8), _x(128)),
    ]
}


def _fresh(g: Graph, raw: bool):
    """What a user hands over: a new Graph (structure not built) or the raw index."""
    return g.edge_index.clone() if raw else Graph(g.edge_index.clone(), g.num_src, g.num_dst)


def run_case(case: Case, args, results: List[Result], log: Callable[[str], None]) -> dict:
    torch._dynamo.reset()
    g = case.graph()
    torch.manual_seed(0)
    model = case.model()
    leaves = case.inputs(g)
    eager_graph, compiled_graph = (_fresh(g, case.raw) for _ in range(2))
    compiled = torch.compile(model, fullgraph=True)
    explained = torch._dynamo.explain(model)(*leaves, _fresh(g, case.raw))
    info: Dict[str, object] = dict(edges=g.num_edges, nodes=g.num_dst, breaks=explained.graph_break_count)
    log(f"\n{case.name}: N={g.num_dst}, E={g.num_edges}; graph breaks {explained.graph_break_count}")
    params = list(model.parameters())
    for mode in ("fwd", "fwd+bwd"):
        xs = [t.clone().requires_grad_(mode == "fwd+bwd") for t in leaves]

        def call(m, graph, xs=xs, mode=mode):
            return timed_pass(lambda: m(*xs, graph), mode, [*xs, *params])()

        start = time.perf_counter()
        out_c = call(compiled, compiled_graph)
        info[f"compile_s_{mode}"] = round(time.perf_counter() - start, 1)
        out_e = call(model, eager_graph)
        err = (out_c.float() - out_e.float()).abs().max().item()
        if not err <= 1e-3:
            raise AssertionError(f"{case.name} {mode}: compiled differs from eager by {err:.3g}")
        fns = [lambda: call(model, eager_graph), lambda: call(compiled, compiled_graph)]
        errs = (("eager", 0.0), ("compiled", err))
        rows = [Result(case.name, g.num_edges, c, mode, max_err_vs_reference=e) for c, e in errs]
        measure(rows, fns, memory=False, warmup=args.warmup, reps=args.reps, budget_s=args.budget_s)
        assert rows[0].ms and rows[1].ms, [r.note for r in rows]
        results += rows
        row = {r.contender: r.ms for r in rows}
        info[f"ratio_{mode}"] = round(row["eager"] / row["compiled"], 3)
        log(
            f"  {mode:8s} eager {row['eager']:9.2f} ms  compiled {row['compiled']:9.2f} ms  "
            f"eager/compiled {info[f'ratio_{mode}']:.2f}x  (compile {info[f'compile_s_{mode}']} s, |diff| {err:.1e})"
        )
        for which, m, graph in (("compiled", compiled, compiled_graph), ("eager", model, eager_graph)):
            if mode == "fwd+bwd":  # its top operators by self CPU time, per step
                info[f"profile_{which}"], _, _ = harness.profile_top(functools.partial(call, m, graph), runs=2)
                log(f"    top operators, {which} fwd+bwd step:\n" + harness.profile_lines(info[f"profile_{which}"]))
    return info


def dynamic_sizes(args, log: Callable[[str], None]) -> dict:
    """GraphLayer(128, 8) under dynamic=True on ten window graphs of different sizes."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GraphLayer(128, 8)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    sizes = [(1000 + 700 * i, 2 + i % 5) for i in range(10)]
    batches = [(graphs.window(n, r), torch.randn(n, 128)) for n, r in sizes]
    start = time.perf_counter()
    for g, x in batches:
        compiled(x, _fresh(g, False)).sum().backward()
    first_pass = time.perf_counter() - start
    entries = len(_debug_get_cache_entry_list(model.forward.__func__.__code__))

    def run(m):
        for g, x in batches:
            m(x, g).sum().backward()

    timed = time_interleaved([lambda: run(model), lambda: run(compiled)], warmup=1, reps=args.reps, budget_s=60)
    eager_ms, compiled_ms = (statistics.median(t) for t in timed)  # type: ignore[arg-type]
    info = dict(sizes=sizes, compiled_entries=entries, first_pass_s=round(first_pass, 1), eager_ms=round(eager_ms, 1))
    info.update(compiled_ms=round(compiled_ms, 1), ratio=round(eager_ms / compiled_ms, 3))
    log(
        f"\ndynamic sizes: GraphLayer(128, 8), dynamic=True, ten window graphs N {sizes[0][0]}..{sizes[-1][0]}: "
        f"{entries} compiled entr{'y' if entries == 1 else 'ies'}, first pass {info['first_pass_s']} s "
        f"(compilation included); fwd+bwd of all ten: eager {eager_ms:.1f} ms, compiled {compiled_ms:.1f} ms, "
        f"eager/compiled {info['ratio']:.2f}x"
    )
    return info


def plot_ratios(path: str, title: str, cases: Dict[str, dict], target: float = 1.15) -> bool:
    """eager/compiled per case and pass, 1.0 and the target marked; False without matplotlib."""
    ratios = {name: {m: c[f"ratio_{m}"] for m in ("fwd", "fwd+bwd")} for name, c in cases.items()}
    lines = [(1.0, "no gain"), (target, f"target {target}x")]
    panels = {"eager / compiled (> 1: compiled is faster)": ratios}
    return harness.write_bars(path, title, panels, "eager / compiled", lines=lines)


def main(argv=None) -> None:
    ap = harness.parser(__doc__, type=int, default=1)
    ap.add_argument("--cases", default="", help=f"comma-separated names (default: all): {', '.join(CASES)}")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--no-dynamic", action="store_true", help="skip the ten-sizes dynamic=True run")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [c for c in args.cases.split(",") if c] or list(CASES)
    unknown = [c for c in names if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {list(CASES)}")
    out = Output("benchmarks.bench_compile", argv, args.out, machine_info(), args.tag)
    out.log("compiled: torch.compile(model, fullgraph=True), inductor; median of interleaved rounds; times in ms")
    results: List[Result] = []
    per_case: Dict[str, dict] = {name: run_case(CASES[name], args, results, out.log) for name in names}
    dynamic: Optional[dict] = None if args.no_dynamic else dynamic_sizes(args, out.log)
    out.save(dict(cases=per_case, dynamic=dynamic, reps=args.reps, threads=args.threads), results)
    plot_ratios(out.png, out.header, per_case)
    out.close()


if __name__ == "__main__":
    main()
