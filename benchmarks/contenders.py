"""The contenders bench_kernels times on one graph (every CPU backend, `auto` on a Graph, the raw edge_index
and compiled, the peers of benchmarks/peers.py), each with a note and a memory estimate to skip hopeless runs."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import (
    available_backends,
    backend_names,
    backends_for,
    choose_auto,
    dense_attention,
    guard,
    local,
    memory,
    plan,
    register_backend,
    registered_backend,
)

from . import peers
from .families import COMPILE_FAMILIES, FLEX_FAMILIES, Family
from .peers import DIM, HEADS

EXACT = ("sdpa", "sdpa-masked", "pyg", "pyg (compiled)", "flex_attention")  # exact softmax: checked against clamp=None
# build(q, k, v) -> (the no-argument call a contender is timed with, its memory estimate where the builder
# makes one (else 0), a remark for its note); None: not run, the note says why
Build = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Tuple[Callable[[], torch.Tensor], float, str]]
# (build, note, peak bytes estimate: of fwd+bwd, the forward taken as half; or (fwd, fwd+bwd))
Contender = Tuple[Optional[Build], str, Union[float, Tuple[float, float]]]


def estimate_bytes(name: str, g: graphs.Graph) -> float:
    """Rough fwd+bwd peak of a contender on this graph (used only to skip hopeless runs)."""
    e, n = g.num_edges, g.num_src + g.num_dst
    if name in ("reference", "scatter", "pyg", "pyg (compiled)"):
        return e * HEADS * DIM * 4 * 7
    if name in ("csr", "auto", "auto (raw)", "auto (compiled)"):
        return e * HEADS * 4 * 12 + n * HEADS * DIM * 4 * 10
    if name == "dense":
        return sum(bk.b * bk.lq * bk.lk for bk in plan(g).buckets) * HEADS * 4 * 6
    return 0.0


def compiled_pyg_bytes(g: graphs.Graph) -> Tuple[float, float]:
    """(fwd, fwd+bwd) rough peak of PyG's recipe under torch.compile: Inductor fuses the forward's
    per-edge gathers (measured +48 MiB forward on a window of 1.05M edges, where eager PyG takes
    6 GiB), while its backward keeps (E, H, D) tensors (measured 2.2-2.7 KiB per edge fwd+bwd)."""
    e, n = g.num_edges, g.num_src + g.num_dst
    return e * HEADS * 4 * 4 + n * HEADS * DIM * 4 * 2, e * HEADS * DIM * 4 * 2


def needed_bytes(estimate: Union[float, Tuple[float, float]], mode: str) -> float:
    """A contender's peak estimate for one pass ("fwd" or "fwd+bwd")."""
    if isinstance(estimate, tuple):
        return estimate[0] if mode == "fwd" else estimate[1]
    return estimate * (1.0 if mode == "fwd+bwd" else 0.5)


def _plain(fn: Callable[..., torch.Tensor]) -> Build:
    return lambda *leaves: ((lambda: fn(*leaves)), 0.0, "")


class _SmallPages(torch.autograd.Function):
    """edge_attention(q, k, v, g) with kernels.memory's huge pages switched off in its forward and its
    backward (the `auto (4 KiB pages)` contender: what the large buffers cost on torch's allocator)."""

    @staticmethod
    def forward(ctx, g: graphs.Graph, train: bool, q, k, v):
        leaves = [x.detach().requires_grad_(train) for x in (q, k, v)]
        with torch.set_grad_enabled(train), memory.huge_pages(False):
            out = edge_attention(*leaves, g)
        ctx.leaves, ctx.out = leaves, out
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        with memory.huge_pages(False):
            grads = torch.autograd.grad(ctx.out, ctx.leaves, grad)
        return (None, None, *grads)


def _small_pages(g: graphs.Graph) -> Build:
    def call(q, k, v):
        return _SmallPages.apply(g, torch.is_grad_enabled() and q.requires_grad, q, k, v)

    return _plain(call)


