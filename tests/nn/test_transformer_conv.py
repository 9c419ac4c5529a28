"""sparseattn.nn.TransformerConv against the real torch_geometric.nn.TransformerConv: same state
dict, equal outputs, attention weights and gradients (inputs, edge features, every parameter)."""

import itertools
import re
from typing import Dict, Optional

import pytest
import torch

import sparseattn
from sparseattn.nn import TransformerConv

from .helpers import assert_close, grads_of

pyg_nn = pytest.importorskip("torch_geometric.nn")

N_SRC, N_DST, EDGE_DIM, C = 6, 5, 4, 3
# sources 0..5 into destinations 0..4: destination 3 has no in-edges, (1 -> 0) and (4 -> 2) repeat,
# and the edges are not sorted by destination
EDGE_INDEX = torch.tensor(
    [
        [1, 0, 4, 2, 1, 5, 4, 3, 0, 2, 5, 4, 1],
        [0, 4, 2, 0, 0, 1, 2, 4, 1, 2, 4, 2, 1],
    ]
)


def make_pair(dtype: torch.dtype, bipartite: bool, **options):
    """PyG's layer and ours with PyG's state dict, in dtype."""
    in_channels = (N_SRC - 1, N_DST - 1) if bipartite else N_SRC - 1
    theirs = pyg_nn.TransformerConv(in_channels, C, **options).to(dtype)
    ours = TransformerConv(in_channels, C, **options, backend="auto").to(dtype)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def make_inputs(dtype: torch.dtype, bipartite: bool, edge_dim: Optional[int]):
    """Leaf inputs: x (a tensor, or a (source, destination) pair of different sizes and widths)
    and edge_attr; for a homogeneous graph every node is a source and a destination (N_SRC nodes)."""
    leaves: Dict[str, torch.Tensor] = {}
    if bipartite:
        leaves["x_src"] = torch.randn(N_SRC, N_SRC - 1, dtype=dtype, requires_grad=True)
        leaves["x_dst"] = torch.randn(N_DST, N_DST - 1, dtype=dtype, requires_grad=True)
        x = (leaves["x_src"], leaves["x_dst"])
    else:
        leaves["x"] = torch.randn(N_SRC, N_SRC - 1, dtype=dtype, requires_grad=True)
        x = leaves["x"]
    edge_attr = None
    if edge_dim is not None:
        edge_attr = leaves["edge_attr"] = torch.randn(EDGE_INDEX.shape[1], edge_dim, dtype=dtype, requires_grad=True)
    return x, edge_attr, leaves


def compare(theirs, ours, x, edge_attr, leaves, dtype, edge_index=EDGE_INDEX):
    """Outputs, attention weights and gradients of (a random projection of) the output with respect
    to the inputs and every parameter."""
    out_t, (ei_t, alpha_t) = theirs(x, EDGE_INDEX, edge_attr, return_attention_weights=True)
    out_o, (ei_o, alpha_o) = ours(x, edge_index, edge_attr, return_attention_weights=True)
    assert_close(out_o, out_t, dtype, "output vs PyG")
    assert_close(alpha_o, alpha_t, dtype, "attention weights vs PyG")
    assert torch.equal(ei_o, EDGE_INDEX)
    w = torch.randn_like(out_t)
    g_t = grads_of((out_t * w).sum(), {**leaves, **dict(theirs.named_parameters())})
    g_o = grads_of((out_o * w).sum(), {**leaves, **dict(ours.named_parameters())})
    assert g_t.keys() == g_o.keys()
    for name in g_t:
        kind = "grad of parameters vs PyG" if "." in name else "grad of inputs vs PyG"
        assert_close(g_o[name], g_t[name], dtype, f"grad of {name}", kind)


OPTIONS = [
    dict(concat=concat, beta=beta, root_weight=root_weight, bias=bias, edge_dim=edge_dim, heads=heads)
    for concat, beta, root_weight, bias, edge_dim, heads in itertools.product(
        [True, False], [False, True], [True, False], [True, False], [None, EDGE_DIM], [1, 3]
    )
]


