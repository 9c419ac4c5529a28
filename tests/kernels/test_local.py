"""The local backend: windows and a 2-D mesh as tiles over source spans, against the reference and
the dense masked attention in float64 (values and gradients); its plan, auto's choice, its limits."""

import math

import pytest
import torch

from sparseattn import Graph, edge_attention, graphs
from sparseattn.kernels import choose_auto, local
from sparseattn.kernels.contract import AttentionInputs
from sparseattn.kernels.local import LocalAttention, local_attention, plan

from ..dense import dense_attention

CLAMPS = [(-5.0, 5.0), (-0.3, 0.3), None]  # not binding, binding, exact softmax
CPU_Q = torch.zeros(1, 8, 64)  # wide enough that these graphs are not "small"


def mesh(width: int, height: int, self_loops: bool = True) -> Graph:
    """A width x height grid in row-major order, each node attending to its 8 neighbours (and
    itself): a locally dense graph that is not a window (its rows' spans are 3 grid rows)."""
    x, y = torch.meshgrid(torch.arange(width), torch.arange(height), indexing="xy")
    x, y = x.flatten(), y.flatten()
    src, dst = [], []
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            if (dx, dy) == (0, 0) and not self_loops:
                continue
            keep = (x + dx >= 0) & (x + dx < width) & (y + dy >= 0) & (y + dy < height)
            dst.append((y * width + x)[keep])
            src.append(((y + dy) * width + x + dx)[keep])
    return Graph(torch.stack([torch.cat(src), torch.cat(dst)]), width * height, width * height)


def no_self_loops(g: Graph) -> Graph:
    keep = g.src != g.dst
    return Graph(g.edge_index[:, keep], g.num_src, g.num_dst)


def inputs(g: Graph, heads: int = 2, d: int = 5, dv: int = 3, seed: int = 0, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    q = (scale * torch.randn(g.num_dst, heads, d, generator=gen, dtype=torch.float64)).requires_grad_()
    k = (scale * torch.randn(g.num_src, heads, d, generator=gen, dtype=torch.float64)).requires_grad_()
    v = torch.randn(g.num_src, heads, dv, generator=gen, dtype=torch.float64).requires_grad_()
    return q, k, v


def check_against_references(g: Graph, clamp, rows=None, scale_inputs: float = 1.0):
    """Values and gradients of the local path (tiles of `rows`) equal the reference backend's and
    tests/dense.py's, in float64."""
    q, k, v = inputs(g, scale=scale_inputs)
    scale = 0.8
    if rows is None:
        out = edge_attention(q, k, v, g, scale=scale, clamp=clamp, backend="local")
    else:
        out = LocalAttention.apply(q, k, v, plan(g, rows), g, scale, clamp)
    ref = edge_attention(q, k, v, g, scale=scale, clamp=clamp, backend="reference")
    dense = dense_attention(q, k, v, g.edge_index, scale=scale, clamp=clamp)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    for want_out in (ref, dense):
        assert torch.allclose(out, want_out, atol=1e-12, rtol=0)
        want = torch.autograd.grad(want_out, (q, k, v), grad)
        for name, a, b in zip("qkv", got, want):
            assert torch.allclose(a, b, atol=1e-11, rtol=0), f"d{name}: {(a - b).abs().max():.3g}"


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("n, radius", [(1, 3), (7, 2), (50, 3), (67, 8), (130, 20), (40, 60)])
def test_windows_equal_references(n, radius, clamp):
    """Interior tiles, both ends, a last partial tile, and spans wider than the graph."""
    check_against_references(graphs.window(n, radius), clamp)


@pytest.mark.parametrize("clamp", CLAMPS)
def test_causal_windows_and_windows_without_self_loops(clamp):
    check_against_references(graphs.window(90, 6, causal=True), clamp)
    check_against_references(no_self_loops(graphs.window(90, 6)), clamp)


@pytest.mark.parametrize("rows", [1, 2, 3, 16, 64, 128])
@pytest.mark.parametrize("clamp", [(-0.3, 0.3), None])
def test_any_tile_rows(rows, clamp):
    """Tiles of T rows for any T, spans shorter than T (T = 16, radius 2) included."""
    check_against_references(graphs.window(70, 2), clamp, rows=rows)
    check_against_references(graphs.window(150, 9), clamp, rows=rows)


def test_many_chunks(monkeypatch):
    """Interior tiles in several chunks (a tiny chunk budget) add the same span gradients."""
    monkeypatch.setattr(local.attention, "CHUNK_BYTES", 1)
    check_against_references(graphs.window(100, 5), (-0.3, 0.3), rows=8)


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("self_loops", [True, False])
def test_mesh_in_row_major_order(self_loops, clamp):
    """A 2-D 8-neighbour mesh: tiles differ (the grid's left and right edges), so no shared bias."""
    g = mesh(11, 9, self_loops)
    assert not plan(g, 8).shared
    check_against_references(g, clamp, rows=8)
    check_against_references(g, clamp)


def test_shuffled_edges_and_destinations_without_edges():
    """Edge order does not matter; a destination without in-edges gets 0 (and no gradient)."""
    g = graphs.window(60, 4)
    keep = (g.dst < 20) | (g.dst > 26)  # destinations 20..26 lose their edges
    perm = torch.randperm(int(keep.sum()), generator=torch.Generator().manual_seed(1))
    g2 = Graph(g.edge_index[:, keep][:, perm], 60, 60)
    assert plan(g2).empty_rows.tolist() == list(range(20, 27))
    for clamp in CLAMPS:
        check_against_references(g2, clamp)
    q, k, v = inputs(g2)
    out = edge_attention(q, k, v, g2, backend="local")
    assert out[20:27].abs().max() == 0


def test_binding_clamp_with_large_scores():
    """Scores far outside the clamp (inputs x 10): values and gradients still equal."""
    check_against_references(graphs.window(80, 7), (-2.0, 2.0), scale_inputs=10.0)
    check_against_references(graphs.window(80, 7), None, scale_inputs=10.0)


def test_hand_computed():
    """window(2, 1), D=1, scale 1: each destination sees both sources; clamp at 5."""
    q = torch.tensor([[[2.0]], [[0.5]]], dtype=torch.float64)
    k = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64)
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64)
    out = edge_attention(q, k, v, graphs.window(2, 1), scale=1.0, backend="local")
    wa, wb = math.exp(2.0), math.exp(5.0)  # 8 clamps to 5
    assert out[0].item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)


