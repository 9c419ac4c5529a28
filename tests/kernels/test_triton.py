"""The triton backend against the reference backend and the independent dense reference: values and
gradients per dtype, the awkward graphs, dropout, returned weights, and that the kernels compile
for a real GPU. Without CUDA the kernels run in Triton's interpreter on CPU tensors (conftest.py
sets TRITON_INTERPRET=1 before the kernels are first imported); the graphs are kept small."""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton", reason="triton is not importable (pip install triton)")
tl = triton.language

from sparseattn import Graph, edge_attention, graphs  # noqa: E402
from sparseattn.kernels import kernel_options, options  # noqa: E402
from sparseattn.kernels import triton as tk  # noqa: E402
from sparseattn.kernels.contract import AttentionInputs  # noqa: E402
from sparseattn.kernels.options import as_kernel_options  # noqa: E402
from sparseattn.kernels.triton import launch, policy, triton_attention  # noqa: E402

from ..dense import dense_attention  # noqa: E402
from ..tolerances import assert_close, assert_within_reference_error  # noqa: E402


def _round_bf16_to_nearest_in_interpreter():
    """Triton's interpreter truncates float32 -> bfloat16 casts, where GPUs round to nearest even
    (arith.truncf); make the interpreter round like the GPU, so bf16 outputs are judged as they
    will run. Skipped (harmlessly) if a future Triton moves the method."""
    import numpy as np
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or not hasattr(builder, "cast_impl") or getattr(builder, "_rounds_bf16", False):
        return
    truncating = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = src.data.astype(np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            rounded = np.where(np.isnan(src.data), np.uint16(0x7FC0), rounded)
            return interpreter.TensorHandle(rounded, tl.bfloat16)
        return truncating(self, src, dst_type)

    builder.cast_impl, builder._rounds_bf16 = cast_impl, True


if os.environ.get("TRITON_INTERPRET") == "1":
    _round_bf16_to_nearest_in_interpreter()
pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
HALF = (torch.float16, torch.bfloat16)


def awkward_graph(n_src=7, n_dst=9, num_edges=40, seed=0):
    """Random edges in random order into destinations 0..n_dst-3 (the last two are isolated),
    with the first 10 edges repeated (duplicates)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src, (num_edges,), generator=gen)
    dst = torch.randint(0, n_dst - 2, (num_edges,), generator=gen)
    ei = torch.cat([torch.stack([src, dst]), torch.stack([src[:10], dst[:10]])], 1)
    return ei[:, torch.randperm(ei.shape[1], generator=gen)], n_src, n_dst


def inputs(n_src, n_dst, heads, d, dv, seed=0, magnitude=1.0):
    """float64 q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), bias table (N_dst, N_src, H)."""
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n_dst, heads, d, generator=gen, dtype=torch.float64) * magnitude,
        torch.randn(n_src, heads, d, generator=gen, dtype=torch.float64) * magnitude,
        torch.randn(n_src, heads, dv, generator=gen, dtype=torch.float64),
        torch.randn(n_dst, n_src, heads, generator=gen, dtype=torch.float64),
    )


def run(backend, base, ei, dtype, grad_out, use_bias=True, **kwargs):
    """One backend's output and gradients of <out, grad_out> for q, k, v and the bias table."""
    q, k, v, table = (t.to(device=DEVICE, dtype=dtype).clone().requires_grad_() for t in base)
    ei = ei.to(DEVICE)
    bias = table[ei[1], ei[0]] if use_bias else None  # (E, H): duplicates share a bias value
    out = edge_attention(q, k, v, ei, bias=bias, backend=backend, **kwargs)
    (out * grad_out.to(device=DEVICE, dtype=dtype)).sum().backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v, table)]
    return out.detach().cpu(), [g.cpu() for g in grads]


def gold(base, ei, grad_out, use_bias=True, scale=None, clamp=(-5.0, 5.0)):
    """The dense reference in float64: output and gradients."""
    q, k, v, table = (t.clone().requires_grad_() for t in base)
    out = dense_attention(q, k, v, ei, scale=scale, clamp=clamp, bias_table=table if use_bias else None)
    out.backward(grad_out)
    return out.detach(), [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v, table)]


@pytest.fixture(params=list(tk.LAYOUTS))
def layout(request):
    """Runs a test once per forward layout; the heads forward with the heads backward layout, the
    others with the tile backward (the backward reads only the forward's lse, whichever layout made it)."""
    bwd = "heads" if request.param == "heads" else "tile"
    with tk.forward_config(layout=request.param), tk.backward_config(layout=bwd):
        yield request.param


