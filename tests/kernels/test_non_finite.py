"""NaN and inf reach only what the edges connect them to, on every backend and "auto".

The contract (sparseattn/kernels/guard.py): out has a non-finite element exactly where the
reference's has one; a gradient is non-finite only in rows connected to a touched destination
(one with an edge that reads a non-finite q, k, v, bias or edge-term value, or whose incoming
gradient is non-finite): dq at it, dk and dv at its edges' sources, bias and edge terms at its
edges; every other row equals the reference's. The graphs are the ones the tile backends take
("auto" picks local or dense on each, asserted), with one bad value in one row of q, k, v, bias,
an edge term or the incoming gradient, in rows inside the graph and in padding rows outside it.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, Optional

import pytest
import torch
from torch import Tensor

from sparseattn import Graph, edge_attention, graphs
from sparseattn.kernels import choose_auto, local

from ..optional import backend_param, backend_params
from ..tolerances import assert_close

H, D = 2, 8
VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
CLAMPS = {"clamp": (-5.0, 5.0), "exact": None}
TERMS = ("edge_key", "edge_value", "edge_scale")


def padded_windows(count: int = 4, length: int = 100, slot: int = 112, radius: int = 32) -> Graph:
    """`count` windows of `length` tokens in slots of `slot` rows: the rows after each window are in
    no edge, as padding kept out of the graph."""
    edges = [graphs.window(length, radius=radius).edge_index + slot * i for i in range(count)]
    return Graph(torch.cat(edges, 1), count * slot, count * slot)


# name -> (graph, the backend "auto" picks for it, a row inside the graph, a row outside it or None)
FAMILIES = {
    "window": (lambda: graphs.window(240, radius=32), "local", 120, None),
    "band": (lambda: graphs.window(240, radius=64, causal=True), "local", 100, None),
    "windows": (lambda: graphs.batch([graphs.window(100, radius=32)] * 3), "local", 99, None),
    "complete-no-self": (lambda: graphs.batch([graphs.complete(64, self_loops=False)] * 4), "local", 63, None),
    "padding": (padded_windows, "local", 50, 105),
    "causal": (lambda: graphs.batch([graphs.causal(64)] * 8), "dense", 63, None),
    "complete": (lambda: graphs.batch([graphs.complete(48)] * 5), "dense", 47, None),
    "cross": (lambda: graphs.batch([graphs.bipartite(40, 30)] * 16), "dense", 39, None),
    # padded buckets of complete blocks, which dense runs unchecked (all pairs are edges, padding is zeros)
    "complete-varlen": (lambda: graphs.batch([graphs.complete(n) for n in (20, 33, 47, 64, 12, 40)]), "csr", 60, None),
}


def rows_bad(x: Tensor) -> Tensor:
    """(N,) whether row i of x (N, ...) has a non-finite element."""
    return ~torch.isfinite(x.reshape(x.shape[0], -1)).all(1)


def touched(g: Graph, inputs: Dict[str, Optional[Tensor]], grad_out: Tensor) -> Tensor:
    """(N_dst,) the destinations with an edge that reads a non-finite value, or a non-finite incoming gradient."""
    src, dst = g.src, g.dst
    bad_edge = rows_bad(inputs["q"])[dst] | rows_bad(inputs["k"])[src] | rows_bad(inputs["v"])[src]
    for name in ("bias", *TERMS):
        if inputs.get(name) is not None:
            bad_edge |= rows_bad(inputs[name])
    hit = torch.zeros(g.num_dst, dtype=torch.bool).index_fill_(0, dst[bad_edge], True)
    return hit | rows_bad(grad_out)


def attend(backend: str, g: Graph, inputs, grad_out, clamp):
    """out, weights (or None) and the gradient of every input tensor, float64, on the CPU; triton
    runs on CUDA where there is one (its interpreter on CPU tensors otherwise)."""
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    if device != "cpu":
        g, grad_out = g.to(device), grad_out.to(device)
    leaves = {n: None if t is None else t.to(device, copy=True).requires_grad_() for n, t in inputs.items()}
    with_weights = leaves.get("bias") is not None
    result = edge_attention(
        leaves["q"], leaves["k"], leaves["v"], g, clamp=clamp, backend=backend, return_weights=with_weights,
        **{n: t for n, t in leaves.items() if n not in "qkv"},
    )  # fmt: skip
    out, weights = result if with_weights else (result, None)
    out.backward(grad_out)
    return (
        out.detach().cpu(),
        None if weights is None else weights.detach().cpu(),
        {n: t.grad.cpu() for n, t in leaves.items() if t is not None},
    )


_REFERENCE: dict = {}


def _reference(g: Graph, inputs, grad_out, clamp):
    """`attend("reference", ...)`, once per (inputs, clamp): the cases reuse their input tensors."""
    key = (id(g), *(id(t) for t in inputs.values()), id(grad_out), clamp)
    if key not in _REFERENCE:
        result = attend("reference", g, inputs, grad_out, clamp)
        _REFERENCE[key] = (result, (g, inputs, grad_out))  # the inputs kept alive: their ids stay theirs
    return _REFERENCE[key][0]


def check_contract(g: Graph, inputs, grad_out, clamp, backend: str) -> None:
    """The module docstring's contract for `backend` against the reference on these inputs."""
    out, weights, grads = attend(backend, g, inputs, grad_out, clamp)
    ref_out, ref_weights, ref_grads = _reference(g, inputs, grad_out, clamp)
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref_out)), (
        f"{backend}: {int(rows_bad(out).sum())} destinations with a non-finite output, the reference "
        f"{int(rows_bad(ref_out).sum())}"
    )
    finite = torch.isfinite(ref_out)
    assert_close(out[finite], ref_out[finite], torch.float64, f"{backend} out")
    if weights is not None:
        assert torch.equal(torch.isfinite(weights), torch.isfinite(ref_weights)), f"{backend}: weights' pattern"
        assert_close(weights[torch.isfinite(weights)], ref_weights[torch.isfinite(weights)], torch.float64)
    hit = touched(g, inputs, grad_out)
    hit_edges = hit[g.dst]
    hit_sources = torch.zeros(g.num_src, dtype=torch.bool).index_fill_(0, g.src[hit_edges], True)
    allowed = {"q": hit, "k": hit_sources, "v": hit_sources, "bias": hit_edges, **{n: hit_edges for n in TERMS}}
    assert not rows_bad(ref_out)[~hit].any(), "the reference's output is non-finite at an untouched destination"
    for name, grad in grads.items():
        free = ~allowed[name]
        stray = int((rows_bad(grad) & free).sum())
        assert stray == 0, f"{backend}: d{name} non-finite in {stray} rows connected to no touched destination"
        assert not rows_bad(ref_grads[name])[free].any(), f"reference: d{name} non-finite outside the contract"
        assert_close(grad[free], ref_grads[name][free], torch.float64, f"{backend} d{name}")