@pytest.mark.parametrize("clamp", CLAMPS)
def test_gradcheck_and_double_backward(clamp):
    g = graphs.window(20, 3)
    q, k, v = inputs(g, d=3, dv=2)

    def f(q, k, v):
        return LocalAttention.apply(q, k, v, plan(g, 4), g, 0.7, clamp)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradgradcheck(f, (q, k, v), eps=1e-6, atol=1e-6)


def test_float32_close_to_float64():
    g = graphs.window(300, 10)
    q, k, v = inputs(g, heads=4, d=16, dv=8)
    out = edge_attention(q.float(), k.float(), v.float(), g, backend="local")
    ref = edge_attention(q, k, v, g, backend="reference")
    assert (out.double() - ref).abs().max() < 1e-5


def test_bias_dropout_and_weights_go_to_csr():
    """The tiles compute none of them: such calls run the csr backend and equal the reference."""
    g = graphs.window(40, 3)
    q, k, v = inputs(g)
    bias = torch.randn(g.num_edges, 2, dtype=torch.float64)
    out, w = edge_attention(q, k, v, g, bias=bias, return_weights=True, backend="local")
    ref, wr = edge_attention(q, k, v, g, bias=bias, return_weights=True, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12) and torch.allclose(w, wr, atol=1e-12)


@pytest.mark.parametrize("clamp", CLAMPS)
def test_repeated_edges_count_once_each(clamp):
    """An edge listed m times weighs m times (log m added at its tile position), as in the reference."""
    g = graphs.window(40, 3)
    extra = torch.cat([g.edge_index[:, ::7], g.edge_index[:, ::11], g.edge_index[:, ::11]], 1)
    twice = Graph(torch.cat([g.edge_index, extra], 1), 40, 40)
    assert plan(twice).counts is not None and int(plan(twice).counts.max()) == 4
    check_against_references(twice, clamp)


