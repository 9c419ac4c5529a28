"""The "auto" rule (docs/guide/backends.md): which backend it picks, and that the pick computes the same."""

import dataclasses
import types

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import (
    _BACKENDS,
    DENSE_MAX_SHAPES,
    DENSE_MIN_EDGES_PER_BLOCK,
    SMALL_MAX_VALUES,
    SMALL_MAX_VALUES_ONE_CALL,
    Backend,
    choose_auto,
)

# q of 8 heads of 64 channels: 512 values per edge, so that only graphs of at most 256 edges are "small"
CPU_Q = torch.zeros(1, 8, 64)


@pytest.mark.parametrize(
    "graph, expected",
    [
        (graphs.window(100, 8), "csr"),  # no blocks
        (graphs.random(50, 50, 400), "csr"),
        (graphs.batch([graphs.complete(128)] * 2), "dense"),  # 16384 edges per block, one shape
        (graphs.from_blocks([("full", 200, 100)] * 2), "dense"),  # cross attention
        (graphs.from_blocks([("causal", 256, 256)]), "dense"),
        (graphs.batch([graphs.causal(128)] * 2), "dense"),  # small, but unpadded causal: SDPA shapes
        (graphs.batch([graphs.complete(32)] * 6), "dense"),  # small, but one unpadded complete batch
        (graphs.from_blocks([("full", n, n) for n in (30, 31, 32)]), "csr"),  # small and padded: csr wins
        (graphs.batch([graphs.complete(32, self_loops=False)] * 6), "csr"),  # small, masked: not an SDPA shape
        (graphs.from_blocks([("full", n, n) for n in range(130, 136)]), "csr"),  # too many shapes
        (graphs.batch([graphs.complete(16)] * 2), "small"),  # 512 edges of 16 values (H=4, D=4)
        (graphs.batch([]), "small"),  # empty (edge_attention gives it to the reference)
    ],
)
def test_rule(graph, expected):
    q = torch.zeros(1, 4, 4) if expected == "small" else CPU_Q
    assert choose_auto(q, graph) == expected