def make_inputs(g: Graph, seed: int = 0, bias: bool = False, terms: bool = False):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    inputs = {"q": rand(g.num_dst, H, D), "k": rand(g.num_src, H, D), "v": rand(g.num_src, H, D)}
    if bias:
        inputs["bias"] = rand(g.num_edges, H)
    if terms:
        inputs.update(edge_key=rand(g.num_edges, H, D), edge_value=rand(g.num_edges, H, D))
        inputs["edge_scale"] = 1 + 0.1 * rand(g.num_edges, H, D)
    return inputs, rand(g.num_dst, H, D)


def spoil(x: Tensor, row: int, value: float, whole_row: bool) -> None:
    """Write value into row `row` of x: every element, or one (the first head's first channel)."""
    if whole_row:
        x[row] = value
    else:
        x[row].view(-1)[0] = value


# (value, whole row or one element): NaN and -inf in a whole row (h, d), inf in one element
SPOILS = {"nan-row": (math.nan, True), "inf-one": (math.inf, False), "-inf-row": (-math.inf, True)}
TILE_BACKENDS = [*backend_params(["reference", "csr", "scatter", "dense", "local"]), "auto"]


@functools.lru_cache(maxsize=None)
def family_case(family: str, place: str, row: int, spoil_name: str):
    """The family's graph and inputs with one bad value at `place` (q, k, v or grad_out) row `row`."""
    g = FAMILIES[family][0]()
    inputs, grad_out = make_inputs(g)
    target = grad_out if place == "grad_out" else inputs[place]
    spoil(target, row, *SPOILS[spoil_name])
    return g, inputs, grad_out


