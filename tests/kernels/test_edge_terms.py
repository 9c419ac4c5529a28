"""Edge terms (edge_key, edge_value, edge_scale) and the normalizer eps, in every backend that takes
them: values and gradients of every input equal to a per-destination loop written here from the
formula (independent of `reference`), the csr ops' float64 gradcheck and double backward, no
(E, H, D) intermediate in csr without edge_scale and at most one with it, torch.compile, and the
errors for what a backend or argument cannot take."""

import itertools

import pytest
import torch

from sparseattn import Graph, edge_attention, graphs
from sparseattn.kernels import KernelOptions, choose_auto
from sparseattn.kernels.contract import AttentionInputs
from sparseattn.kernels.csr import csr_attention

from ..optional import backend_params
from .test_csr import _LargestIntermediate

TERMS = ("edge_key", "edge_value", "edge_scale")
MODES = {"clamp": ((-1.0, 1.0), 0.0), "clamp-eps": ((-1.0, 1.0), 1e-3), "exact": (None, 0.0)}
BACKENDS = backend_params(["reference", "csr", "scatter"])


def loop_attention(q, k, v, edge_index, scale, clamp, eps, bias, edge_key, edge_value, edge_scale):
    """The formula, one destination and one head at a time: out (N_dst, H, Dv), weights (E, H)."""
    src, dst = edge_index.tolist()
    n_dst, heads = q.shape[0], q.shape[1]
    outs, weights = [], [[None] * heads for _ in src]
    for t in range(n_dst):
        edges = [e for e, d in enumerate(dst) if d == t]
        row = []
        for h in range(heads):
            scores = []
            for e in edges:
                key = k[src[e], h] + (0 if edge_key is None else edge_key[e, h])
                prod = q[t, h] * key * (1 if edge_scale is None else edge_scale[e, h])
                scores.append(scale * prod.sum() + (0 if bias is None else bias[e, h]))
            if not edges:
                row.append(torch.zeros_like(v[0, h]))
                continue
            s = torch.stack(scores)
            w = torch.exp(s.clamp(*clamp)) if clamp is not None else torch.exp(s - s.max().detach())
            vals = torch.stack([v[src[e], h] + (0 if edge_value is None else edge_value[e, h]) for e in edges])
            z = w.sum() + eps
            row.append((w[:, None] * vals).sum(0) / z)
            for i, e in enumerate(edges):
                weights[e][h] = w[i] / z
        outs.append(torch.stack(row))
    return torch.stack(outs), torch.stack([torch.stack(w) for w in weights])