def assert_matches_references(out, grads, base, ei, dtype, grad_out, clamp):
    """out and gradients (q, k, v, bias table) against the dense float64 gold; half types within 2x (3x for
    gradients) the error of the reference backend run in the same dtype, float32/64 within tolerance."""
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    if dtype in HALF:
        ref, ref_grads = run("reference", base, ei, dtype, grad_out, clamp=clamp)
        want, want_grads = gold(base, ei, grad_out.to(dtype).double(), clamp=clamp)
        assert_within_reference_error(out, ref, want, 2.0, "out")
        for name, g, rg, wg in zip("q k v bias".split(), grads, ref_grads, want_grads):
            assert_within_reference_error(g, rg, wg, 3.0, f"d{name}")
    else:
        want, want_grads = gold(base, ei, grad_out, clamp=clamp)
        ref, ref_grads = run("reference", base, ei, dtype, grad_out, clamp=clamp)
        for name, g, rg, wg in zip("out q k v bias".split(), [out, *grads], [ref, *ref_grads], [want, *want_grads]):
            assert_close(g, wg, dtype, f"{name} vs dense")
            assert_close(g, rg, dtype, f"{name} vs reference")


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), (-1.0, 0.5), None], ids=["clamp5", "clamp-narrow", "exact"])
@pytest.mark.parametrize("d, dv", [(4, 4), (3, 5), (59, 7)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_values_and_grads_match_references(dtype, d, dv, clamp):
    """Duplicates, isolated destinations, shuffled edges, bias, D not a power of two, Dv != D."""
    ei, n_src, n_dst = awkward_graph()
    base = inputs(n_src, n_dst, 2, d, dv)
    grad_out = torch.randn(n_dst, 2, dv, dtype=torch.float64)
    out, grads = run("triton", base, ei, dtype, grad_out, clamp=clamp)
    assert (out[-2:] == 0).all() and (grads[0][-2:] == 0).all()  # isolated: 0 and zero gradient
    assert_matches_references(out, grads, base, ei, dtype, grad_out, clamp)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_forward_layouts_across_edge_tiles(layout, dtype, clamp):
    """Each layout with 4-edge tiles, so every destination spans several tiles (running max and per-lane
    sums carried across them) and H=3 (the heads layout pads to 4 heads): values, and gradients through the
    layout's log-sum-exp."""
    ei, n_src, n_dst = awkward_graph(num_edges=80)
    base = inputs(n_src, n_dst, 3, 59, 7)
    grad_out = torch.randn(n_dst, 3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with tk.forward_config(BLOCK_E=4):
        out, grads = run("triton", base, ei, dtype, grad_out, clamp=clamp)
    assert (out[-2:] == 0).all() and (grads[0][-2:] == 0).all()
    assert_matches_references(out, grads, base, ei, dtype, grad_out, clamp)


@pytest.mark.parametrize("clamp", [(-1.0, 0.5), None], ids=["clamp-narrow", "exact"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_heads_backward_matches_references(dtype, clamp):
    """The heads backward layout (all heads in one program, pipelined edge loop) with 2-edge tiles:
    duplicates, isolated nodes, bias, D=59 and Dv=7 (padded), H=3 (padded to 4 heads)."""
    ei, n_src, n_dst = awkward_graph(num_edges=80)
    base = inputs(n_src, n_dst, 3, 59, 7)
    grad_out = torch.randn(n_dst, 3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with tk.backward_config(layout="heads", BLOCK_E=2):
        out, grads = run("triton", base, ei, dtype, grad_out, clamp=clamp)
    assert (grads[0][-2:] == 0).all()  # isolated destinations: zero gradient
    assert_matches_references(out, grads, base, ei, dtype, grad_out, clamp)


@pytest.mark.parametrize(
    "bwd_layout, block_e, num_warps, num_stages", [("tile", 2, 1, None), ("tile", 16, 2, 2), ("heads", 2, 4, 3)]
)
def test_backward_tiles_set_at_forward_time(bwd_layout, block_e, num_warps, num_stages, monkeypatch):
    """A call's kernel_options triton_backward, read when the forward ran, drive its backward kernels
    (backward runs after the call returned): gradients still equal the references' (H=3: the heads
    layout pads to 4 heads; several edge tiles per node). The context manager sets the same through
    the default."""
    ei, n_src, n_dst = awkward_graph(num_edges=80)
    base = inputs(n_src, n_dst, 3, 5, 4)
    grad_out = torch.randn(n_dst, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    settings = dict(layout=bwd_layout, BLOCK_E=block_e, num_warps=num_warps, num_stages=num_stages)
    q, k, v, table = (t.to(DEVICE).clone().requires_grad_() for t in base)
    ei_d = ei.to(DEVICE)
    bias = lambda: table[ei_d[1], ei_d[0]]  # noqa: E731
    out = edge_attention(q, k, v, ei_d, bias=bias(), backend="triton", kernel_options={"triton_backward": settings})
    with tk.backward_config(**settings):
        again = edge_attention(q, k, v, ei_d, bias=bias(), backend="triton")
    assert as_kernel_options(None).triton_backward == {}  # restored on exit
    launched = []
    real = launch.backward
    monkeypatch.setattr(launch, "backward", lambda *a, **kw: launched.append(kw["tiles"]) or real(*a, **kw))
    grads = torch.autograd.grad(out, (q, k, v, table), grad_out.to(DEVICE))
    torch.autograd.grad(again, (q, k, v, table), grad_out.to(DEVICE))
    for tiles in launched:
        assert (tiles["BLOCK_E"], tiles["num_warps"], tiles["NUM_STAGES"]) == (block_e, num_warps, num_stages)
        assert tiles["BLOCK_H"] == (4 if bwd_layout == "heads" else 1)
    assert len(launched) == 2
    grads = [g.cpu() for g in grads]
    assert_matches_references(out.detach().cpu(), grads, base, ei, torch.float64, grad_out, (-5.0, 5.0))
    for bad, named in (
        (dict(BLOCK_H=2), r"triton_backward has unknown names \['BLOCK_H'\]"),
        (dict(layout="lanes"), "'lanes'"),
    ):
        with pytest.raises(ValueError, match=named):
            with tk.backward_config(**bad):
                pass
        with pytest.raises(ValueError, match=named):
            edge_attention(q, k, v, ei_d, backend="triton", kernel_options={"triton_backward": bad})


def test_forward_settings_presets_and_overrides():
    fs = policy.forward_settings
    default = fs(64, 64, 8, 16.0)  # the heads layout: all 8 heads, 4 edges: 2048-element tiles
    assert default == dict(
        policy.tiles(64, 64, 16.0), BLOCK_H=8, BLOCK_E=4, num_warps=4, NUM_STAGES=2, LANES=False, V_EARLY=True
    )
    heads = fs(64, 64, 6, 16.0, dict(layout="heads", num_stages=3))
    with tk.forward_config(layout="heads", num_stages=3):
        with tk.forward_config(BLOCK_E=2):  # nested: merged with the outer settings
            assert fs(64, 64, 6, 16.0, as_kernel_options(None).triton_forward) == dict(heads, BLOCK_E=2)
    assert as_kernel_options(None).triton_forward == {}  # restored on exit
    assert heads["BLOCK_H"] == 8 and heads["BLOCK_E"] * 8 * 64 == 2048 and heads["NUM_STAGES"] == 3
    tile = fs(64, 64, 8, 16.0, dict(layout="tile"))
    assert tile == dict(policy.tiles(64, 64, 16.0), BLOCK_H=1, NUM_STAGES=None, LANES=False, V_EARLY=False)
    lanes = fs(64, 64, 8, 16.0, dict(layout="lanes"))
    assert lanes["LANES"] and lanes["NUM_STAGES"] == 2
    assert fs(256, 256, 16, 16.0)["BLOCK_H"] == 16  # wide head sets: one program for all heads
    assert fs(64, 64, 4, 16.0)["BLOCK_H"] == 1  # narrower than 512: per-head programs (tile)
    assert fs(64, 64, 4, 16.0, dict(layout="heads"))["BLOCK_H"] == 4  # a given layout is kept
    for bad in (dict(layout="rows"), dict(BLOCK_D=8), dict(num_warps=0), dict(BLOCK_E="4")):
        with pytest.raises(ValueError, match="kernel_options triton_forward"):
            fs(64, 64, 4, 16.0, bad)
        with pytest.raises(ValueError, match="kernel_options triton_forward"):
            with tk.forward_config(**bad):
                pass
        with pytest.raises(ValueError, match="kernel_options triton_forward"):  # when the block is entered
            with kernel_options(triton_forward=bad):
                pass


@pytest.mark.parametrize("which", ["triton_forward", "triton_backward"])
@pytest.mark.parametrize("block_e", [3, 24])
def test_block_e_not_a_power_of_two_is_named_before_triton(which, block_e):
    """BLOCK_E = 3 or 24 failed inside Triton ("arange's range must be a power of 2", naming neither
    the option nor the value); now the call, and the settings, say which."""
    q = torch.zeros(6, 2, 4, device=DEVICE, requires_grad=True)
    named = rf"kernel_options {which}\['BLOCK_E'\] must be a power of two .* got {block_e}"
    with pytest.raises(ValueError, match=named):
        edge_attention(
            q, q, q, graphs.window(6, 1).to(DEVICE), backend="triton", kernel_options={which: {"BLOCK_E": block_e}}
        )
    config = tk.forward_config if which == "triton_forward" else tk.backward_config
    with pytest.raises(ValueError, match=named):
        with config(BLOCK_E=block_e):
            pass


@pytest.mark.parametrize("which", ["triton_forward", "triton_backward"])
def test_block_e_over_tritons_largest_tile_is_named(which):
    """A power-of-two BLOCK_E whose tile, with the call's heads and dims, exceeds Triton's largest
    tensor failed inside Triton ("numel (4194304) exceeds triton maximum tensor numel"); the settings
    now name it and the largest BLOCK_E that fits (2 heads of 8 dims: 65536)."""
    q = torch.zeros(6, 2, 8, device=DEVICE)
    settings = {"layout": "heads", "BLOCK_E": 1 << 18}
    named = rf"kernel_options {which}\['BLOCK_E'\] = 262144 makes tiles of 4194304 elements.* at most 65536"
    with pytest.raises(ValueError, match=named):
        edge_attention(q, q, q, graphs.window(6, 1).to(DEVICE), backend="triton", kernel_options={which: settings})
    fits = (
        policy.forward_settings(8, 8, 2, 2.0, {**settings, "BLOCK_E": 1 << 16})
        if which == "triton_forward"
        else policy.backward_settings(8, 8, 2, {**settings, "BLOCK_E": 1 << 16})
    )
    assert fits["BLOCK_E"] * fits["BLOCK_H"] * fits["BLOCK_D"] == policy.MAX_TENSOR_NUMEL


def test_policy_names_are_the_options():
    """The layouts and settings the kernel options check are the ones policy launches."""
    assert tuple(policy.LAYOUTS) == options.TRITON_LAYOUTS
    assert policy.BACKWARD_LAYOUTS == options.TRITON_BACKWARD_LAYOUTS
    assert policy.SETTINGS == options.TRITON_SETTINGS


def test_hand_computed_two_edges():
    """One destination, two sources, D=1: out = (e^a v0 + e^b v1) / (e^a + e^b), a and b clamped."""
    q = torch.tensor([[[2.0]]], dtype=torch.float64, device=DEVICE)
    k = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64, device=DEVICE)  # scores 2 and 8
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64, device=DEVICE)
    ei = torch.tensor([[0, 1], [0, 0]], device=DEVICE)
    wa, wb = math.exp(2.0), math.exp(5.0)
    out = edge_attention(q, k, v, ei, scale=1.0, backend="triton")
    assert out.item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)
    wa, wb = math.exp(2.0 - 8.0), 1.0
    out = edge_attention(q, k, v, ei, scale=1.0, clamp=None, backend="triton")
    assert out.item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)


def test_clamp_gradient_passes_at_the_bounds_like_torch_clamp():
    """Scores exactly at lo and hi get gradient (torch.clamp's convention); beyond them none."""
    q = torch.ones(1, 1, 1, dtype=torch.float64, device=DEVICE)
    k = torch.tensor([-7.0, -5.0, 0.0, 5.0, 7.0], dtype=torch.float64, device=DEVICE).view(5, 1, 1)
    v = torch.arange(5.0, dtype=torch.float64, device=DEVICE).view(5, 1, 1)
    ei = torch.stack([torch.arange(5), torch.zeros(5, dtype=torch.long)]).to(DEVICE)
    grads = []
    for backend in ("triton", "reference"):
        kk = k.clone().requires_grad_()
        edge_attention(q, kk, v, ei, scale=1.0, backend=backend).sum().backward()
        grads.append(kk.grad)
    assert_close(grads[0], grads[1], torch.float64, "dk")
    assert (grads[0].flatten()[[0, 4]] == 0).all() and (grads[0].flatten()[[1, 3]] != 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_graph_and_no_sources(dtype):
    q = torch.randn(3, 2, 4, dtype=dtype, device=DEVICE, requires_grad=True)
    k = torch.randn(5, 2, 4, dtype=dtype, device=DEVICE, requires_grad=True)
    v = torch.randn(5, 2, 6, dtype=dtype, device=DEVICE, requires_grad=True)
    empty = torch.empty(2, 0, dtype=torch.long, device=DEVICE)
    out, w = edge_attention(q, k, v, empty, backend="triton", return_weights=True)
    assert out.shape == (3, 2, 6) and out.dtype == dtype and (out == 0).all() and w.shape == (0, 2)
    out.sum().backward()
    assert (q.grad == 0).all() and (k.grad == 0).all() and (v.grad == 0).all()
    out = edge_attention(q, k[:0], v[:0], empty, backend="triton")
    assert out.shape == (3, 2, 6) and (out == 0).all()


@pytest.mark.parametrize("heads, d, dv", [(0, 4, 3), (2, 0, 3), (2, 4, 0), (0, 0, 0)])
def test_zero_heads_or_head_dims_with_edges(heads, d, dv):
    """H, D or Dv = 0 with E > 0: the reference's result (mean of v when D = 0), gradients shaped like the inputs."""
    ei, n_src, n_dst = awkward_graph()
    base = inputs(n_src, n_dst, heads, d, dv)
    results = []
    for backend in ("triton", "reference"):
        q, k, v, table = (t.to(DEVICE).clone().requires_grad_() for t in base)
        out = edge_attention(q, k, v, ei.to(DEVICE), scale=0.5, bias=table[ei[1], ei[0]], backend=backend)
        assert out.shape == (n_dst, heads, dv)
        out.square().sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        results.append([out, q.grad, k.grad, v.grad, table.grad])
    for name, a, b in zip("out dq dk dv dbias".split(), *results):
        assert_close(a.detach(), b, torch.float64, name)


@pytest.mark.parametrize("magnitude", [30.0, 100.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_exact_softmax_at_large_scores_equals_sdpa(dtype, magnitude, layout):
    """clamp=None with scores up to ~2e4: no overflow, equal to masked SDPA (float64); clamp mode
    stays finite. In float32 a score s is only known to ~ulp(s) (0.002 at 2e4) and exp turns that
    into a relative error of the weights: on an H100 the compiled kernel's outputs were off by
    1.3e-4 (scores to 1.7e3) and 2.1e-3 (2e4), so float32 is held to 2 ulp of the largest score."""
    ei, n_src, n_dst = awkward_graph()
    ei = torch.unique(ei, dim=1)  # SDPA's boolean mask cannot express duplicates
    q, k, v, _ = (t.to(device=DEVICE, dtype=dtype) for t in inputs(n_src, n_dst, 2, 8, 8, magnitude=magnitude))
    out = edge_attention(q, k, v, ei.to(DEVICE), clamp=None, backend="triton")
    mask = torch.zeros(n_dst, n_src, dtype=torch.bool, device=DEVICE)
    mask[ei[1], ei[0]] = True
    sdpa = F.scaled_dot_product_attention(
        q.transpose(0, 1).double(), k.transpose(0, 1).double(), v.transpose(0, 1).double(), attn_mask=mask
    ).transpose(0, 1)
    has_in = mask.any(1)
    assert torch.isfinite(out).all() and (out[~has_in] == 0).all()
    if dtype == torch.float64:
        assert_close(out[has_in], sdpa[has_in], torch.float64, "vs SDPA")
    else:
        ei_d = ei.to(DEVICE)
        top = ((q[ei_d[1]].double() * k[ei_d[0]].double()).sum(-1) * q.shape[-1] ** -0.5).abs().max().item()
        err = (out[has_in].double() - sdpa[has_in]).abs().max().item()
        assert err <= 2e-5 + 2 * torch.finfo(torch.float32).eps * top, (err, top)
    assert torch.isfinite(edge_attention(q, k, v, ei.to(DEVICE), backend="triton")).all()


def peaked_inputs(n_src, n_dst, num_edges, heads, d, dv, magnitude, independent=False, seed=0):
    """float64 q, k, v and edge terms (edge_key, edge_value, edge_scale of E edges) whose scores
    reach ~magnitude^2. By default with gaps of order 1 between a destination's edges: q =
    magnitude * N(0, 1), keys magnitude * c + N(0, 1) / magnitude around one shared direction c per
    head, edge_key N(0, 1) / magnitude, edge_scale 1 + N(0, 1) / magnitude^2: a peaked softmax whose
    gradients are not rounded away. independent: q, k magnitude * N(0, 1) and the terms N(0, 1),
    whose gaps of ~magnitude^2 leave most weights below float32's resolution next to one near 1."""
    gen = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    direction = 0.0 if independent else normal(1, heads, d)
    near = 1.0 if independent else 1 / magnitude  # the keys' and edge keys' spread
    return dict(
        q=normal(n_dst, heads, d) * magnitude,
        k=direction * magnitude + normal(n_src, heads, d) * (magnitude if independent else near),
        v=normal(n_src, heads, dv),
        edge_key=normal(num_edges, heads, d) * near,
        edge_value=normal(num_edges, heads, dv),
        edge_scale=(0.0 if independent else 1.0) + normal(num_edges, heads, d) * near**2,
    )


@pytest.mark.parametrize("terms", [(), ("edge_scale",), ("edge_key", "edge_value", "edge_scale")], ids=str)
@pytest.mark.parametrize("magnitude", [10.0, 30.0])
@pytest.mark.parametrize("independent", [False, True], ids=["gaps~1", "independent"])
def test_exact_gradients_of_a_peaked_softmax_within_csr_error(independent, magnitude, terms):
    """clamp=None, float32, scores to ~1e3 (`peaked_inputs`): every gradient within 10x csr's
    float32 error (both against the float64 reference), in both backward layouts (H=3: the heads
    layout pads). Before, the backward recomputed the weights as exp(s - lse) with lse = max + log z
    rounded to one float (dq 10-700x csr's error), and dq = scale (sum p dp k - delta sum p k)
    cancelled where one weight is near 1 (140x in the independent case at magnitude 30, whose
    graph has destinations with all weights but one below 1e-6)."""
    ei, n_src, n_dst = awkward_graph(seed=1 if independent else 0)
    x = peaked_inputs(n_src, n_dst, ei.shape[1], 3, 5, 3, magnitude, independent)
    g_out = torch.randn(n_dst, 3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def gradients(backend, dtype):
        leaves = {n: t.to(DEVICE, dtype).requires_grad_() for n, t in x.items() if n in ("q", "k", "v", *terms)}
        out = edge_attention(
            leaves["q"], leaves["k"], leaves["v"], ei.to(DEVICE), clamp=None, backend=backend,
            **{n: leaves[n] for n in terms},
        )  # fmt: skip
        grads = torch.autograd.grad(out, list(leaves.values()), g_out.to(DEVICE, dtype))
        return {f"d{n}": g.cpu().double() for n, g in zip(leaves, grads)}

    gold, csr = gradients("reference", torch.float64), gradients("csr", torch.float32)
    if not independent:
        assert min(g.abs().max().item() for g in gold.values()) > 1e-3  # gradients not rounded away
    failures = []
    for bwd_layout in tk.BACKWARD_LAYOUTS:
        with tk.backward_config(layout=bwd_layout):
            got = gradients("triton", torch.float32)
        for name, want in gold.items():
            top = want.abs().max().item()
            err, csr_err = ((g[name] - want).abs().max().item() for g in (got, csr))
            if err > 10 * csr_err + 1e-6 * top:
                failures.append(f"{bwd_layout} {name}: max |err| {err:.3g}, csr's {csr_err:.3g} (max {top:.3g})")
    assert not failures, "beyond 10x csr's error: " + "; ".join(failures)


@pytest.mark.parametrize("bwd_layout", tk.BACKWARD_LAYOUTS)
def test_backward_recomputes_the_forward_weights_bit_for_bit(bwd_layout):
    """dv[s] sums p_e do[t] over s's out-edges: with one out-edge per source and do = 1, dv holds the
    weights the dk/dv kernel recomputed, which must be the forward's (returned) weights bit for bit,
    on a GPU too: float32 backward kernels read the forward's scores (`common.score`). Exact mode,
    edge keys and scales, scores ~1e3: there a score summed in another association (as the dk/dv
    kernel once did with edge scales) moved weights by up to 2e-4 (relative)."""
    num_edges, n_dst = 20, 5
    ei = torch.stack([torch.arange(num_edges), torch.arange(num_edges) % n_dst])
    x = {n: t.to(DEVICE, torch.float32) for n, t in peaked_inputs(num_edges, n_dst, num_edges, 3, 5, 1, 30.0).items()}
    v = x["v"].requires_grad_()
    with tk.backward_config(layout=bwd_layout):
        out, weights = edge_attention(
            x["q"], x["k"], v, ei.to(DEVICE), clamp=None, backend="triton", edge_key=x["edge_key"],
            edge_scale=x["edge_scale"], return_weights=True,
        )  # fmt: skip
    (dv,) = torch.autograd.grad(out, v, torch.ones_like(out))
    assert torch.equal(dv[:, :, 0], weights)  # source e's only edge is e


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_returned_weights_and_their_gradient(dtype, clamp, layout):
    """Weights (E, H) in caller order equal the reference's, and a loss on them back-propagates alike."""
    ei, n_src, n_dst = awkward_graph()
    base = inputs(n_src, n_dst, 3, 5, 6)
    gen = torch.Generator().manual_seed(3)
    g_out, g_w = torch.randn(n_dst, 3, 6, generator=gen), torch.randn(ei.shape[1], 3, generator=gen)
    results = []
    for backend in ("triton", "reference"):
        q, k, v, table = (t.to(device=DEVICE, dtype=dtype).clone().requires_grad_() for t in base)
        bias = table[ei[1], ei[0]]
        out, w = edge_attention(q, k, v, ei.to(DEVICE), bias=bias, clamp=clamp, backend=backend, return_weights=True)
        ((out * g_out.to(out)).sum() + (w * g_w.to(w)).sum()).backward()
        results.append([out, w, q.grad, k.grad, v.grad, table.grad])
    for name, a, b in zip("out weights dq dk dv dbias".split(), *results):
        assert_close(a.detach(), b.detach(), dtype, name)
    # only the weights used: the backward still runs (d_out is None inside the Function)
    q, k, v, _ = (t.to(DEVICE).clone().requires_grad_() for t in base)
    _, w = edge_attention(q, k, v, ei.to(DEVICE), clamp=clamp, backend="triton", return_weights=True)
    (w * g_w.to(w)).sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
def test_dropout_equals_reference_under_the_same_seed(clamp, layout):
    g = graphs.window(12, 3)
    ei = g.edge_index.to(DEVICE)
    base = inputs(12, 12, 2, 4, 4)
    grad_out = torch.randn(12, 2, 4, dtype=torch.float64)
    results = []
    for backend in ("triton", "reference"):
        torch.manual_seed(7)
        results.append(run(backend, base, ei, torch.float64, grad_out, clamp=clamp, dropout_p=0.4))
    (out, grads), (ref, ref_grads) = results
    assert_close(out, ref, torch.float64, "out")
    for name, a, b in zip("q k v bias".split(), grads, ref_grads):
        assert_close(a, b, torch.float64, f"d{name}")
    torch.manual_seed(7)
    again, _ = run("triton", base, ei, torch.float64, grad_out, clamp=clamp, dropout_p=0.4)
    assert torch.equal(out, again)


def test_bias_of_shape_e_is_shared_by_heads(layout):
    ei, n_src, n_dst = awkward_graph()
    q, k, v, _ = (t.to(DEVICE) for t in inputs(n_src, n_dst, 2, 4, 4))
    grads = []
    for backend in ("triton", "reference"):
        bias = torch.linspace(-2, 2, ei.shape[1], dtype=torch.float64, device=DEVICE).requires_grad_()
        edge_attention(q, k, v, ei.to(DEVICE), bias=bias, clamp=None, backend=backend).pow(2).sum().backward()
        grads.append(bias.grad)
    assert_close(grads[0], grads[1], torch.float64, "dbias (E,)")


def test_backward_is_deterministic():
    """No atomics: two backward passes give bit-identical gradients."""
    ei, n_src, n_dst = awkward_graph(num_edges=60)
    base = inputs(n_src, n_dst, 2, 8, 8)
    grad_out = torch.randn(n_dst, 2, 8, dtype=torch.float64)
    (_, a), (_, b) = (run("triton", base, ei, torch.float32, grad_out) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_gradcheck_float64():
    ei = torch.tensor([[0, 1, 2, 1, 1], [0, 0, 1, 2, 0]], device=DEVICE)  # a duplicate; dst 3 isolated
    g = Graph(ei, 3, 4)
    q, k, v = (torch.randn(n, 1, 2, dtype=torch.float64, device=DEVICE, requires_grad=True) for n in (4, 3, 3))
    bias = torch.randn(5, 1, dtype=torch.float64, device=DEVICE, requires_grad=True)
    for clamp in ((-4.0, 4.0), None):  # scores stay inside the bounds: no kink for finite differences

        def f(q, k, v, bias, clamp=clamp):
            return triton_attention(AttentionInputs(q, k, v, g, 0.7, clamp, bias, None, True))

        assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-7, fast_mode=True)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
def test_gradgradcheck_float64(clamp):
    """Double backward (create_graph=True) recomputes through the reference: twice differentiable."""
    ei = torch.tensor([[0, 1, 2, 1, 1], [0, 0, 1, 2, 0]], device=DEVICE)  # a duplicate; dst 3 isolated
    g = Graph(ei, 3, 4)
    q, k, v = (torch.randn(n, 1, 2, dtype=torch.float64, device=DEVICE, requires_grad=True) for n in (4, 3, 3))
    bias = torch.randn(5, 1, dtype=torch.float64, device=DEVICE, requires_grad=True)

    def f(q, k, v, bias):
        return edge_attention(q, k, v, g, scale=0.7, clamp=clamp, bias=bias, backend="triton", return_weights=True)

    assert torch.autograd.gradgradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
def test_gradient_penalty_matches_reference(clamp):
    """q.grad of loss + |d loss/dq|^2 with only q trainable: the second-order terms are kept."""
    ei, n_src, n_dst = awkward_graph()
    q, k, v, table = (t.to(DEVICE) for t in inputs(n_src, n_dst, 2, 4, 3))
    bias = table[ei[1], ei[0]]
    q.requires_grad_()
    grads = []
    for backend in ("triton", "reference"):
        out = edge_attention(q, k, v, ei.to(DEVICE), clamp=clamp, bias=bias, backend=backend)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=DEVICE).view_as(out)).sum()
        (gq,) = torch.autograd.grad(loss, q, create_graph=True)
        grads.append(torch.autograd.grad(loss + gq.square().sum(), q)[0])
    assert_close(grads[0], grads[1], torch.float64, "dq of the penalty")


def test_node_counts_and_graph_spellings():
    """A bipartite graph (N_src != N_dst) and a Graph with cached CSR agree with the plain tensor."""
    g = graphs.random(11, 6, 40, seed=2, device=DEVICE)  # sorted by destination: perm is the identity
    q, k, v, _ = (t.to(DEVICE) for t in inputs(11, 6, 2, 8, 3))
    a = edge_attention(q, k, v, g, backend="triton")
    b = edge_attention(q, k, v, g.edge_index, backend="triton")
    assert torch.equal(a, b)
    assert_close(a, edge_attention(q, k, v, g, backend="reference"), torch.float64, "vs reference")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="auto picks triton only for CUDA tensors")
def test_auto_picks_triton_on_cuda():
    from sparseattn.kernels import choose_auto

    g = graphs.window(8, 2, device="cuda")
    assert choose_auto(torch.randn(8, 2, 16, device="cuda"), g) == "triton"


def test_head_dim_limit_and_registration():
    from sparseattn.kernels import backend_names, backends_for

    assert "triton" in backend_names() and "triton" not in backends_for("cpu")
    q = torch.randn(2, 1, 257, device=DEVICE)
    with pytest.raises(ValueError, match="head dims up to 256"):
        edge_attention(q, q, q, torch.tensor([[0], [1]], device=DEVICE), backend="triton")


@triton.jit
def _cast_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs).to(Y.dtype.element_ty))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="checks the interpreter's rounding")
def test_interpreter_rounds_bfloat16_like_the_gpu():
    x = torch.cat([torch.randn(4000) * 100, torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, float("inf"), float("nan")])])
    x = torch.cat([x, torch.zeros(4096 - x.numel())])
    y = torch.empty(4096, dtype=torch.bfloat16)
    _cast_kernel[(1,)](x, y, N=4096)
    nan = x.isnan()
    assert torch.equal(y.isnan(), nan) and torch.equal(y[~nan], x[~nan].to(torch.bfloat16))