@pytest.mark.parametrize("clamp", CLAMPS)
def test_interior_tiles_with_the_same_edges_but_other_counts_are_not_shared(clamp):
    """Interior tiles whose edges sit at the same positions but repeat other edges need their own
    biases (the shared one gave outputs off by 0.9)."""
    g = graphs.window(60, 4)
    extra = torch.cat([g.edge_index[:, ::7], g.edge_index[:, ::11], g.edge_index[:, ::11]], 1)
    repeated = Graph(torch.cat([g.edge_index, extra], 1), 60, 60)
    p = plan(repeated)
    assert p.layout.interior > 1 and bool((p.edges[p.layout.first] == p.edges[p.layout.first + 1]).all())
    assert not p.shared
    check_against_references(repeated, clamp)


def test_refuses_edge_terms_and_graphs_that_are_not_locally_dense():
    g = graphs.window(10, 2)
    q = torch.randn(10, 1, 4)
    with pytest.raises(ValueError, match="does not take edge_key"):
        edge_attention(q, q, q, g, edge_key=torch.randn(g.num_edges, 1, 4), backend="local")
    q = torch.randn(3000, 1, 4)
    random = graphs.random(3000, 3000, 3000 * 4)
    with pytest.raises(ValueError, match="locally dense"):
        edge_attention(q, q, q, random, backend="local")
    assert not local.takes(random) and local.takes(graphs.window(3000, 8))  # the rule, asked beforehand


def test_plan_is_cached_and_sized():
    g = graphs.window(1000, 8)
    p = plan(g, 32)
    assert plan(g, 32) is p
    lay = p.layout
    assert (lay.rows, lay.span, lay.offset) == (32, 48, 8)  # span T + 2 * radius, starting radius back
    assert p.shared and p.counts is None and p.biases(torch.float32)[0].shape == (1, 32, 48)
    assert lay.density == pytest.approx(g.num_edges / (lay.tiles * 32 * 48))


def test_auto_picks_local_for_wide_windows_only():
    """Wide windows (repeated edges or not) go to local on CPU; narrow windows, random graphs (tiny
    density) and calls with edge terms do not."""
    assert choose_auto(CPU_Q, graphs.window(2000, 32)) == "local"
    assert choose_auto(CPU_Q, graphs.window(2000, 4)) == "csr"
    assert choose_auto(CPU_Q, graphs.random(2000, 2000, 2000 * 64)) == "csr"
    assert choose_auto(CPU_Q, graphs.window(2000, 32), edge_terms=True) == "csr"
    twice = graphs.window(2000, 32)
    twice = Graph(torch.cat([twice.edge_index, twice.edge_index[:, :5]], 1), 2000, 2000)
    assert choose_auto(CPU_Q, twice) == "local"


def test_auto_skips_local_inside_traces(monkeypatch):
    import sparseattn.kernels.auto as auto

    monkeypatch.setattr(auto, "tracing", lambda: True)
    assert choose_auto(CPU_Q, graphs.window(2000, 32)) == "csr"


def test_backend_function_takes_attention_inputs():
    g = graphs.window(30, 4)
    q, k, v = inputs(g)
    out, w = local_attention(AttentionInputs(q, k, v, g, 0.5, None, None, None, False))
    ref = edge_attention(q, k, v, g, scale=0.5, clamp=None, backend="reference")
    assert w is None and torch.allclose(out, ref, atol=1e-12)


@pytest.mark.parametrize("clamp", [(-0.3, 0.3), None])
def test_grouped_kv_heads(clamp):
    """k and v with H_kv < H heads (query head h reads kv head h // (H / H_kv)) equal the reference."""
    g = graphs.window(75, 6)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(75, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(75, 2, 5, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = edge_attention(q, k, v, g, clamp=clamp, backend="local")
    ref = edge_attention(q, k, v, g, clamp=clamp, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        assert torch.allclose(a, b, atol=1e-11)


@pytest.mark.parametrize("clamp", [(-0.3, 0.3), None])
def test_more_sources_than_destinations(clamp):
    """Destination i attends to sources 2i - 3 .. 2i + 3 of twice as many: the tiles' edges drift
    away from the one offset all tiles share, so the span covers them all (correct, not dense)."""
    n_dst = 45
    dst = torch.arange(n_dst).repeat_interleave(7)
    src = 2 * dst + torch.arange(-3, 4).repeat(n_dst)
    keep = (src >= 0) & (src < 2 * n_dst)
    g = Graph(torch.stack([src[keep], dst[keep]]), 2 * n_dst, n_dst)
    check_against_references(g, clamp, rows=4)
    check_against_references(g, clamp)
