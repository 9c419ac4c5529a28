"""The triton backend's edge terms (edge_key, edge_value, edge_scale) and normalizer eps against the
reference backend: output, returned weights and the gradients of every input, for each term alone
and all together, in clamp mode with and without eps and in exact mode, on graphs with unsorted
caller edge order, duplicate edges and a destination without in-edges; float32 and float16; terms
shared by the heads; each forward layout across several edge tiles; terms without gradients; no
(E, H, D) tensor but the terms' gradients; double backward; torch.compile and opcheck. Without CUDA
the kernels run in Triton's interpreter (conftest.py), so the graphs are tiny. Dropout is not
compared: the two backends would draw their masks apart."""

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not importable (pip install triton)")

from sparseattn import Graph, edge_attention  # noqa: E402
from sparseattn.kernels import triton as tk  # noqa: E402
from sparseattn.kernels.triton import policy  # noqa: E402

from ..tolerances import assert_close, assert_within_reference_error  # noqa: E402
from .test_csr import _LargestIntermediate  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TERMS = ("edge_key", "edge_value", "edge_scale")
MODES = {"clamp-eps": ((-2.0, 2.0), 1e-6), "clamp": ((-2.0, 2.0), 0.0), "exact": (None, 0.0)}


def _case(seed=0, n_src=6, n_dst=9, num_edges=30, heads=2, d=5, dv=3):
    """Edges in shuffled caller order, 6 of them duplicated, into destinations 0..n_dst-2 (the last
    has no in-edges), and float64 q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), bias (E, H),
    edge_key, edge_scale (E, H, D) and edge_value (E, H, Dv)."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.stack(
        [torch.randint(0, n_src, (num_edges,), generator=gen), torch.randint(0, n_dst - 1, (num_edges,), generator=gen)]
    )
    ei = torch.cat([ei, ei[:, :6]], 1)
    ei = ei[:, torch.randperm(ei.shape[1], generator=gen)]
    assert (ei[1].diff() < 0).any()  # not destination-sorted
    e = ei.shape[1]
    shapes = dict(
        q=(n_dst, heads, d), k=(n_src, heads, d), v=(n_src, heads, dv), bias=(e, heads),
        edge_key=(e, heads, d), edge_value=(e, heads, dv), edge_scale=(e, heads, d),
    )  # fmt: skip
    return ei, {n: torch.randn(*shape, generator=gen, dtype=torch.float64) for n, shape in shapes.items()}


def _run(backend, ei, x, terms, dtype=torch.float64, clamp=(-2.0, 2.0), eps=0.0, grad_terms=True):
    """out, weights and the gradients of <out, g> + <weights, g_w> (random g, g_w) for q, k, v, bias
    and the given terms (those only when grad_terms), by name; x's float64 tensors cast to dtype."""
    leaves = {n: t.to(DEVICE, dtype).requires_grad_(n not in TERMS or grad_terms) for n, t in x.items()}
    given = {n: leaves[n] for n in terms}
    out, w = edge_attention(
        leaves["q"], leaves["k"], leaves["v"], ei.to(DEVICE), bias=leaves["bias"], clamp=clamp, eps=eps,
        backend=backend, return_weights=True, **given,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    g_out, g_w = (torch.randn(t.shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for t in (out, w))
    wrt = {n: t for n, t in leaves.items() if t.requires_grad and (n not in TERMS or n in terms)}
    grads = torch.autograd.grad([out, w], list(wrt.values()), [g_out, g_w])
    return {"out": out.detach(), "weights": w.detach(), **{f"d{n}": g for n, g in zip(wrt, grads)}}


def _assert_matches(got, want, dtype):
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == dtype, name
        assert_close(got[name].cpu(), want[name].cpu(), dtype, name)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("terms", [(t,) for t in TERMS] + [TERMS], ids="+".join)
def test_terms_match_the_reference(terms, mode):
    """float64, bias and returned weights throughout: values and every gradient to 1e-10."""
    clamp, eps = MODES[mode]
    ei, x = _case()
    got = _run("triton", ei, x, terms, clamp=clamp, eps=eps)
    _assert_matches(got, _run("reference", ei, x, terms, clamp=clamp, eps=eps), torch.float64)
    assert (got["out"][-1] == 0).all() and (got["dq"][-1] == 0).all()  # no in-edges: 0 and zero gradient


@pytest.mark.parametrize("mode", ["clamp-eps", "exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_lower_precision_matches_the_reference(dtype, mode):
    """float32 within its tolerance of the reference; float16 within 2x (3x for gradients) the error
    of the reference run in float16, both against the float64 reference."""
    clamp, eps = MODES[mode]
    ei, x = _case(seed=1)
    got = _run("triton", ei, x, TERMS, dtype, clamp, eps)
    if dtype == torch.float32:
        _assert_matches(got, _run("reference", ei, x, TERMS, dtype, clamp, eps), dtype)
        return
    ref, gold = (_run("reference", ei, x, TERMS, t, clamp, eps) for t in (dtype, torch.float64))
    for name in gold:
        assert got[name].dtype == dtype
        factor = 3.0 if name.startswith("d") else 2.0
        assert_within_reference_error(got[name].cpu(), ref[name].cpu(), gold[name].cpu(), factor, name)


@pytest.mark.parametrize("mode", ["clamp-eps", "exact"])
def test_terms_shared_by_the_heads(mode):
    """(E, 1, .) terms are read with head stride 0 and get their per-head gradients summed; with
    H=3, mixed with a per-head edge_scale in exact mode."""
    clamp, eps = MODES[mode]
    ei, x = _case(seed=2, heads=3)
    shared = TERMS if mode == "clamp-eps" else ("edge_key", "edge_value")
    for name in shared:
        x[name] = x[name][:, :1].contiguous()
    got = _run("triton", ei, x, TERMS, clamp=clamp, eps=eps)
    _assert_matches(got, _run("reference", ei, x, TERMS, clamp=clamp, eps=eps), torch.float64)
    assert all(got[f"d{n}"].shape[1] == 1 for n in shared)


@pytest.mark.parametrize("bwd_layout", tk.BACKWARD_LAYOUTS)
@pytest.mark.parametrize("layout", list(tk.LAYOUTS))
def test_forward_layouts_across_edge_tiles(layout, bwd_layout):
    """Each forward and backward layout with 2-edge tiles in the forward and the backward, so every
    destination and source spans several tiles; H=3 (the heads layouts pad to 4 heads); a large eps
    (0.5)."""
    ei, x = _case(seed=3, heads=3, d=6, dv=4)
    with tk.forward_config(layout=layout, BLOCK_E=2), tk.backward_config(layout=bwd_layout, BLOCK_E=2):
        got = _run("triton", ei, x, TERMS, eps=0.5)
    _assert_matches(got, _run("reference", ei, x, TERMS, eps=0.5), torch.float64)


@pytest.mark.parametrize("mode", ["clamp-eps", "exact"])
def test_shared_terms_in_the_heads_backward(mode):
    """The heads backward reads (E, 1, .) terms with head stride 0 for all heads of a program and
    writes each head's gradient row, summed afterwards."""
    clamp, eps = MODES[mode]
    ei, x = _case(seed=6, heads=3)
    for name in TERMS:
        x[name] = x[name][:, :1].contiguous()
    with tk.backward_config(layout="heads", BLOCK_E=4):
        got = _run("triton", ei, x, TERMS, clamp=clamp, eps=eps)
    _assert_matches(got, _run("reference", ei, x, TERMS, clamp=clamp, eps=eps), torch.float64)


def test_terms_without_gradient():
    """Terms that want no gradient get none computed (the kernels' GRAD_EDGE_* flags off) and leave
    the others' gradients right."""
    ei, x = _case(seed=4)
    got = _run("triton", ei, x, TERMS, clamp=None, grad_terms=False)
    assert not any(f"d{n}" in got for n in TERMS)
    _assert_matches(got, _run("reference", ei, x, TERMS, clamp=None, grad_terms=False), torch.float64)


def test_no_edge_by_feature_tensor_but_the_gradients():
    """Forward and backward make no (E, H, D)-sized tensor other than the three terms' gradients."""
    ei, x = _case(seed=5, d=8, dv=8)
    num_edges, heads = x["bias"].shape
    leaves = {n: t.to(DEVICE).requires_grad_() for n, t in x.items()}
    ei = ei.to(DEVICE)
    big = []

    class _Recorder(_LargestIntermediate):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            ins = {a.data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.numel() >= num_edges * heads * 8 and t.data_ptr() not in ins:
                    big.append(t)
            return out

    with _Recorder():
        out = edge_attention(
            leaves["q"], leaves["k"], leaves["v"], ei, bias=leaves["bias"], backend="triton",
            **{n: leaves[n] for n in TERMS},
        )  # fmt: skip
        grads = torch.autograd.grad(out.sum(), [leaves[n] for n in TERMS])
    assert {t.data_ptr() for t in big} == {g.data_ptr() for g in grads}


@pytest.mark.parametrize("mode", ["clamp-eps", "exact"])
def test_double_backward_with_edge_terms(mode):
    """create_graph=True: the gradients (recomputed through the reference) differentiate again, equal
    to the reference backend's second derivatives."""
    clamp, eps = MODES[mode]
    ei, x = _case(seed=6, n_src=4, n_dst=5, num_edges=12, d=4, dv=3)
    res = []
    for backend in ("triton", "reference"):
        leaves = {n: t.to(DEVICE).requires_grad_() for n, t in x.items()}
        out = edge_attention(
            leaves["q"], leaves["k"], leaves["v"], ei.to(DEVICE), bias=leaves["bias"], clamp=clamp, eps=eps,
            backend=backend, **{n: leaves[n] for n in TERMS},
        )  # fmt: skip
        first = torch.autograd.grad((out**2).sum(), list(leaves.values()), create_graph=True)
        second = torch.autograd.grad(sum((g**2).sum() for g in first), list(leaves.values()))
        res.append([g.detach() for g in (*first, *second)])
    for got, want in zip(*res):
        assert_close(got.cpu(), want.cpu(), torch.float64, "double backward")


def test_compiled_with_edge_terms():
    """Under torch.compile (AOTAutograd, no codegen) the ops' fake implementations give the shapes
    of out, weights and every gradient, a shared (E, 1, D) edge_key's included."""
    ei, x = _case(seed=7, n_src=4, n_dst=5, num_edges=12, d=4, dv=3)
    x["edge_key"] = x["edge_key"][:, :1].contiguous()
    leaves = {n: t.to(DEVICE).requires_grad_() for n, t in x.items()}

    def fn(q, k, v, ei, bias, edge_key, edge_value, edge_scale):
        out, w = edge_attention(
            q, k, v, ei, bias=bias, eps=1e-3, edge_key=edge_key, edge_value=edge_value, edge_scale=edge_scale,
            backend="triton", return_weights=True,
        )  # fmt: skip
        return out.sum() + (w**2).sum()

    res = []
    for f in (torch.compile(fn, fullgraph=True, backend="aot_eager"), fn):
        loss = f(leaves["q"], leaves["k"], leaves["v"], ei.to(DEVICE), *(leaves[n] for n in ("bias", *TERMS)))
        res.append([loss.detach(), *torch.autograd.grad(loss, list(leaves.values()))])
    for got, want in zip(*res):
        assert got.shape == want.shape
        assert_close(got.cpu(), want.cpu(), torch.float64, "compiled")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_opcheck_of_both_ops_with_edge_terms(dtype):
    """Schema, fake implementations (shapes, strides, dtypes as the real ones) and the autograd
    registration of the forward op and the backward op, a shared (E, 1, Dv) edge_value included;
    float32 keeps the forward's scores (E, H) for the backward, float64 none."""
    ei, x = _case(seed=8, n_src=4, n_dst=5, num_edges=10, d=4, dv=3)
    x["edge_value"] = x["edge_value"][:, :1].contiguous()
    x = {n: t.to(DEVICE, dtype).requires_grad_() for n, t in x.items()}
    g = Graph(ei.to(DEVICE), 4, 5)
    terms = [x[n] for n in TERMS]
    ptr, idx, perm = g.csr()
    cptr, cidx, cperm = g.csc()
    fwd = tk.TRITON_OP.forward.bind(
        q=x["q"], k=x["k"], v=x["v"], edge_index=g.edge_index, bias=x["bias"], mask=None,
        **dict(zip(TERMS, terms)), eps=1e-3, scale=0.5, clamp=[-2.0, 2.0], return_weights=True,
        ptr=ptr, idx=idx, perm=perm, cptr=cptr, cidx=cidx, cperm=cperm, forward_settings=policy.forward_ints({}),
        backward_launch=policy.launch_ints(policy.backward_settings(4, 3, 2)),
    )  # fmt: skip
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(tk.triton_attention_fwd, fwd, test_utils=checks)
    _, _, stats, scores = tk.triton_attention_fwd(*fwd)
    assert scores.shape == ((ei.shape[1], 2) if dtype == torch.float32 else (0, 2))
    d_out, d_w = (torch.randn(*shape, dtype=dtype, device=DEVICE) for shape in ((5, 2, 3), (ei.shape[1], 2)))
    named = {n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in zip(tk.TRITON_OP.forward.names, fwd)}
    given = {n: named[n] for n in tk.TRITON_OP.backward.names if n in named}
    for layout in tk.BACKWARD_LAYOUTS:
        given["backward_launch"] = policy.launch_ints(policy.backward_settings(4, 3, 2, {"layout": layout}))
        names = tk.TRITON_OP.forward.grad_args  # q, k, v, bias, then the edge terms
        for needs in ([True] * len(names), [n in ("q", "k", "v", "edge_value") for n in names]):  # unwanted: empty
            bwd = tk.TRITON_OP.backward.bind(
                **given, stats=stats, scores=scores, grad_out=d_out, grad_weights=d_w, needs=needs
            )
            grads = tk.triton_attention_bwd(*bwd)
            assert [t.numel() > 0 for t in grads] == needs
            if dtype == torch.float32:  # the backward reads the forward's scores, not its own sums
                moved = dict(given, stats=stats, scores=scores + 0.25, grad_out=d_out, grad_weights=d_w, needs=needs)
                assert not torch.allclose(tk.triton_attention_bwd(*tk.TRITON_OP.backward.bind(**moved))[0], grads[0])
            torch.library.opcheck(tk.triton_attention_bwd, bwd, test_utils=checks[:2])


def test_the_registry_declares_the_terms_the_kernels_take():
    """The registry names triton's terms without importing triton (TRITON_TERMS): they must be the
    kernels' EK, EV, ES parameters (launch.TERM_ORDER) and eps, and its entry must declare them."""
    from sparseattn.kernels import TRITON_TERMS, registered_backend
    from sparseattn.kernels.contract import EPS
    from sparseattn.kernels.triton import launch

    assert TRITON_TERMS == frozenset(launch.TERM_ORDER) | {EPS}
    assert registered_backend("triton").edge_terms == TRITON_TERMS