def _case(dtype, seed=0, n_dst=6, n_src=5, num_edges=24, heads=2, d=3, dv=4):
    """Unsorted edges with duplicates, into all destinations but the last (isolated)."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.stack(
        [torch.randint(0, n_src, (num_edges,), generator=gen), torch.randint(0, n_dst - 1, (num_edges,), generator=gen)]
    )
    ei[:, 1] = ei[:, 0]  # a duplicate edge

    def t(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()

    tensors = dict(
        q=t(n_dst, heads, d), k=t(n_src, heads, d), v=t(n_src, heads, dv), bias=t(num_edges, heads),
        edge_key=t(num_edges, heads, d), edge_value=t(num_edges, heads, dv), edge_scale=t(num_edges, heads, d),
    )  # fmt: skip
    return ei, tensors


def _grads(out, weights, leaves):
    gen = torch.Generator().manual_seed(1)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)).sum() + (weights**2).sum()
    return torch.autograd.grad(loss, leaves, allow_unused=True)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("terms", [t for n in (1, 3) for t in itertools.combinations(TERMS, n)], ids="+".join)
@pytest.mark.parametrize("backend", BACKENDS)
def test_values_and_gradients_equal_the_formula(backend, terms, mode):
    clamp, eps = MODES[mode]
    ei, x = _case(torch.float64)
    given = {n: x[n] for n in terms}
    leaves = [x["q"], x["k"], x["v"], x["bias"], *given.values()]
    out, w = edge_attention(
        x["q"], x["k"], x["v"], ei, scale=0.7, clamp=clamp, eps=eps, bias=x["bias"], **given,
        backend=backend, return_weights=True,
    )  # fmt: skip
    want_out, want_w = loop_attention(
        x["q"], x["k"], x["v"], ei, 0.7, clamp, eps, x["bias"], *(given.get(n) for n in TERMS)
    )
    torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(w, want_w, atol=1e-10, rtol=1e-10)
    for name, got, want in zip(
        ["q", "k", "v", "bias", *terms], _grads(out, w, leaves), _grads(want_out, want_w, leaves)
    ):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("mode", ["clamp-eps", "exact"])
@pytest.mark.parametrize("shared", [t for n in (1, 3) for t in itertools.combinations(TERMS, n)], ids="+".join)
@pytest.mark.parametrize("backend", BACKENDS)
def test_terms_shared_by_the_heads_equal_their_expanded_copies(backend, shared, mode):
    """An (E, 1, .) term is the (E, H, .) term with one row repeated over the heads; its gradient is
    the expanded one's summed over the heads."""
    clamp, eps = MODES[mode]
    ei, x = _case(torch.float64, heads=3)
    for name in shared:
        x[name] = x[name][:, :1].detach().requires_grad_()
    expanded = {n: x[n].expand(-1, 3, -1) if n in shared else x[n] for n in TERMS}
    leaves = [x[n] for n in ("q", "k", "v", "bias", *TERMS)]
    res = []
    for terms, be in ((x, backend), (expanded, "reference")):
        out, w = edge_attention(
            x["q"], x["k"], x["v"], ei, clamp=clamp, eps=eps, bias=x["bias"], backend=be, return_weights=True,
            **{n: terms[n] for n in TERMS},
        )  # fmt: skip
        res.append((out, w, *_grads(out, w, leaves)))
    for got, want in zip(*res):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_shared_terms_in_csr_gather_nothing_per_head():
    """(E, 1, D) edge_key and edge_value (sparseattn.nn.TransformerConv's form): forward and backward
    allocate no (E, H, .) tensor beyond (E, H) scalars."""
    n, heads, d = 48, 4, 16
    g = graphs.window(n, radius=8)
    e = g.num_edges
    q, k, v = (torch.randn(n, heads, d, requires_grad=True) for _ in range(3))
    ek, ev = (torch.randn(e, 1, d, requires_grad=True) for _ in range(2))
    edge_attention(q, k, v, g, backend="csr", clamp=None, edge_key=ek, edge_value=ev).sum().backward()  # index
    with _LargestIntermediate() as mode:
        edge_attention(q, k, v, g, backend="csr", clamp=None, edge_key=ek, edge_value=ev).sum().backward()
    assert mode.largest <= max(e * d, e * heads + 1, n * heads * d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_with_every_term_within_float32_error(backend):
    ei, x = _case(torch.float64, seed=3, n_dst=20, n_src=15, num_edges=90, heads=3, d=8, dv=5)
    x32 = {n: t.detach().float().requires_grad_() for n, t in x.items()}
    for clamp, eps in MODES.values():
        res = []
        for tensors in (x, x32):
            out, w = edge_attention(
                tensors["q"], tensors["k"], tensors["v"], ei,
                clamp=clamp, eps=eps, backend=backend, return_weights=True,
                **{n: tensors[n] for n in ("bias", *TERMS)},
            )  # fmt: skip
            res.append((out, w, *_grads(out, w, list(tensors.values()))))
        for got, want in zip(res[1], res[0]):
            torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("clamp", [(-0.6, 0.6), None])
def test_gradcheck_and_double_backward_through_the_csr_ops(clamp):
    ei, x = _case(torch.float64, n_dst=5, n_src=4, num_edges=10, heads=2, d=2, dv=2)
    g = Graph(ei, 4, 5)
    mask = (torch.rand(10, 2, generator=torch.Generator().manual_seed(2)) > 0.3).double() / 0.7
    eps = 1e-2 if clamp is not None else 0.0

    def f(q, k, v, bias, edge_key, edge_value, edge_scale):
        interleaved = KernelOptions(csr_layout="interleaved")
        inputs = AttentionInputs(
            q, k, v, g, 0.7, clamp, bias, mask, True, edge_key, edge_value, edge_scale, eps, interleaved
        )
        return csr_attention(inputs)

    args = tuple(x[n] for n in ("q", "k", "v", "bias", *TERMS))
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)
    assert torch.autograd.gradgradcheck(f, args, eps=1e-6, atol=1e-6)


def test_csr_gathers_no_edge_by_feature_tensor_without_edge_scale_and_one_with_it():
    n, heads, d = 48, 2, 16
    g = graphs.window(n, radius=8)
    e = g.num_edges
    q, k, v = (torch.randn(n, heads, d, requires_grad=True) for _ in range(3))
    ek, ev, es = (torch.randn(e, heads, d, requires_grad=True) for _ in range(3))
    for kwargs, most in (({"edge_key": ek, "edge_value": ev}, 0), ({"edge_key": ek, "edge_scale": es}, 1)):
        edge_attention(q, k, v, g, backend="csr", **kwargs)  # builds and caches the index first
        with _LargestIntermediate() as mode:
            out = edge_attention(q, k, v, g, backend="csr", **kwargs)
        assert mode.largest <= max(e * heads * d * most, e * heads + 1, n * heads * d)
        out.sum().backward()  # (the backward returns (E, H, D) gradients: not measured)