def placements(family: str):
    """(place, row) pairs: each of q, k, v and the gradient at the row inside the graph, and at the
    padding row where the family has one (not past the destinations of a cross-attention graph)."""
    _, _, inside, outside = FAMILIES[family]
    rows = [inside] if outside is None else [inside, outside]
    return [(place, row) for place in ("q", "k", "v", "grad_out") for row in rows]


@pytest.mark.parametrize("backend", TILE_BACKENDS)
@pytest.mark.parametrize("clamp", CLAMPS.values(), ids=CLAMPS.keys())
@pytest.mark.parametrize("family", FAMILIES)
def test_a_bad_value_in_q_k_v_or_the_gradient_stays_on_its_edges(family, clamp, backend):
    make_graph, auto, _, _ = FAMILIES[family]
    g = make_graph()
    assert choose_auto(make_inputs(g)[0]["q"], g) == auto  # the tile backends are what "auto" runs here
    if backend == "dense" and not g.blocks or backend == "local" and not local.takes(g):
        pytest.skip(f"backend {backend!r} does not take the {family} graph")
    for place, row in placements(family):
        for spoil_name in SPOILS:
            g, inputs, grad_out = family_case(family, place, row, spoil_name)
            try:
                check_contract(g, inputs, grad_out, clamp, backend)
            except AssertionError as e:
                raise AssertionError(f"{spoil_name} in {place}[{row}]: {e}") from e


@pytest.mark.parametrize("backend", [*backend_params(["reference", "csr", "scatter", "dense", "local"]), "auto"])
@pytest.mark.parametrize("clamp", CLAMPS.values(), ids=CLAMPS.keys())
@pytest.mark.parametrize("family", ["window", "complete", "padding"])
def test_a_bad_bias_stays_on_its_edge_with_weights_returned(family, clamp, backend):
    """dense computes a bias in its materialized path; local hands it to csr."""
    make_graph, _, inside, _ = FAMILIES[family]
    g = make_graph()
    if backend == "dense" and not g.blocks or backend == "local" and not local.takes(g):
        pytest.skip(f"backend {backend!r} does not take the {family} graph")
    inputs, grad_out = make_inputs(g, bias=True)
    edge = int(torch.nonzero(g.dst == inside)[0])
    for value in VALUES.values():
        bad = {n: t.clone() for n, t in inputs.items()}
        bad["bias"][edge, 0] = value
        check_contract(g, bad, grad_out, clamp, backend)


@pytest.mark.parametrize("backend", [*backend_params(["reference", "csr", "scatter"]), "auto"])
@pytest.mark.parametrize("term", TERMS)
def test_a_bad_edge_term_stays_on_its_edge(term, backend):
    g = FAMILIES["window"][0]()
    inputs, grad_out = make_inputs(g, terms=True)
    edge = int(torch.nonzero(g.dst == 120)[0])
    for clamp in CLAMPS.values():
        for value in VALUES.values():
            bad = {n: t.clone() for n, t in inputs.items()}
            bad[term][edge, 0, 0] = value
            check_contract(g, bad, grad_out, clamp, backend)