@pytest.mark.parametrize("bipartite", [False, True], ids=["homogeneous", "bipartite"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_matches_pyg_on_every_option(options, bipartite):
    for dtype in (torch.float64, torch.float32):
        theirs, ours = make_pair(dtype, bipartite, **options)
        x, edge_attr, leaves = make_inputs(dtype, bipartite, options["edge_dim"])
        compare(theirs, ours, x, edge_attr, leaves, dtype)


@pytest.mark.parametrize("bipartite", [False, True], ids=["homogeneous", "bipartite"])
@pytest.mark.parametrize("options", [o for o in OPTIONS if o["edge_dim"] and o["heads"] == 3], ids=str)
def test_the_factored_edge_projection_matches_pyg(options, bipartite, monkeypatch):
    """The (E, 1, C + edge_dim) shared-row form that `kernels.auto.factor_edge_projection` picks for graphs
    beyond "small"'s size (here forced on the test graph): PyG's values and gradients."""
    monkeypatch.setattr(sparseattn.kernels.auto, "small_pays", lambda values, one_call, edge_kv=False: False)
    assert sparseattn.kernels.auto.factor_edge_projection(E, 3, C, EDGE_DIM)
    theirs, ours = make_pair(torch.float64, bipartite, **options)
    x, edge_attr, leaves = make_inputs(torch.float64, bipartite, EDGE_DIM)
    compare(theirs, ours, x, edge_attr, leaves, torch.float64)


@pytest.mark.parametrize("backend", ["reference", "scatter", "csr"])
def test_backends_and_graph_input_agree(backend):
    """Named backends, and a sparseattn.Graph (bipartite node counts) instead of the raw index."""
    if backend not in sparseattn.kernels.available_backends():
        pytest.skip(f"backend {backend!r} is not available here")
    theirs, ours = make_pair(torch.float64, True, heads=2, edge_dim=EDGE_DIM, beta=True)
    ours.backend = backend
    x, edge_attr, leaves = make_inputs(torch.float64, True, EDGE_DIM)
    graph = sparseattn.Graph(EDGE_INDEX, num_src=N_SRC, num_dst=N_DST)
    compare(theirs, ours, x, edge_attr, leaves, torch.float64, edge_index=graph)


def test_isolated_destination_gets_only_the_skip():
    theirs, ours = make_pair(torch.float64, True, heads=2, root_weight=False)
    x, _, _ = make_inputs(torch.float64, True, None)
    out = ours(x, EDGE_INDEX)
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    assert_close(out, theirs(x, EDGE_INDEX), torch.float64, "output vs PyG")


def test_state_dicts_load_both_ways_and_one_seed_gives_one_init():
    options = dict(heads=2, beta=True, edge_dim=EDGE_DIM)
    torch.manual_seed(3)
    theirs = pyg_nn.TransformerConv((5, 4), C, **options)
    torch.manual_seed(3)
    ours = TransformerConv((5, 4), C, **options)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    fresh = pyg_nn.TransformerConv((5, 4), C, **options)
    fresh.load_state_dict(ours.state_dict())  # strict: same keys and shapes
    ours.reset_parameters()
    ours.load_state_dict(fresh.state_dict())
    assert repr(ours) == repr(theirs)


def test_dropout_eval_mode_matches_pyg():
    theirs, ours = make_pair(torch.float64, True, heads=3, edge_dim=EDGE_DIM, dropout=0.4)
    theirs.eval(), ours.eval()
    x, edge_attr, leaves = make_inputs(torch.float64, True, EDGE_DIM)
    compare(theirs, ours, x, edge_attr, leaves, torch.float64)


@pytest.mark.parametrize("impl", ["sparseattn", "pyg"])
def test_dropout_drops_normalized_weights_without_renormalizing(impl):
    """PyG's semantics, checked on both layers: in training mode each softmax weight is dropped
    (after the softmax) or scaled by 1 / (1 - p), and the survivors are not renormalized. With every
    value 1, out[t] * (1 - p) must be the sum of a subset of t's returned (pre-dropout) weights."""
    p, heads = 0.5, 2
    theirs, ours = make_pair(torch.float64, False, heads=heads, root_weight=False, dropout=p)
    conv = ours if impl == "sparseattn" else theirs
    with torch.no_grad():
        conv.lin_value.weight.zero_()
        conv.lin_value.bias.fill_(1.0)  # v = 1 on every head and channel
    conv.train()
    x = torch.randn(N_SRC, N_SRC - 1, dtype=torch.float64)
    dst = EDGE_INDEX[1]
    dropped_some = False
    for _ in range(3):
        out, (_, alpha) = conv(x, EDGE_INDEX, return_attention_weights=True)
        out = out.view(-1, heads, C)
        assert torch.allclose(out, out[..., :1].expand_as(out))  # one weight per edge and head, all channels
        for t in range(N_SRC):
            for h in range(heads):
                weights = alpha[dst == t, h].tolist()
                sums = {0.0} | {sum(s) for r in range(1, len(weights) + 1) for s in itertools.combinations(weights, r)}
                got = out[t, h, 0].item() * (1 - p)
                assert min(abs(got - s) for s in sums) < 1e-12, (t, h, got, sums)
                dropped_some |= weights != [] and abs(got - sum(weights)) > 1e-9
    assert dropped_some
    conv.eval()
    assert_close(
        conv(x, EDGE_INDEX).view(-1, heads, C)[:, :, 0],
        torch.zeros(N_SRC, heads, dtype=torch.float64).index_add_(0, dst, alpha),
        torch.float64,
        "eval output = sum of weights",
    )


def test_errors_name_the_argument():
    conv = TransformerConv(4, 2, edge_dim=3)
    x = torch.randn(5, 4)
    with pytest.raises(ValueError, match="edge_attr"):
        conv(x, EDGE_INDEX[:, :3] % 5)
    with pytest.raises(ValueError, match="edge_dim=None"):
        TransformerConv(4, 2)(x, EDGE_INDEX[:, :3] % 5, torch.randn(3, 3))
    with pytest.raises(TypeError, match="edge_attr must be a floating-point tensor"):
        conv(x, EDGE_INDEX[:, :3] % 5, torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="in_channels"):
        TransformerConv(-2, 2)
    with pytest.raises(ValueError, match="dropout"):
        TransformerConv(4, 2, dropout=1.0)
    with pytest.raises(ValueError, match="backend"):
        TransformerConv(4, 2, backend="nope")


E = EDGE_INDEX.shape[1]
WRONG_EDGE_ATTR = {"width 1": (E, 1), "wrong width": (E, EDGE_DIM + 1), "wrong rows": (E - 1, EDGE_DIM), "1-D": (E,)}


@pytest.mark.parametrize("graph", [False, True], ids=["edge_index", "Graph"])
@pytest.mark.parametrize("heads", [1, 3])  # per-head edge path; C + edge_dim < H * C: the shared-row path
@pytest.mark.parametrize("shape", list(WRONG_EDGE_ATTR))
def test_edge_attr_of_another_shape_is_refused_naming_it(shape, heads, graph):
    """edge_attr must be (E, edge_dim), as PyG's layer requires: a (E, 1) column broadcast over every
    channel with heads > 1, and other shapes failed in a matmul or in edge_attention's check of
    edge_key, neither naming edge_attr."""
    theirs, ours = make_pair(torch.float64, False, heads=heads, edge_dim=EDGE_DIM)
    x = torch.randn(N_SRC, N_SRC - 1, dtype=torch.float64)
    edge_attr = torch.randn(WRONG_EDGE_ATTR[shape], dtype=torch.float64)
    with pytest.raises(Exception):  # noqa: B017 (PyG fails in its own ops, with their errors)
        theirs(x, EDGE_INDEX, edge_attr)
    expected = (
        f"edge_attr must have shape (E, edge_dim) = ({E}, {EDGE_DIM}), one row per edge, got {tuple(edge_attr.shape)}"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        ours(x, sparseattn.Graph(EDGE_INDEX, N_SRC, N_SRC) if graph else EDGE_INDEX, edge_attr)


@pytest.mark.parametrize("layout", ["transposed", "strided", "int32", "transposed-int32"])
@pytest.mark.parametrize("heads", [1, 3])  # per-head edge path and the shared-row path
def test_edge_index_layouts_users_pass_equal_pyg(layout, heads):
    """An edge_index that is int32, transposed or strided gives PyG's result on its int64 copy."""
    from ..strategies import laid_out

    theirs, ours = make_pair(torch.float64, False, heads=heads, edge_dim=EDGE_DIM)
    x, edge_attr, leaves = make_inputs(torch.float64, False, EDGE_DIM)
    compare(theirs, ours, x, edge_attr, leaves, torch.float64, edge_index=laid_out(EDGE_INDEX, layout))


UNIQUE = torch.unique(EDGE_INDEX, dim=1)  # adj_t holds each edge once: coalescing sums the repeated ones


def adj_t_of(edge_index, layout, n_src=N_SRC, n_dst=N_DST):
    """PyG's adj_t (N_dst, N_src) with adj_t[dst, src] = 1 per edge, in layout; and edge_index in the
    order of its stored nonzeros (the order of edge_attr's rows)."""
    adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.shape[1]), (n_dst, n_src)).coalesce()
    if layout == "csc":  # source-major
        order = torch.argsort(adj.indices()[1] * n_dst + adj.indices()[0])
        return adj.to_sparse_csc(), adj.indices().flip(0)[:, order]
    return (adj if layout == "coo" else adj.to_sparse_csr()), adj.indices().flip(0)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("heads", [1, 3])  # per-head edge path and the shared-row path
@pytest.mark.parametrize("bipartite", [False, True], ids=["homogeneous", "bipartite"])
def test_torch_sparse_adj_t_equals_pyg(layout, heads, bipartite):
    """PyG's convention adj_t[dst, src]: the same outputs and weights as PyG's layer given that
    adj_t (COO, CSR; PyG refuses CSC, so there against the edge_index in its storage order), with
    edge_attr in the order of adj_t's nonzeros. Before, a TypeError about edge_index's dtype."""
    n_src = N_SRC
    n_dst = N_DST if bipartite else N_SRC
    adj_t, ordered = adj_t_of(UNIQUE, layout, n_src, n_dst)
    theirs, ours = make_pair(torch.float64, bipartite, heads=heads, edge_dim=EDGE_DIM)
    x, _, _ = make_inputs(torch.float64, bipartite, None)
    edge_attr = torch.randn(UNIQUE.shape[1], EDGE_DIM, dtype=torch.float64)
    out, (given, alpha) = ours(x, adj_t, edge_attr, return_attention_weights=True)
    assert given is adj_t
    ref, (_, ref_alpha) = theirs(x, adj_t if layout != "csc" else ordered, edge_attr, return_attention_weights=True)
    assert_close(out, ref, torch.float64, "output vs PyG")
    assert_close(alpha, ref_alpha, torch.float64, "attention weights vs PyG")
    assert_close(ours(x, ordered, edge_attr), out, torch.float64, "adj_t vs its edge_index")


def test_adj_t_errors_say_what_is_supported():
    conv = TransformerConv(N_SRC - 1, C)
    x = torch.randn(N_SRC, N_SRC - 1)
    loose = torch.sparse_coo_tensor(UNIQUE.flip(0), torch.ones(UNIQUE.shape[1]), (N_SRC, N_SRC))
    with pytest.raises(ValueError, match=r"COO adj_t must be coalesced.*adj_t\.coalesce\(\)"):
        conv(x, loose)
    with pytest.raises(TypeError, match="COO, CSR or CSC layout, got layout torch.sparse_bsr"):
        conv(x, loose.coalesce().to_sparse_bsr((1, 1)))

    class SparseTensor:  # torch_sparse's, recognized by name
        def to_torch_sparse_csr_tensor(self):
            raise AssertionError

    with pytest.raises(TypeError, match=r"torch_sparse\.SparseTensor is not supported: pass adj_t\.to_torch_sparse"):
        conv(x, SparseTensor())


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("bipartite", [False, True], ids=["homogeneous", "bipartite"])
def test_lazy_in_channels_load_both_ways(bipartite, heads):
    """in_channels=-1 (either side of a pair): widths inferred at the first call, as PyG's lazy
    Linear; state dicts load both ways, before or after that call. Before, a ValueError."""
    in_channels = (-1, -1) if bipartite else -1
    x, edge_attr, _ = make_inputs(torch.float64, bipartite, EDGE_DIM)
    options = dict(heads=heads, edge_dim=EDGE_DIM, beta=True)
    theirs = pyg_nn.TransformerConv(in_channels, C, **options).double()
    ours = TransformerConv(in_channels, C, **options).double()
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ref = theirs(x, EDGE_INDEX, edge_attr)
    ours.load_state_dict(theirs.state_dict())  # uninitialized, loading initialized weights
    assert_close(ours(x, EDGE_INDEX, edge_attr), ref, torch.float64, "output vs PyG")
    fresh = TransformerConv(in_channels, C, **options).double()
    fresh(x, EDGE_INDEX, edge_attr)  # initialized by its first call
    assert fresh.lin_query.weight.shape == theirs.lin_query.weight.shape
    lazy_pyg = pyg_nn.TransformerConv(in_channels, C, **options).double()
    lazy_pyg.load_state_dict(fresh.state_dict())
    assert_close(lazy_pyg(x, EDGE_INDEX, edge_attr), fresh(x, EDGE_INDEX, edge_attr), torch.float64, "output vs PyG")


def test_torch_jit_script_fails_in_one_line_naming_torch_compile():
    """Before, TorchScript's multi-line NotSupportedError on edge_attention's keyword expansion."""
    conv = TransformerConv(4, 2)
    expected = r"^sparseattn\.nn\.TransformerConv does not support torch\.jit\.script .*use torch\.compile\(model\)"
    with pytest.raises(RuntimeError, match=expected) as info:
        torch.jit.script(conv)
    assert "\n" not in str(info.value)
    with pytest.raises(RuntimeError, match=expected):
        torch.jit.script(torch.nn.Sequential(torch.nn.Identity(), conv))
    for layer in (sparseattn.nn.ExphormerAttention(4, 4, 2, True), sparseattn.nn.GlobalAttention(4, 2)):
        with pytest.raises(RuntimeError, match=f"{type(layer).__name__} does not support torch.jit.script"):
            torch.jit.script(layer)


@pytest.mark.parametrize("edge_dim", [None, EDGE_DIM])
def test_small_graph_path_equals_the_csr_path_with_weights_and_their_gradients(edge_dim):
    """backend "auto" on small graphs runs the "small" backend (kernels/small.py: the direct per-edge
    term, one autograd Function), chosen by the kernels, not the layer; it gives csr's output, weights
    and gradients, through the weights too, and its backward can run twice (retain_graph)."""
    from sparseattn.kernels import choose_auto

    torch.manual_seed(0)
    ours = TransformerConv(N_SRC - 1, C, heads=3, edge_dim=edge_dim).double()
    x, edge_attr, leaves = make_inputs(torch.float64, False, edge_dim)
    assert choose_auto(torch.zeros(N_DST, 3, C), sparseattn.Graph(EDGE_INDEX, N_SRC, N_DST), edge_terms=True) == "small"
    results = {}
    for backend in ("auto", "csr"):
        ours.backend = backend
        out, (_, alpha) = ours(x, EDGE_INDEX, edge_attr, return_attention_weights=True)
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() + (alpha * alpha).sum()
        named = {**leaves, **dict(ours.named_parameters())}
        first = torch.autograd.grad(loss, list(named.values()), retain_graph=True, allow_unused=True)
        again = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
        grads = {n: torch.zeros_like(named[n]) if g is None else g for n, g in zip(named, first)}
        for name, g in zip(named, again):
            assert torch.equal(grads[name], torch.zeros_like(named[name]) if g is None else g), name
        results[backend] = (out, alpha, grads)
    (out, alpha, grads), (out_csr, alpha_csr, grads_csr) = results["auto"], results["csr"]
    assert_close(out, out_csr, torch.float64, "small-graph path vs csr")
    assert_close(alpha, alpha_csr, torch.float64, "small-graph path vs csr")
    for name in grads_csr:
        assert_close(grads[name], grads_csr[name], torch.float64, f"grad of {name}", "small-graph path vs csr")


def test_small_graph_path_dropout_draws_edge_attentions_mask():
    """In training mode the small-graph path drops the weights edge_attention would drop under the
    same seed: the same output as csr."""
    ours = TransformerConv(N_SRC - 1, C, heads=2, edge_dim=EDGE_DIM, dropout=0.5).double().train()
    x, edge_attr, _ = make_inputs(torch.float64, False, EDGE_DIM)
    outs = []
    for backend in ("auto", "csr"):
        ours.backend = backend
        torch.manual_seed(3)
        outs.append(ours(x, EDGE_INDEX, edge_attr))
    assert_close(outs[0], outs[1], torch.float64, "small-graph path vs csr")


def test_compiled_layer_takes_the_small_graph_path_and_equals_eager(monkeypatch):
    """Under torch.compile a small graph runs the "small" backend too (traced once, dynamic sizes), with
    eager's output and gradients; torch.export keeps to the library's custom ops (auto never picks it)."""
    from sparseattn.kernels import registered_backend

    small = registered_backend("small")
    traced = []

    def counting(inputs):
        traced.append(1)
        return real(inputs)

    real = small.fn
    monkeypatch.setattr(small, "fn", counting)
    torch.manual_seed(0)
    ours = TransformerConv(N_SRC - 1, C, heads=3, edge_dim=EDGE_DIM).double()
    x, edge_attr, _ = make_inputs(torch.float64, False, EDGE_DIM)
    x = x.detach().requires_grad_()
    compiled = torch.compile(ours, dynamic=True, fullgraph=True)
    results = []
    for fn in (ours, compiled):
        traced.clear()
        out = fn(x, EDGE_INDEX, edge_attr)
        results.append((out, *torch.autograd.grad(out.square().sum(), [x, ours.lin_edge.weight])))
    assert traced, "the compiled layer did not trace the small-graph path"
    for eager, comp, name in zip(results[0], results[1], ("output", "grad of x", "grad of lin_edge.weight")):
        assert_close(comp, eager, torch.float64, name, "compiled vs eager")
    traced.clear()
    torch.export.export(ours, (x.detach(), EDGE_INDEX, edge_attr))
    assert not traced, "torch.export traced the small-graph path"
