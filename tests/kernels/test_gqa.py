"""Grouped-query heads: k and v with H_kv heads, H_kv dividing q's H (query head h reads kv head
h // G, G = H / H_kv). Every backend's values, weights and gradients equal the same call with k and
v repeated per head (`repeat_interleave(G, dim=1)`), whose k and v gradients, summed over each
group, are the grouped call's; and the independent dense masked attention (tests/dense.py). csr
never allocates a (N_src, H, D) tensor; EdgeAttention(num_kv_heads=...) equals a module with the
key and value weights repeated; the errors name the arguments."""

import pytest
import torch

from sparseattn import EdgeAttention, Graph, edge_attention, graphs
from sparseattn.kernels import KernelOptions

from ..dense import dense_attention
from ..optional import needs_backend
from .test_csr import _LargestIntermediate

HEADS = 4
GROUPS = (1, 2, 4)
MODES = {"clamp": (-1.0, 1.0), "exact": None}
# (backend, csr layout); dense runs on a block graph (below)
SPARSE = [("reference", None), ("csr", "interleaved"), ("csr", "head-major"), ("csr", None), ("auto", None)]
SPARSE += [("scatter", None), ("triton", None)]  # skipped with the reason where not installed


def _random_graph(n_dst=6, n_src=5, num_edges=20, seed=0):
    """Unsorted edges with a duplicate, into every destination but the last (isolated)."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.stack(
        [torch.randint(0, n_src, (num_edges,), generator=gen), torch.randint(0, n_dst - 1, (num_edges,), generator=gen)]
    )
    ei[:, 1] = ei[:, 0]
    return ei, n_src, n_dst


def _inputs(n_dst, n_src, num_edges, groups, *, bias, terms, dtype=torch.float64, seed=1, d=3, dv=5, device="cpu"):
    gen = torch.Generator().manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device).requires_grad_()

    kv_heads = HEADS // groups
    q, k, v = t(n_dst, HEADS, d), t(n_src, kv_heads, d), t(n_src, kv_heads, dv)
    extra = {}
    if bias:
        extra["bias"] = t(num_edges, HEADS)
    if terms:  # one shared row (E, 1, .) among the per-query-head ones
        extra.update(edge_key=t(num_edges, HEADS, d), edge_value=t(num_edges, 1, dv), edge_scale=t(num_edges, HEADS, d))
    return q, k, v, extra


def _grads(out, weights, tensors, seed=2):
    gen = torch.Generator().manual_seed(seed)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)).sum()
    loss = loss + (weights * torch.randn(weights.shape, generator=gen, dtype=out.dtype).to(out.device)).sum()
    return torch.autograd.grad(loss, tensors)


def _check_against_repeated(q, k, v, graph, extra, backend, layout, clamp, groups):
    """The grouped call equals the repeated-heads call of the same backend and the reference, in
    values, weights and every gradient (k's and v's summed over each group)."""
    options = KernelOptions(csr_layout=layout)
    out, w = edge_attention(
        q, k, v, graph, clamp=clamp, backend=backend, return_weights=True, kernel_options=options, **extra
    )
    leaves = (q, k, v, *extra.values())
    grads = _grads(out, w, leaves)
    k_rep, v_rep = (x.detach().repeat_interleave(groups, dim=1).requires_grad_() for x in (k, v))
    out_r, w_r = edge_attention(q, k_rep, v_rep, graph, clamp=clamp, backend="reference", return_weights=True, **extra)
    grads_r = list(_grads(out_r, w_r, (q, k_rep, v_rep, *extra.values())))
    for i, x in ((1, k), (2, v)):  # the repeated heads' gradients, summed over each kv head's group
        grads_r[i] = grads_r[i].view(x.shape[0], x.shape[1], groups, x.shape[2]).sum(2)
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(w, w_r)
    for name, g, g_r in zip(("q", "k", "v", *extra), grads, grads_r):
        torch.testing.assert_close(g, g_r, msg=lambda m, name=name: f"d{name}: {m}")
    return out, k_rep, v_rep


# edge terms run in csr's interleaved layout only (head-major refuses them: test_edge_terms)
CASES = [(b, lay, bias, terms) for b, lay in SPARSE for bias, terms in ((False, False), (True, False), (True, True))]
CASES = [
    pytest.param(*c, marks=needs_backend(c[0]), id="-".join(map(str, c)))
    for c in CASES
    if not (c[3] and c[1] == "head-major")
]


@pytest.mark.parametrize("backend,layout,bias,terms", CASES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("groups", GROUPS)
def test_equals_repeated_heads(backend, layout, bias, terms, mode, groups):
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"  # else interpreted
    ei, n_src, n_dst = _random_graph()
    ei = ei.to(device)
    q, k, v, extra = _inputs(n_dst, n_src, ei.shape[1], groups, bias=bias, terms=terms, device=device)
    graph = Graph(ei, num_src=n_src, num_dst=n_dst) if backend == "csr" else ei  # a kept Graph and a raw tensor
    out, k_rep, v_rep = _check_against_repeated(q, k, v, graph, extra, backend, layout, MODES[mode], groups)
    if not extra:  # the independent dense masked attention
        expected = dense_attention(q.detach(), k_rep.detach(), v_rep.detach(), ei, clamp=MODES[mode])
        torch.testing.assert_close(out.detach(), expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("groups", GROUPS)
def test_dense_backend_on_blocks(mode, groups):
    """dense (k and v repeated at its entry) and auto (which picks dense here) on a block graph."""
    g = graphs.from_blocks([("full", 4, 3), ("causal", 5, 5), ("full_no_self", 3, 3)])
    q, k, v, extra = _inputs(g.num_dst, g.num_src, g.num_edges, groups, bias=True, terms=False)
    for backend in ("dense", "auto"):
        out, k_rep, v_rep = _check_against_repeated(q, k, v, g, extra, backend, None, MODES[mode], groups)
    plain = edge_attention(q, k, v, g, clamp=MODES[mode], backend="dense")
    expected = dense_attention(q.detach(), k_rep.detach(), v_rep.detach(), g.edge_index, clamp=MODES[mode])
    torch.testing.assert_close(plain.detach(), expected)


@pytest.mark.parametrize("backend", ["reference", "csr"])
def test_float32_and_dropout(backend):
    """float32 (csr's embedding_bag path) and attention dropout: the same seed draws the same (E, H)
    mask, so the grouped call equals the repeated one."""
    ei, n_src, n_dst = _random_graph(n_dst=30, n_src=25, num_edges=200)
    q, k, v, extra = _inputs(n_dst, n_src, ei.shape[1], 2, bias=True, terms=False, dtype=torch.float32)
    torch.manual_seed(5)
    out = edge_attention(q, k, v, ei, backend=backend, dropout_p=0.3, **extra)
    gq, gk, gv = torch.autograd.grad(out.square().sum(), (q, k, v))
    k_rep, v_rep = (x.detach().repeat_interleave(2, dim=1).requires_grad_() for x in (k, v))
    torch.manual_seed(5)
    out_r = edge_attention(q, k_rep, v_rep, ei, backend="reference", dropout_p=0.3, **extra)
    gq_r, gk_r, gv_r = torch.autograd.grad(out_r.square().sum(), (q, k_rep, v_rep))
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(gq, gq_r)
    torch.testing.assert_close(gk, gk_r.view(n_src, 2, 2, -1).sum(2))
    torch.testing.assert_close(gv, gv_r.view(n_src, 2, 2, -1).sum(2))


@pytest.mark.parametrize("layout", ["interleaved", "head-major"])
def test_csr_never_repeats_kv(layout):
    """Forward and backward of csr allocate nothing of (N_src, H, D) elements: k and v are read
    per kv head (many sources, few destinations, so N_src * H * D dwarfs the rest)."""
    n_src, n_dst, d, groups = 64, 4, 16, 4
    gen = torch.Generator().manual_seed(0)
    ei = torch.stack([torch.randint(0, n_src, (40,), generator=gen), torch.randint(0, n_dst, (40,), generator=gen)])
    q = torch.randn(n_dst, HEADS, d, requires_grad=True)
    k, v = (torch.randn(n_src, HEADS // groups, d, requires_grad=True) for _ in range(2))
    graph = Graph(ei, num_src=n_src, num_dst=n_dst)
    with _LargestIntermediate() as mode:
        out = edge_attention(q, k, v, graph, backend="csr", kernel_options={"csr_layout": layout})
        out.sum().backward()
    assert mode.largest <= n_src * (HEADS // groups) * d < n_src * HEADS * d
    with _LargestIntermediate() as repeated:  # the same check sees the copy where k and v are repeated
        edge_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), graph, backend="csr")
    assert repeated.largest == n_src * HEADS * d


def test_errors_name_the_arguments():
    q, k, v = torch.randn(5, 6, 3), torch.randn(5, 4, 3), torch.randn(5, 4, 3)
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=r"multiple of k's and v's heads H_kv.*H=6 and H_kv=4"):
        edge_attention(q, k, v, ei)
    with pytest.raises(
        ValueError, match=r"k and v must have the same number of heads H_kv.*k \(5, 2, 3\), v \(5, 3, 3\)"
    ):
        edge_attention(torch.randn(5, 6, 3), torch.randn(5, 2, 3), torch.randn(5, 3, 3), ei)
    q, k, v = torch.randn(5, 4, 3), torch.randn(5, 2, 3), torch.randn(5, 2, 3)
    for name, width in (("edge_key", 3), ("edge_value", 3), ("edge_scale", 3)):
        per_kv_head = torch.randn(2, 2, width)
        with pytest.raises(ValueError, match=rf"{name} must have shape \(E, H, .*per query head.*repeat_interleave\(2"):
            edge_attention(q, k, v, ei, **{name: per_kv_head})
    with pytest.raises(ValueError, match=r"bias must have shape \(E, H\) = \(2, 4\)"):
        edge_attention(q, k, v, ei, bias=torch.randn(2, 2))
    with pytest.raises(ValueError, match="num_heads must be a multiple of num_kv_heads.*num_heads=4, num_kv_heads=3"):
        EdgeAttention(8, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int"):
        EdgeAttention(8, 4, num_kv_heads=0)


def _repeated_module(attn: EdgeAttention) -> EdgeAttention:
    """A num_heads module computing what `attn` (num_kv_heads) computes: its key and value rows
    repeated for each kv head's query heads."""
    h, h_kv, d, e = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.embed_dim
    full = EdgeAttention(e, h, clamp=attn.clamp, kdim=attn.kdim, vdim=attn.vdim).double()
    state = attn.state_dict()

    def rep(w):  # (H_kv * D, ...) -> (H * D, ...), each kv head's D rows repeated G times
        return w.view(h_kv, d, *w.shape[1:]).repeat_interleave(h // h_kv, dim=0).reshape(h * d, *w.shape[1:])

    if "in_proj_weight" in state:
        wq, wk, wv = state["in_proj_weight"].split([e, h_kv * d, h_kv * d])
        state["in_proj_weight"] = torch.cat([wq, rep(wk), rep(wv)])
    else:
        state["k_proj_weight"], state["v_proj_weight"] = rep(state["k_proj_weight"]), rep(state["v_proj_weight"])
    bq, bk, bv = state["in_proj_bias"].split([e, h_kv * d, h_kv * d])
    state["in_proj_bias"] = torch.cat([bq, rep(bk), rep(bv)])
    full.load_state_dict(state)
    return full


@pytest.mark.parametrize("kdim", [None, 6], ids=["packed", "separate"])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_module_num_kv_heads(kdim, num_kv_heads):
    torch.manual_seed(0)
    attn = EdgeAttention(16, 4, num_kv_heads=num_kv_heads, kdim=kdim, vdim=kdim).double()
    with torch.no_grad():
        attn.in_proj_bias.normal_()  # nonzero, so the bias split is checked too
    kv_dim = num_kv_heads * 4
    shapes = {n: tuple(t.shape) for n, t in attn.state_dict().items()}
    if kdim is None:
        assert shapes["in_proj_weight"] == (16 + 2 * kv_dim, 16)
    else:
        assert (shapes["q_proj_weight"], shapes["k_proj_weight"], shapes["v_proj_weight"]) == (
            (16, 16),
            (kv_dim, 6),
            (kv_dim, 6),
        )
    assert shapes["in_proj_bias"] == (16 + 2 * kv_dim,)
    full = _repeated_module(attn)
    ei, n_src, n_dst = _random_graph(n_dst=7, n_src=7, num_edges=30)
    x = torch.randn(7, 16, dtype=torch.float64)
    x_src = None if kdim is None else torch.randn(7, kdim, dtype=torch.float64)
    out, w = attn(x, ei, x_src, return_weights=True)
    out_r, w_r = full(x, ei, x_src, return_weights=True)
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(w, w_r)
    assert attn.project_kv(x if x_src is None else x_src).k.shape == (7, num_kv_heads, 4)
    out.square().sum().backward()
    out_r.square().sum().backward()
    torch.testing.assert_close(attn.out_proj.weight.grad, full.out_proj.weight.grad)
    name = "in_proj_weight" if kdim is None else "q_proj_weight"
    torch.testing.assert_close(getattr(attn, name).grad[:16], getattr(full, name).grad[:16])
    assert ("num_kv_heads" in repr(attn)) == (num_kv_heads != 4)


@pytest.mark.parametrize("layout", ["interleaved", "head-major"])
def test_csr_double_backward(layout):
    """Under create_graph=True csr's backward recomputes through the reference, which takes grouped heads."""
    ei, n_src, n_dst = _random_graph()
    q, k, v, extra = _inputs(n_dst, n_src, ei.shape[1], 2, bias=True, terms=False)

    def f(q, k, v, bias):
        return edge_attention(q, k, v, ei, bias=bias, backend="csr", kernel_options={"csr_layout": layout})

    assert torch.autograd.gradgradcheck(f, (q, k, v, extra["bias"]))