def test_tiles_with_finite_inputs_stay_on_the_tiles(monkeypatch):
    """The check routes only bad calls: with finite inputs the sparse backend is never called, with a
    NaN (forward) or an inf that only the gradients show (clamp mode: clamp(inf) is finite) it is."""
    from sparseattn.kernels import _BACKENDS, csr_attention
    from sparseattn.kernels.guard import checked
    from sparseattn.kernels.local import local_attention

    calls = []

    def sparse(inputs):
        calls.append(inputs.q.requires_grad)
        return csr_attention(inputs)

    monkeypatch.setattr(_BACKENDS["local"], "fn", checked(local_attention, sparse))
    g = FAMILIES["window"][0]()
    inputs, grad_out = make_inputs(g)
    attend("local", g, inputs, grad_out, (-5.0, 5.0))
    assert not calls
    inputs["k"][120] = math.nan
    attend("local", g, inputs, grad_out, (-5.0, 5.0))
    assert calls == [True]  # the forward's result was not finite: csr's forward, and its graph for the backward
    calls.clear()
    inputs["k"][120] = 1.0
    inputs["k"][120, 0, 0] = math.inf  # every score of the row is +-inf, clamped: a finite output
    out, _, _ = attend("local", g, inputs, grad_out, (-5.0, 5.0))
    assert torch.isfinite(out).all() and calls == [True]  # the tiles' gradients were not finite: csr's


@pytest.mark.parametrize("backend", ["dense", "auto"])
def test_blocks_that_show_their_inputs_finite_check_the_incoming_gradient_only(monkeypatch, backend):
    """Causal blocks whose clamp cannot bind run on SDPA, and the clamp test's norms show q and k
    finite (guard.claim_finite_inputs): the backward reads the incoming gradient (one tensor) instead
    of dq, dk and dv. Where the clamp can bind, or a value is bad, it checks all three, and the
    contract holds with a bad value in q, k, v or the incoming gradient, in either mode."""
    from sparseattn.kernels import guard

    reads = []
    all_finite = guard.all_finite
    monkeypatch.setattr(guard, "all_finite", lambda ts: reads.append(sum(t is not None for t in ts)) or all_finite(ts))
    g = FAMILIES["causal"][0]()
    inputs, grad_out = make_inputs(g)
    small = {n: 0.3 * t for n, t in inputs.items()}  # |scale * q . k| < 5 on every pair
    clamp = CLAMPS["clamp"]
    attend(backend, g, small, grad_out, clamp)
    assert reads == [1, 1]  # out in the forward, the incoming gradient in the backward
    reads.clear()
    attend(backend, g, {n: 3 * t for n, t in inputs.items()}, grad_out, clamp)  # the clamp binds: tiles
    assert reads == [1, 3]
    _, _, inside, _ = FAMILIES["causal"]
    for place in ("q", "k", "v", "grad_out"):
        for spoil_name in SPOILS:
            bad = {n: t.clone() for n, t in small.items()}
            bad_grad = grad_out.clone()
            spoil(bad_grad if place == "grad_out" else bad[place], inside, *SPOILS[spoil_name])
            for mode in CLAMPS.values():
                try:
                    check_contract(g, bad, bad_grad, mode, backend)
                except AssertionError as e:
                    raise AssertionError(f"{spoil_name} in {place}[{inside}]: {e}") from e


def test_dense_checks_only_buckets_with_pairs_that_are_not_edges():
    """Complete and bipartite blocks are all edges (their padding zeros): dense runs them unchecked,
    and the contract holds there anyway (the families above); causal and no-self blocks are checked."""
    from sparseattn.kernels.dense import plan

    assert not plan(FAMILIES["complete"][0]()).reaches_non_edges
    assert not plan(FAMILIES["cross"][0]()).reaches_non_edges
    assert not plan(FAMILIES["complete-varlen"][0]()).reaches_non_edges
    assert plan(FAMILIES["causal"][0]()).reaches_non_edges
    assert plan(graphs.batch([graphs.complete(16, self_loops=False)] * 3)).reaches_non_edges