# the tile kernels as registered backends without the finiteness check that "local" and "dense" put around
# them (kernels/guard.py), for the `auto (unchecked)` contender: edge_attention's own work stays in both.
# Registered when that contender is built, not at import: a process that only imports this module
# (the tests) keeps the library's registry as it ships.
UNCHECKED = {"local": local.local_attention, "dense": dense_attention}


def _register_unchecked(name: str) -> str:
    unchecked = f"{name} (unchecked)"
    if unchecked not in backend_names():
        register_backend(replace(registered_backend(name), name=unchecked, fn=UNCHECKED[name]))
    return unchecked


class CheckTimer:
    """The time `auto`'s calls spend in the finiteness check of the tile kernels (kernels/guard.py's
    `all_finite`, wrapped once for the process): `wrap(fn, into)` appends each call's ms to `into`."""

    def __init__(self) -> None:
        self.spent = 0.0
        original = guard.all_finite

        def timed(tensors):
            start = time.perf_counter()
            try:
                return original(tensors)
            finally:
                self.spent += time.perf_counter() - start

        guard.all_finite = timed

    def wrap(self, fn: Callable[[], object], into: List[float]) -> Callable[[], object]:
        def call():
            before = self.spent
            result = fn()
            into.append((self.spent - before) * 1e3)
            return result

        return call


def _unchecked(g: graphs.Graph, q: torch.Tensor) -> Optional[Build]:
    """`auto`'s call on g run by its tile kernel without the finiteness check: what that check costs.
    None where `auto` runs no tile kernel."""
    chosen = choose_auto(q, g)
    if chosen not in UNCHECKED:
        return None
    backend = _register_unchecked(chosen)
    return _plain(lambda *qkv: edge_attention(*qkv, g, backend=backend))


def _peer(make: Callable[..., tuple], *graph) -> Build:
    """A peers.make_* builder that returns (call, bytes estimate[, label])."""
    return lambda *leaves: (*make(*graph, *leaves)[:2], "")


def _sdpa_exact(g: graphs.Graph, info: dict) -> Build:
    def build(*leaves):
        call = peers.make_sdpa_exact(g, *leaves)
        info["sdpa_kernel"] = peers.sdpa_kernel_name(call)
        return call, 0.0, info["sdpa_kernel"]

    return build


def _compiled_pyg(g: graphs.Graph) -> Build:
    """PyG's recipe (peers.make_pyg) under one torch.compile line, as a PyG user would write it; the
    first call (and its backward when the leaves record) compiles, timed apart (the row's compile_s).
    dynamic=False: each family's shapes compile on their own (every family shares make_pyg's code object,
    so automatic dynamic shapes would carry one family's recompiles into the next)."""

    def build(*leaves):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)  # one per family
        call = torch.compile(peers.make_pyg(g, *leaves)[0], dynamic=False)
        out = call()
        if out.requires_grad:
            torch.autograd.grad(out, leaves, torch.ones_like(out))
        return call, 0.0, "first call compiles (compile_s), not timed"

    return build