# ---- the kernels compile for a real GPU (sm_90) without one: ahead-of-time compilation ----------
_COMPILE = textwrap.dedent("""
    import sys
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from sparseattn.kernels import triton as tk
    from sparseattn.kernels.triton import policy
    from sparseattn.kernels.triton.backward_kernels import dkdv_kernel, dq_kernel
    from sparseattn.kernels.triton.forward_kernel import forward_kernel
    dtype, d = sys.argv[1], int(sys.argv[2])
    acc, ACC = ("fp64", tl.float64) if dtype == "fp64" else ("fp32", tl.float32)
    def signature(kernel, constexprs):
        sig = {}
        for name in kernel.arg_names:
            if name in constexprs: sig[name] = "constexpr"
            elif name in ("PTR", "IDX", "PERM"): sig[name] = "*i64"
            elif name in ("STATS", "DELTA", "DS", "SCALARS"): sig[name] = "*" + acc
            elif name == "S": sig[name] = "*fp32"  # the forward's float32 scores
            elif name in ("H", "D", "DV"): sig[name] = "i32"
            elif name.isupper(): sig[name] = "*" + dtype
            else: sig[name] = "i64"  # strides
        return sig
    def build(kernel, constexprs, num_warps):
        src = ASTSource(kernel, signature=signature(kernel, constexprs), constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
        assert compiled.asm["cubin"]
        assert compiled.metadata.shared <= 227 * 1024, (kernel.__name__, constexprs, compiled.metadata.shared)
    for clamp in (True, False):
        flags = dict(CLAMP=clamp, HAS_BIAS=True, HAS_MASK=True, ACC=ACC, SAVE_SCORES=dtype == "fp32", WIDE=False)
        terms = dict(HAS_EDGE_KEY=clamp, HAS_EDGE_VALUE=clamp, HAS_EDGE_SCALE=clamp)  # with and without
        grads = dict(GRAD_EDGE_KEY=clamp, GRAD_EDGE_VALUE=clamp, GRAD_EDGE_SCALE=clamp)
        for layout in tk.LAYOUTS:
            cfg = policy.forward_settings(d, d, 8, 16.0, dict(layout=layout))
            num_warps = cfg.pop("num_warps")
            build(forward_kernel, dict(RETURN_WEIGHTS=True, HAS_EPS=clamp, **flags, **terms, **cfg), num_warps)
        for layout in tk.BACKWARD_LAYOUTS:
            cfg = policy.backward_settings(d, d, 8, dict(layout=layout))
            num_warps = cfg.pop("num_warps")
            build(dq_kernel, dict(HAS_DW=True, **flags, **terms, **cfg), num_warps)
            build(dkdv_kernel, dict(**flags, **terms, **grads, **cfg), num_warps)
    print("compiled")
""")