def test_small_is_for_small_graphs_on_cpu_outside_export(monkeypatch):
    """ "small" up to SMALL_MAX_VALUES gathered values (E * H * max(D, Dv)) on a reused Graph and up to
    SMALL_MAX_VALUES_ONE_CALL on a graph seen once (a raw edge_index), before dense and local (a batch
    of tiny complete blocks runs there too); never for CUDA tensors or inside torch.export."""
    import sparseattn.kernels.auto as auto

    edges = SMALL_MAX_VALUES // 64  # at H=4, D=16
    fits = graphs.random(edges // 8, edges // 8, edges, seed=0)
    beyond = graphs.random(edges // 8, edges // 8, edges + 1, seed=0)
    q = torch.zeros(1, 4, 16)
    assert choose_auto(q, fits) == "small"
    assert choose_auto(q, beyond) != "small"
    assert choose_auto(q, fits, value_dim=32) != "small"  # Dv counts
    assert choose_auto(q, graphs.batch([graphs.complete(8)] * 8)) == "small"  # not dense
    once = SMALL_MAX_VALUES_ONE_CALL // 64
    seen_once = graphs.Graph.borrowed(graphs.random(once // 8, once // 8, once, seed=0).edge_index, one_call=True)
    assert seen_once.one_call and choose_auto(q, seen_once) == "small"
    more = graphs.Graph.borrowed(graphs.random(once // 8, once // 8, once + 1, seed=0).edge_index, one_call=True)
    assert choose_auto(q, more) != "small"
    # per-edge key/value terms: the one-call bound on a reused Graph too (csr pays more for them)
    reused = graphs.random(once // 8, once // 8, once, seed=0)
    assert choose_auto(q, reused, edge_terms=True) != "small"
    assert choose_auto(q, reused, edge_terms=True, edge_kv=True) == "small"
    assert (
        choose_auto(q, graphs.random(once // 8, once // 8, once + 1, seed=0), edge_terms=True, edge_kv=True) != "small"
    )
    cuda_q = types.SimpleNamespace(device=torch.device("cuda"), shape=(1, 4, 16))
    assert choose_auto(cuda_q, fits) != "small"
    monkeypatch.setattr(auto, "exporting", lambda: True)
    assert choose_auto(q, fits) == "csr"


def test_edge_key_and_value_alone_widen_the_small_bound(monkeypatch):
    """edge_attention tells auto that a call's edge terms are edge_key / edge_value alone: on a reused
    Graph between the two bounds such a call runs "small", one with edge_scale (which "small" hands to
    the reference) or without terms does not."""
    edges = SMALL_MAX_VALUES_ONE_CALL // 64
    g = graphs.random(edges // 8, edges // 8, edges, seed=0)
    q = k = v = torch.randn(edges // 8, 4, 16)
    e = torch.randn(edges, 4, 16)
    ran = []
    for name in ("small", "csr"):
        real = _BACKENDS[name]
        recorded = lambda inputs, fn=real.fn, name=name: (ran.append(name), fn(inputs))[1]  # noqa: E731
        monkeypatch.setitem(_BACKENDS, name, dataclasses.replace(real, fn=recorded))
    edge_attention(q, k, v, g, edge_key=e, edge_value=e)
    edge_attention(q, k, v, g, edge_key=e, edge_scale=torch.rand(edges, 4, 16))
    edge_attention(q, k, v, g)
    assert ran == ["small", "csr", "csr"]


def test_dense_needs_enough_edges_per_block():
    """Masked blocks (no SDPA shape) go to dense from the edges-per-block threshold on: one edge
    block that clears it picks dense, one just under it csr; the average over blocks counts."""
    assert 128 * 127 < DENSE_MIN_EDGES_PER_BLOCK <= 129 * 128  # full_no_self n x n holds n (n - 1) edges

    def blocks(*sizes):
        return graphs.from_blocks([("full_no_self", n, n) for n in sizes])

    assert choose_auto(CPU_Q, blocks(129)) == "dense"
    assert choose_auto(CPU_Q, blocks(128)) != "dense"  # csr, or local (complete blocks are locally dense)
    assert choose_auto(CPU_Q, blocks(130, 128)) == "dense"  # (16770 + 16256) / 2 clears it
    assert choose_auto(CPU_Q, blocks(129, 127)) != "dense"  # (16512 + 16002) / 2 does not


def test_dense_needs_few_distinct_block_shapes():
    """Blocks above the edge threshold in the most shapes the rule allows: dense; one more shape: csr."""
    at = DENSE_MIN_EDGES_PER_BLOCK
    shapes = [("full", at + i, 1) for i in range(DENSE_MAX_SHAPES + 1)]
    assert choose_auto(CPU_Q, graphs.from_blocks(shapes[:-1])) == "dense"
    assert choose_auto(CPU_Q, graphs.from_blocks(shapes)) == "csr"
    assert choose_auto(CPU_Q, graphs.from_blocks(shapes[:-1] * 2)) == "dense"  # repeats add no shape


def test_a_subgraph_loses_its_blocks():
    g = graphs.batch([graphs.complete(128)] * 2)
    assert choose_auto(CPU_Q, g) == "dense"
    # without its blocks a batch of complete blocks is still locally dense: "local" (on CPU)
    assert choose_auto(CPU_Q, g.edge_subgraph(torch.ones(g.num_edges, dtype=torch.bool))) == "local"


def test_cuda_prefers_triton_when_available_and_head_dim_fits(monkeypatch):
    g = graphs.window(100, 8)
    cuda_q = types.SimpleNamespace(device=torch.device("cuda"), shape=(100, 2, 64))  # only device/shape are read
    wide_q = types.SimpleNamespace(device=torch.device("cuda"), shape=(100, 2, 300))
    stand_in = Backend("triton", lambda *a, **k: None)
    monkeypatch.setitem(_BACKENDS, "triton", stand_in)
    assert choose_auto(cuda_q, g) == "triton"
    assert choose_auto(wide_q, g) == "csr"  # D > 256: the kernel's limit
    assert choose_auto(CPU_Q, g) == "csr"
    monkeypatch.setitem(_BACKENDS, "triton", Backend("triton", stand_in.fn, probe=lambda: "not installed"))
    assert choose_auto(cuda_q, g) == "csr"


@pytest.mark.parametrize(
    "graph",
    [
        graphs.window(60, 4),
        graphs.batch([graphs.complete(128)] * 2),
        graphs.from_blocks([("full", n, n) for n in (5, 9, 17, 3)]),
    ],
)
def test_auto_equals_reference(graph):
    q, k, v = (torch.randn(n, 2, 8, dtype=torch.float64) for n in (graph.num_dst, graph.num_src, graph.num_src))
    out = edge_attention(q, k, v, graph, backend="auto")
    ref = edge_attention(q, k, v, graph, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12)


def test_backends_declare_the_edge_terms_they_compute(monkeypatch):
    """`Backend.edge_terms` names terms: a call with one its backend does not declare is refused with
    the term named, "auto" picks only a backend that declares all of the call's (the reference, the
    definition, when none faster does), and True means the fixed set of the flag's days, so a backend
    registered with it never receives a term added since."""
    from sparseattn.kernels import get_backend
    from sparseattn.kernels.contract import EXTRAS, TERMS_OF_TRUE, declared_terms

    assert declared_terms(True) == TERMS_OF_TRUE and declared_terms(False) == frozenset()
    assert Backend("x", lambda i: i, edge_terms=True).edge_terms == TERMS_OF_TRUE
    with pytest.raises(ValueError, match="edge_not_a_term"):
        Backend("x", lambda i: i, edge_terms={"edge_key", "edge_not_a_term"})
    assert _BACKENDS["reference"].edge_terms == EXTRAS  # every term has its math there
    g, q = graphs.random(2000, 2000, 32_000, seed=0), torch.zeros(2000, 4, 16)  # beyond "small"
    assert choose_auto(q, g, {"edge_scale"}) == "csr"
    without_scale = dataclasses.replace(_BACKENDS["csr"], edge_terms=frozenset({"edge_key", "edge_value", "eps"}))
    monkeypatch.setitem(_BACKENDS, "csr", without_scale)
    assert choose_auto(q, g, {"edge_key"}) == "csr"
    assert choose_auto(q, g, {"edge_key", "edge_scale"}) == "reference"
    with pytest.raises(ValueError, match="backend 'csr' does not take edge_scale; use one of 'reference'"):
        get_backend("csr", q, g, edge_terms={"edge_scale"})
    k = torch.randn(2000, 4, 16)
    out = edge_attention(k, k, k, g, edge_scale=torch.ones(g.num_edges, 4, 16))  # auto: the reference
    torch.testing.assert_close(out, edge_attention(k, k, k, g, backend="reference"))


def test_small_runs_the_reference_for_terms_it_does_not_compute(monkeypatch):
    """ "small" declares every term and computes edge_key and edge_value itself (COMPUTED_TERMS): a call
    with any other term (edge_scale, eps, or one added since) goes to the reference, by that list."""
    from sparseattn.kernels import small

    calls = []
    monkeypatch.setattr(small, "reference_attention", lambda inputs: calls.append(inputs.extras) or (None, None))
    g = graphs.random(20, 20, 60, seed=0)
    q = torch.randn(20, 2, 4)
    small.small_attention(_inputs(q, g, edge_key=torch.randn(60, 2, 4)))
    assert calls == []
    small.small_attention(_inputs(q, g, edge_scale=torch.randn(60, 2, 4)))
    small.small_attention(_inputs(q, g, eps=1e-3))
    assert calls == [frozenset({"edge_scale"}), frozenset({"eps"})]
    monkeypatch.setattr(small, "COMPUTED_TERMS", frozenset({"edge_value"}))
    small.small_attention(_inputs(q, g, edge_key=torch.randn(60, 2, 4)))
    assert calls[-1] == frozenset({"edge_key"})


def _inputs(q, g, **terms):
    from sparseattn.kernels import AttentionInputs

    return AttentionInputs(q, q, q, g, 0.5, (-5.0, 5.0), None, None, False)._replace(**terms)


def test_stacked_projections_run_inside_a_trace_and_off_the_cpu_on_small_inputs():
    """`fuse_projections`: eagerly on a CPU never (measured slower), inside a trace always, on another
    device eagerly up to FUSED_PROJECTION_MAX_ROWS rows."""
    from sparseattn.kernels.auto import FUSED_PROJECTION_MAX_ROWS, fuse_projections

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not fuse_projections(8, cpu) and not fuse_projections(100_000, cpu)
    bound = FUSED_PROJECTION_MAX_ROWS
    assert fuse_projections(bound, cuda) and not fuse_projections(bound + 1, cuda)
    traced = torch.compile(lambda x: x + int(fuse_projections(100_000, cpu)), backend="eager", fullgraph=True)
    assert traced(torch.zeros(1)).item() == 1