def contenders_for(fam: Family, g: graphs.Graph, q: torch.Tensor, args, info: dict) -> Dict[str, Contender]:
    """name -> (build, note, estimate) of every contender on `g` (`info`: its family_info, which gets the
    SDPA kernel the exact `sdpa` peer runs), those of --contenders if given."""
    out: Dict[str, Contender] = {}
    cpu = backends_for("cpu") + ["auto"]
    for name in available_backends() + ["auto"]:
        if name.endswith("(unchecked)"):
            continue  # `auto (unchecked)` below
        if name == "dense" and not g.blocks:
            out[name] = (None, "not applicable: graph has no dense blocks", 0)
        elif name not in cpu:
            out[name] = (None, "not applicable: takes no CPU tensors", 0)
        elif name == "local" and not local.takes(g):  # random graphs: refused by the backend
            out[name] = (None, "not applicable: graph is not locally dense", 0)
        else:
            call = _plain(lambda *qkv, b=name: edge_attention(*qkv, g, backend=b))
            out[name] = (call, f"-> {choose_auto(q, g)}" if name == "auto" else "", estimate_bytes(name, g))
    out.setdefault("scatter", (None, "skipped: torch_scatter not importable", 0))
    unchecked = _unchecked(g, q)
    if unchecked is None:
        out["auto (unchecked)"] = (None, "not applicable: auto runs no tile kernel here", 0)
    else:
        note = "the tile kernel without its finiteness check (kernels/guard.py)"
        out["auto (unchecked)"] = (unchecked, note, estimate_bytes("auto", g))
    raw = _plain(lambda *qkv, ei=g.edge_index: edge_attention(*qkv, ei))
    out["auto (raw)"] = (raw, "edge_index tensor: builds per call", estimate_bytes("auto", g))
    if memory.huge_pages_available():
        note = "kernels.memory's huge pages switched off: large buffers on torch's allocator"
        out["auto (4 KiB pages)"] = (_small_pages(g), note, estimate_bytes("auto", g))
    asked = not args.contenders or "auto (locality order)" in args.contenders.split(",")
    if asked and g.num_src == g.num_dst and not g.blocks:
        t0 = time.perf_counter()
        graphs.locality_view(g)  # found once per graph (cached on it): timed here, apart from the calls
        note = f"kernel_options node_order='locality' (order found once: {time.perf_counter() - t0:.2f} s)"
        call = _plain(lambda *qkv: edge_attention(*qkv, g, kernel_options={"node_order": "locality"}))
        out["auto (locality order)"] = (call, note, estimate_bytes("auto", g))
    if fam.name in COMPILE_FAMILIES:  # on the graph the eager contenders used (its structure cached)
        compiled = lambda *leaves: _plain(torch.compile(lambda *qkv: edge_attention(*qkv, g), fullgraph=True))(*leaves)
        out["auto (compiled)"] = (compiled, "torch.compile(fullgraph=True), inductor", estimate_bytes("auto", g))
    if fam.lengths is not None and fam.kind in ("full", "causal"):
        if all(x == fam.lengths[0] and x[0] == x[1] for x in fam.lengths):
            out["sdpa"] = (_sdpa_exact(g, info), "unmasked SDPA on (B, H, L, D) views, exact softmax", 0)
        else:
            out["sdpa"] = (None, "not applicable: needs a uniform batch of square blocks", 0)
    key = g.dst * max(g.num_src, 1) + g.src  # repeated (source, destination) pairs: graphs.random draws them
    if fam.lengths is None and bool(torch.unique(key).numel() < key.numel()):
        out["sdpa-masked"] = (None, "not applicable: repeated edges, which a boolean mask holds once", 0)
    else:
        out["sdpa-masked"] = (_peer(peers.make_sdpa, fam, g), "padded batch + boolean mask", 0)
    if fam.lengths is not None:
        out["dense bmm"] = (_peer(peers.make_dense_bmm, fam, g), "padded bmm + clamp-exp, no graph", 0)
    wanted: List[str] = args.contenders.split(",") if args.contenders else []
    try:  # imported only when asked for (a second or two)
        label = peers.pyg_label() if not wanted or any(n.startswith("pyg") for n in wanted) else ""
        out["pyg"] = (_peer(peers.make_pyg, g), label, estimate_bytes("pyg", g))
        out["pyg (compiled)"] = (_compiled_pyg(g), f"{label}, torch.compile", compiled_pyg_bytes(g))
    except ImportError:
        out["pyg"] = (None, "skipped: torch_geometric is not installed", 0)
        out["pyg (compiled)"] = (None, "skipped: torch_geometric is not installed", 0)
    if args.flex == "all" or (args.flex == "default" and fam.name in FLEX_FAMILIES):
        flex: Build = lambda *leaves: (peers.make_flex(g, *leaves)[0], 0.0, "")
        out["flex_attention"] = (flex, "torch.compile(flex_attention) + block mask", 0)
    else:
        note = "skipped: compiling takes ~1 min per shape and pass on this machine; run with --flex all"
        out["flex_attention"] = (None, note, 0)
    out["dgl"] = (None, "in its own environment (torch 2.2): python -m benchmarks.bench_dgl", 0)
    return {n: c for n, c in out.items() if not wanted or n in wanted}