def _compile_for_sm90(dtype, d):
    try:
        import triton.backends.nvidia  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        pytest.skip(f"this triton cannot compile for CUDA here: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE, dtype, str(d)], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and "compiled" in res.stdout, res.stderr[-3000:]


def test_kernels_compile_for_sm90_bf16():
    """Interpreted tests cannot catch what only the compiler rejects; compiling needs no GPU."""
    _compile_for_sm90("bf16", 64)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, d", [("fp16", 3), ("fp32", 128), ("fp64", 59), ("bf16", 256)])
def test_kernels_compile_for_sm90(dtype, d):
    _compile_for_sm90(dtype, d)


# ---- a wider sweep (slow): hypothesis graphs against the dense reference ------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hypothesis_sweep(dtype):
    from hypothesis import given, settings

    from ..strategies import graph_cases

    @settings(max_examples=60, deadline=None)
    @given(case=graph_cases(max_nodes=8, max_edges=32))
    def check(case):
        base = [t.detach() for t in case.tensors(torch.float64)]
        grad_out = torch.randn(
            case.n_dst, case.heads, case.dv, dtype=torch.float64, generator=torch.Generator().manual_seed(case.seed + 1)
        )
        kw = dict(use_bias=case.use_bias, scale=case.scale, clamp=case.clamp)
        out, grads = run("triton", base, case.edge_index, dtype, grad_out, **kw)
        want, want_grads = gold(base, case.edge_index, grad_out.to(dtype).double(), **kw)
        if dtype in HALF:
            ref, ref_grads = run("reference", base, case.edge_index, dtype, grad_out, **kw)
            assert_within_reference_error(out, ref, want, 2.0, "out")
            for name, g, rg, wg in zip("q k v bias".split(), grads, ref_grads, want_grads):
                assert_within_reference_error(g, rg, wg, 3.0, f"d{name}")
        else:
            assert_close(out, want, dtype, "out")
            for name, g, wg in zip("q k v bias".split(), grads, want_grads):
                assert_close(g, wg, dtype, f"d{name}")

    check()


def test_scalars_are_made_once_per_setting_and_kept_exact():
    """The [scale, lo, hi] tensor every kernel reads is cached per (values, dtype, device): making
    it per call was a synchronizing host-to-device copy on CUDA. Each setting keeps its own exact
    values, float64 ones in float64, and one made under inference_mode serves outside it too."""
    q = torch.zeros(3, 2, 4, dtype=torch.float64, device=DEVICE)
    with torch.inference_mode():
        first = launch.shared_args(q, q, 0.1, (-5.0, 5.0), None, None)["SCALARS"]
    again = launch.shared_args(q, q, 0.1, (-5.0, 5.0), None, None)["SCALARS"]
    other = launch.shared_args(q, q, 0.1, (-4.0, 5.0), None, None)["SCALARS"]
    half = launch.shared_args(q.half(), q.half(), 0.1, (-5.0, 5.0), None, None)["SCALARS"]
    assert first is again and not first.is_inference()
    assert other is not first and other.tolist() == [0.1, -4.0, 5.0]
    assert first.dtype == torch.float64 and first[0].item() == 0.1
    assert half.dtype == torch.float32 and half is not first


def test_float32_forward_starts_from_its_own_settings():
    """float32 rows are twice bfloat16's: up to D = 64 the forward starts from FLOAT32_FORWARD (2x
    faster than the bfloat16 choice on an H200); a given layout, or wider heads, keep the general rule."""
    assert policy.forward_settings(64, 64, 8, 16.0, float32=True) == policy.forward_settings(
        64, 64, 8, 16.0, policy.FLOAT32_FORWARD
    )
    assert policy.forward_settings(64, 64, 8, 16.0, {"BLOCK_E": 16}, float32=True)["BLOCK_E"] == 16
    for given in ({"layout": "heads"}, None):
        wide = 128 if given is None else 64
        assert policy.forward_settings(wide, wide, 8, 16.0, given, float32=True) == policy.forward_settings(
            wide, wide, 8, 16.0, given
        )