def test_a_second_backward_and_double_backward_through_the_check():
    """retain_graph=True: the second backward recomputes (with csr) and gives the same gradients;
    create_graph=True gives gradients that differentiate again, equal to the reference's."""
    g = FAMILIES["window"][0]()
    inputs, grad_out = make_inputs(g)
    q, k, v = (inputs[n].clone().requires_grad_() for n in "qkv")
    out = edge_attention(q, k, v, g, backend="local")
    first = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), grad_out)
    for a, b in zip(first, second):
        assert_close(a, b, torch.float64, "second backward")
    for backend in ("local", "reference"):
        q, k, v = (inputs[n].clone().requires_grad_() for n in "qkv")
        out = edge_attention(q, k, v, g, backend=backend)
        (dq,) = torch.autograd.grad(out, q, grad_out, create_graph=True)
        (ddk,) = torch.autograd.grad(dq.square().sum(), k)
        if backend == "local":
            local_ddk = ddk
    assert_close(local_ddk, ddk, torch.float64, "double backward")


@pytest.mark.triton
@pytest.mark.parametrize("backend", [backend_param("triton")])
@pytest.mark.parametrize("clamp", CLAMPS.values(), ids=CLAMPS.keys())
def test_triton_keeps_bad_values_on_their_edges(clamp, backend):
    """Triton (its interpreter on CPU, slow: one call holds every kind of bad value, in rows far enough
    apart that the contract still tells them apart): windows in padded slots, NaN, inf and -inf in q,
    k, v, a bias and the gradient, inside the windows and in the padding."""
    g = padded_windows(count=3, length=14, slot=16, radius=4)
    inputs, grad_out = make_inputs(g, bias=True)
    inputs["q"][3] = math.nan
    inputs["k"][18, 0, 0] = math.inf
    inputs["v"][35] = -math.inf
    grad_out[8, 1, 2] = math.nan
    inputs["bias"][int(torch.nonzero(g.dst == 22)[0]), 1] = math.inf
    inputs["q"][47], inputs["k"][15], inputs["v"][31, 0, 0] = math.nan, math.nan, math.inf  # padding rows
    check_contract(g, inputs, grad_out, clamp, backend)


@pytest.mark.parametrize("backend", backend_params(["reference", "small", "csr", "scatter"]))
def test_a_destination_whose_every_score_is_minus_inf_gets_zero(backend):
    """Exact softmax where every in-edge of a destination scores -inf (a -inf bias on each: masked
    edges): that destination gets 0 and zero gradients, not NaN, and every other row is the
    reference's (the max shift must stay finite and the zero normalizer must not divide)."""
    gen = torch.Generator().manual_seed(3)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 1, 1, 2, 2, 3, 3]])
    q, k, v = (torch.randn(5, H, D, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    bias = torch.randn(edge_index.shape[1], H, dtype=torch.float64, generator=gen)
    bias[:3] = -math.inf  # every in-edge of destination 1
    bias = bias.requires_grad_()
    results = []
    for name in ("reference", backend):
        out = edge_attention(q, k, v, edge_index, clamp=None, bias=bias, backend=name)
        grads = torch.autograd.grad(out, (q, k, v, bias), torch.ones_like(out))
        results.append((out, grads))
    (expected, expected_grads), (got, got_grads) = results
    assert torch.isfinite(got).all() and not got[1].any()
    assert_close(got, expected, torch.float64, f"{backend} vs reference, all -inf scores")
    for g, e in zip(got_grads, expected_grads):
        assert torch.isfinite(g).all()
        assert_close(g, e, torch.float64, f"{backend} gradient vs reference, all -inf scores")