def test_dense_refuses_edge_terms_and_auto_avoids_it():
    g = graphs.batch([graphs.complete(40), graphs.complete(40)])
    q = torch.randn(80, 2, 4)
    ek = torch.randn(g.num_edges, 2, 4)
    wide = torch.zeros(1, 8, 64)  # heads wide enough not to be "small", which takes edge terms
    assert choose_auto(wide, g) == "dense"
    assert choose_auto(wide, g, edge_terms=True) == "csr"
    with pytest.raises(ValueError, match="backend 'dense' does not take edge_key"):
        edge_attention(q, q, q, g, edge_key=ek, backend="dense")
    with pytest.raises(ValueError, match="'dense' does not take"):
        edge_attention(q, q, q, g, eps=1e-6, backend="dense")
    out = edge_attention(q, q, q, g, edge_key=ek)
    torch.testing.assert_close(out, edge_attention(q, q, q, g, edge_key=ek, backend="reference"))


def test_errors_name_the_argument():
    ei = torch.tensor([[0, 1], [1, 0]])
    q = torch.randn(2, 2, 4)
    v = torch.randn(2, 2, 3)
    with pytest.raises(
        ValueError, match=r"edge_key must have shape \(E, H, D\) = \(2, 2, 4\) or \(E, 1, D\).*got \(2, 8\)"
    ):
        edge_attention(q, q, v, ei, edge_key=torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"edge_value must have shape \(E, H, Dv\) = \(2, 2, 3\)"):
        edge_attention(q, q, v, ei, edge_value=torch.randn(2, 2, 4))
    with pytest.raises(TypeError, match="edge_scale must be a floating-point tensor"):
        edge_attention(q, q, v, ei, edge_scale=torch.ones(2, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="eps > 0 needs clamp mode"):
        edge_attention(q, q, v, ei, clamp=None, eps=1e-6)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        edge_attention(q, q, v, ei, eps=-1.0)
    with pytest.raises(ValueError, match="interleaved layout only"):
        edge_attention(q, q, v, ei, edge_key=q[:2], backend="csr", kernel_options={"csr_layout": "head-major"})


@pytest.mark.parametrize("backend", BACKENDS)
def test_eps_gives_exphormers_normalizer_and_zero_for_isolated_destinations(backend):
    ei = torch.tensor([[0, 1], [0, 0]])  # destination 1 has no in-edges
    q = torch.zeros(2, 1, 1, dtype=torch.float64)  # scores 0: w = 1 on each edge
    v = torch.tensor([[[2.0]], [[4.0]]], dtype=torch.float64)
    out = edge_attention(q, q, v, ei, eps=0.5, backend=backend)
    assert out[:, 0, 0].tolist() == pytest.approx([6.0 / 2.5, 0.0], rel=1e-12)


def test_compiled_edge_terms_equal_eager():
    ei, x = _case(torch.float32, n_dst=9, n_src=7, num_edges=30)

    def fn(q, k, v, edge_key, edge_value, edge_scale):
        return edge_attention(
            q, k, v, ei, clamp=(-2.0, 2.0), eps=1e-6, edge_key=edge_key, edge_value=edge_value, edge_scale=edge_scale
        )

    args = [x[n] for n in ("q", "k", "v", *TERMS)]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for f in (fn, compiled):
        out = f(*args)
        grads = torch.autograd.grad(out.square().sum(), args)
        if f is fn:
            want = (out, *grads)
        else:
            for got, ref in zip((out, *grads), want):
                torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_opcheck_of_the_forward_op_with_edge_terms():
    from sparseattn.kernels.csr.index import interleaved_index
    from sparseattn.kernels.csr.ops import CSR_OP, csr_attention_fwd

    ei, x = _case(torch.float64, n_dst=5, n_src=4, num_edges=10)
    g = Graph(ei, 4, 5)
    ix = interleaved_index(g, 2)
    index = (ix.crow, ix.col, ix.offsets, ix.row, *ix.transposed(), ix.from_caller, ix.to_caller)
    names = ("crow", "col", "offsets", "row", "ccrow", "ccol", "to_csc", "from_caller", "to_caller")
    terms = {n: x[n] for n in ("edge_key", "edge_value", "edge_scale")}
    args = CSR_OP.forward.bind(
        q=x["q"], k=x["k"], v=x["v"], edge_index=ei, bias=x["bias"], **terms, eps=1e-3, scale=0.7,
        clamp=[-0.5, 0.5], return_weights=True, **dict(zip(names, index)), head_major_layout=False,
    )  # fmt: skip
    torch.library.opcheck(
        csr_attention_fwd, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )
