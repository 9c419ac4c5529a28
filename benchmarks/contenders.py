"""The contenders bench_kernels times on one graph: every backend that takes CPU tensors and
`auto`, `auto` on the raw edge_index, compiled `auto`, another checkout's `csr` and `auto`
(--baseline), and the peers of benchmarks/peers.py; each with a note and a memory estimate used to
skip runs that would not fit."""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import available_backends, backends_for, choose_auto, plan

from .families import COMPILE_FAMILIES, FLEX_FAMILIES, Family
from .harness import Result
from .kernels_report import BASELINE_CONTENDERS
from .peers import (
    DIM,
    HEADS,
    make_dense_bmm,
    make_flex,
    make_pyg,
    make_sdpa,
    make_sdpa_exact,
    pyg_label,
    sdpa_kernel_name,
)

EXACT = ("sdpa", "sdpa-masked", "pyg", "flex_attention")  # exact softmax: checked against clamp=None


def estimate_bytes(name: str, g: graphs.Graph) -> float:
    """Rough fwd+bwd peak of a contender on this graph (used only to skip hopeless runs)."""
    e, n = g.num_edges, g.num_src + g.num_dst
    if name in ("reference", "scatter", "pyg"):
        return e * HEADS * DIM * 4 * 7
    if name in ("csr", "auto", "auto (raw)", "auto (compiled)"):
        return e * HEADS * 4 * 12 + n * HEADS * DIM * 4 * 10
    if name == "dense":
        p = plan(g)
        return sum(bk.b * bk.lq * bk.lk for bk in p.buckets) * HEADS * 4 * 6
    return 0.0


Contenders = Dict[str, Tuple[object, str, float]]  # name -> (fn(q, k, v), a peer's tag, or None; note; bytes)


def _has_repeated_edges(g: graphs.Graph) -> bool:
    """Whether some (source, destination) pair occurs twice (`graphs.random` draws with replacement)."""
    key = g.dst * max(g.num_src, 1) + g.src
    return bool(torch.unique(key).numel() < key.numel())


def contenders_for(fam: Family, g: graphs.Graph, q: torch.Tensor, args) -> Contenders:
    contenders: Contenders = {}
    cpu = backends_for("cpu")
    for name in available_backends() + ["auto"]:
        if name == "dense" and not g.blocks:
            contenders[name] = (None, "not applicable: graph has no dense blocks", 0)
            continue
        if name not in cpu + ["auto"]:
            contenders[name] = (None, "not applicable: takes no CPU tensors", 0)
            continue
        note = f"-> {choose_auto(q, g)}" if name == "auto" else ""
        contenders[name] = (
            (lambda b: lambda q_, k_, v_: edge_attention(q_, k_, v_, g, backend=b))(name),
            note,
            estimate_bytes(name, g),
        )
    for name in ("scatter",):
        if name not in contenders:
            contenders[name] = (None, "skipped: torch_scatter not importable", 0)
    ei = g.edge_index
    contenders["auto (raw)"] = (
        lambda q_, k_, v_: edge_attention(q_, k_, v_, ei),
        "edge_index tensor: builds per call",
        estimate_bytes("auto", g),
    )
    if args.baseline_module is not None:
        base = args.baseline_module
        bg, bei = fam.build(base.graphs), ei.clone()
        for name in BASELINE_CONTENDERS:
            graph, backend = (bei, "auto") if name == "auto (raw)" else (bg, name)
            contenders[f"{name} [baseline]"] = (
                (lambda gr, b: lambda q_, k_, v_: base.edge_attention(q_, k_, v_, gr, backend=b))(graph, backend),
                f"--baseline {args.baseline_label}",
                estimate_bytes("auto", g),
            )
    if fam.name in COMPILE_FAMILIES:
        contenders["auto (compiled)"] = (
            "compiled",
            "torch.compile(fullgraph=True), inductor",
            estimate_bytes("auto", g),
        )
    if fam.lengths is not None and fam.kind in ("full", "causal"):
        uniform = all(x == fam.lengths[0] and x[0] == x[1] for x in fam.lengths)
        contenders["sdpa"] = (
            "sdpa-exact" if uniform else None,
            "unmasked SDPA on (B, H, L, D) views, exact softmax"
            if uniform
            else "not applicable: needs a uniform batch of square blocks",
            0,
        )
    if fam.lengths is None and _has_repeated_edges(g):
        contenders["sdpa-masked"] = (None, "not applicable: repeated edges, which a boolean mask holds once", 0)
    else:
        contenders["sdpa-masked"] = ("sdpa", "padded batch + boolean mask", 0)
    if fam.lengths is not None:
        contenders["dense bmm"] = ("bmm", "padded bmm + clamp-exp, no graph", 0)
    try:  # imported only when asked for (a second or two)
        wanted = not args.contenders or "pyg" in args.contenders.split(",")
        contenders["pyg"] = ("pyg", pyg_label() if wanted else "", estimate_bytes("pyg", g))
    except ImportError:
        contenders["pyg"] = (None, "skipped: torch_geometric is not installed", 0)
    if args.flex == "all" or (args.flex == "default" and fam.name in FLEX_FAMILIES):
        contenders["flex_attention"] = ("flex", "torch.compile(flex_attention) + block mask", 0)
    else:
        contenders["flex_attention"] = (
            None,
            "skipped: compiling takes ~1 min per shape and pass on this machine; run with --flex all",
            0,
        )
    contenders["dgl"] = (None, "in its own environment (torch 2.2): python -m benchmarks.bench_dgl", 0)
    if args.contenders:
        contenders = {n: c for n, c in contenders.items() if n in args.contenders.split(",")}
    return contenders


def make_call(
    spec, fam: Family, g: graphs.Graph, leaves, r: Result, info: dict
) -> Tuple[Callable[[], torch.Tensor], float]:
    """The no-argument call a contender is timed with, and its memory estimate where the builder
    makes one (else 0: the contender's own estimate stands)."""
    est = 0.0
    if spec == "sdpa":
        call, est = make_sdpa(fam, g, *leaves)
    elif spec == "sdpa-exact":
        call = make_sdpa_exact(g, *leaves)
        info["sdpa_kernel"] = sdpa_kernel_name(call)
        r.note += f"; {info['sdpa_kernel']}"
    elif spec == "compiled":  # on the graph the eager contenders used (its structure cached)
        compiled = torch.compile(lambda q_, k_, v_: edge_attention(q_, k_, v_, g), fullgraph=True)
        call = (lambda c, args: lambda: c(*args))(compiled, leaves)
    elif spec == "bmm":
        call, est = make_dense_bmm(fam, g, *leaves)
    elif spec == "pyg":
        call, est, r.note = make_pyg(g, *leaves)
    elif spec == "flex":
        call = make_flex(fam, g, *leaves)
    else:
        call = (lambda fn_, args: lambda: fn_(*args))(spec, leaves)
    return call, est
