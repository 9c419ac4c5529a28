"""The local backend's Triton tiles (`sparseattn.kernels.local.triton_tiles`, chosen by
kernel_options local_tiles="triton") against the reference and the dense masked attention: float64
values and gradients (exact in Triton's interpreter, which conftest.py turns on without CUDA),
windows with boundary tiles, meshes whose tiles do not share their edges, destinations without
edges, repeated edges, more sources than destinations, grouped kv heads, clamp and exact modes; the
non-finite contract of kernels/guard.py through the registered backend; reproducible gradients."""

import math

import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable (pip install triton)")

from sparseattn import Graph, edge_attention, graphs  # noqa: E402
from sparseattn.kernels import KernelOptions, kernel_options  # noqa: E402
from sparseattn.kernels.local import attention as local_attention_module  # noqa: E402
from sparseattn.kernels.local import plan  # noqa: E402
from sparseattn.kernels.local import triton_tiles as tt  # noqa: E402

from ..dense import dense_attention  # noqa: E402
from .test_local import mesh  # noqa: E402
from .test_non_finite import check_contract, make_inputs, padded_windows  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON = {"local_tiles": "triton"}
CLAMPS = {"clamp": (-5.0, 5.0), "binding": (-0.3, 0.3), "exact": None}


def inputs(g: Graph, heads=2, kv_heads=2, d=5, dv=3, scale=1.0, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n, h, w: torch.randn(n, h, w, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v = scale * rand(g.num_dst, heads, d), scale * rand(g.num_src, kv_heads, d), rand(g.num_src, kv_heads, dv)
    return tuple(x.to(DEVICE, dtype).requires_grad_() for x in (q, k, v))


def check(g: Graph, clamp, **kw):
    """The Triton tiles' values and gradients equal the reference's and the dense attention's (float64)."""
    g = g.to(DEVICE)
    q, k, v = inputs(g, **kw)
    scale = 0.8
    out = edge_attention(q, k, v, g, scale=scale, clamp=clamp, backend="local", kernel_options=TRITON)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype).to(DEVICE)
    got = torch.autograd.grad(out, (q, k, v), grad)
    group = q.shape[1] // k.shape[1]
    kr, vr = (x.repeat_interleave(group, 1) for x in (k, v))
    ref = edge_attention(q, kr, vr, g, scale=scale, clamp=clamp, backend="reference")
    dense = dense_attention(q, kr, vr, g.edge_index, scale=scale, clamp=clamp)
    for want_out in (ref, dense):
        assert torch.allclose(out, want_out, atol=1e-12, rtol=0), f"out: {(out - want_out).abs().max():.3g}"
        want = torch.autograd.grad(want_out, (q, k, v), grad)
        for name, a, b in zip("qkv", got, want):
            assert torch.allclose(a, b, atol=1e-11, rtol=0), f"d{name}: {(a - b).abs().max():.3g}"


@pytest.fixture(autouse=True)
def ran_triton(monkeypatch):
    """Every call in these tests that names local_tiles="triton" runs the Triton tiles: counted."""
    calls = []
    forward = tt.forward
    monkeypatch.setattr(tt, "forward", lambda *a, **kw: calls.append(1) or forward(*a, **kw))
    return calls


@pytest.mark.parametrize("clamp", CLAMPS.values(), ids=CLAMPS.keys())
@pytest.mark.parametrize("n, radius", [(7, 2), (70, 3), (100, 20), (40, 60)])
def test_windows_equal_references(n, radius, clamp, ran_triton):
    check(graphs.window(n, radius), clamp)
    assert ran_triton


@pytest.mark.parametrize("clamp", [(-0.3, 0.3), None], ids=["binding", "exact"])
def test_mesh_tiles_with_their_own_edges(clamp):
    g = mesh(11, 9)
    assert not plan(g).shared
    check(g, clamp)


def test_causal_window_and_large_scores():
    check(graphs.window(90, 9, causal=True), (-2.0, 2.0), scale=10.0)
    check(graphs.window(90, 9, causal=True), None, scale=10.0)


def test_destinations_without_edges_repeated_edges_and_more_sources():
    g = graphs.window(60, 4)
    keep = (g.dst < 20) | (g.dst > 26)
    holes = Graph(
        g.edge_index[:, keep][:, torch.randperm(int(keep.sum()), generator=torch.Generator().manual_seed(1))], 60, 60
    )
    assert plan(holes).empty_rows.tolist() == list(range(20, 27))
    check(holes, (-0.3, 0.3))
    extra = torch.cat([g.edge_index[:, ::7], g.edge_index[:, ::11], g.edge_index[:, ::11]], 1)
    repeated = Graph(torch.cat([g.edge_index, extra], 1), 60, 60)
    assert int(plan(repeated).counts.max()) == 4
    check(repeated, None)
    dst = torch.arange(45).repeat_interleave(7)
    src = 2 * dst + torch.arange(-3, 4).repeat(45)
    ok = (src >= 0) & (src < 90)
    check(Graph(torch.stack([src[ok], dst[ok]]), 90, 45), (-0.3, 0.3))


@pytest.mark.parametrize("clamp", [(-0.3, 0.3), None], ids=["binding", "exact"])
def test_grouped_kv_heads_and_wide_heads(clamp):
    check(graphs.window(75, 6), clamp, heads=4, kv_heads=2)
    check(graphs.window(40, 5), clamp, heads=1, kv_heads=1, d=40, dv=20)


def test_other_tile_rows_and_key_blocks(monkeypatch):
    """The launch constants a GPU sweep changes (tile rows, keys per block) give the same results."""
    monkeypatch.setattr(tt, "TILE_ROWS", 64)
    monkeypatch.setattr(tt, "BLOCK_N", 16)
    g = graphs.window(150, 10)
    assert tt.tile_rows(g) == 64 and tt.tile_rows(graphs.random(400, 400, 800, seed=0)) is None
    check(g, (-0.3, 0.3))
    assert plan(g, 64).layout.rows == 64


def test_float32_close_to_float64_and_gradients_reproducible():
    g = graphs.window(80, 12).to(DEVICE)
    q, k, v = inputs(g, dtype=torch.float32, d=16, dv=16)
    out = edge_attention(q, k, v, g, backend="local", kernel_options=TRITON)
    ref = edge_attention(*(x.double() for x in (q, k, v)), g, backend="reference")
    assert (out.double() - ref).abs().max() < 1e-5
    grad = torch.ones_like(out)
    first, second = (torch.autograd.grad(out, (q, k, v), grad, retain_graph=True) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_double_backward_differentiates_the_reference():
    g = graphs.window(30, 3).to(DEVICE)
    q, k, v = inputs(g)
    out = edge_attention(q, k, v, g, backend="local", kernel_options=TRITON)
    (dq,) = torch.autograd.grad(out, q, torch.ones_like(out), create_graph=True)
    (ddk,) = torch.autograd.grad(dq.square().sum(), k)
    qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
    ref = edge_attention(qr, kr, vr, g, backend="reference")
    (dqr,) = torch.autograd.grad(ref, qr, torch.ones_like(ref), create_graph=True)
    (ddkr,) = torch.autograd.grad(dqr.square().sum(), kr)
    assert torch.allclose(ddk, ddkr, atol=1e-11)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, in the interpreter, on the NaN rows
@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
def test_bad_values_stay_on_their_edges(clamp, ran_triton):
    """The registered local backend with the Triton tiles keeps kernels/guard.py's contract: NaN and
    inf in q, k, v and the incoming gradient, inside windows and in padding rows outside the graph."""
    g = padded_windows(count=3, length=40, slot=48, radius=20)
    values, grad_out = make_inputs(g)
    values["q"][3] = math.nan
    values["k"][60, 0, 0] = math.inf
    values["v"][110] = -math.inf
    grad_out[20, 1, 2] = math.nan
    values["q"][45], values["k"][44], values["v"][95, 0, 0] = math.nan, math.nan, math.inf  # padding rows
    with kernel_options(local_tiles="triton"):
        check_contract(g, values, grad_out, clamp, "local")
    assert ran_triton


def test_the_option_is_checked_and_off_by_default():
    with pytest.raises(ValueError, match="local_tiles"):
        KernelOptions(local_tiles="cuda")
    g = graphs.window(50, 20).to(DEVICE)
    q, k, v = inputs(g)
    calls = []
    plain = local_attention_module.LocalAttention.apply
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_attention_module.LocalAttention, "apply", lambda *a: calls.append(1) or plain(*a))
        edge_attention(q, k, v, g, backend="local")
    assert calls, "local_tiles=None must run the torch tiles until a GPU has measured the Triton ones"
