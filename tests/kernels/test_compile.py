"""torch.compile and torch.export with a graph as input: no graph break with a raw (2, E) edge_index
or a fresh Graph, with or without an eager warm-up, in inference and training; one compilation for
batches of every size under dynamic=True; exported programs with dynamic node and edge counts that
save, load and run on graphs of other sizes (and as an AOTInductor package); values and gradients
equal to eager code and to the reference. Tiny graphs: each compilation takes seconds."""

import pathlib
import re

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.export import Dim

from sparseattn import EdgeAttention, Graph, edge_attention, graphs, kernels
from sparseattn.kernels import choose_auto

BACKEND = "aot_eager"  # traces forward and backward through AOTAutograd like inductor, without codegen


def _inputs(n_dst, n_src, heads=2, dim=4, dtype=torch.float32, grad=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, dim, generator=gen, dtype=dtype).requires_grad_(grad) for n in (n_dst, n_src, n_src)]


def _graph(kind, g):
    """The graph as a user hands it over: its raw index, or a fresh Graph (no structure built yet)."""
    return g.edge_index.clone() if kind == "raw" else Graph(g.edge_index.clone(), g.num_src, g.num_dst)


def _grads(out, leaves, weight):
    return torch.autograd.grad((out * weight).sum(), leaves, allow_unused=True)


def _assert_close(a, b, what, atol=1e-5):
    assert torch.allclose(a, b, atol=atol, rtol=1e-5), f"{what}: max |diff| {(a - b).abs().max().item():.3g}"


def _breaks(fn, *args):
    explained = torch._dynamo.explain(fn)(*args)
    return explained.graph_count, explained.graph_break_count, explained.break_reasons


GRAPHS = {
    "window": lambda: graphs.window(40, 3),
    "random": lambda: graphs.random(30, 25, 120, seed=1),  # bipartite, unsorted-ready, duplicates
    "knn": lambda: Graph(_knn_edges(36, 5), 36, 36),
}


def _knn_edges(n, k, seed=0):
    """Each point's k nearest others in a random 3-D cloud, as (2, n * k) edges (source = neighbour)."""
    pts = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))
    d = torch.cdist(pts, pts).fill_diagonal_(float("inf"))
    nbr = d.topk(k, largest=False).indices  # (n, k)
    return torch.stack([nbr.reshape(-1), torch.arange(n).repeat_interleave(k)])


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warmed"])
@pytest.mark.parametrize("mode", ["training", "no_grad"])
@pytest.mark.parametrize("kind", ["raw", "graph"])
@pytest.mark.parametrize("family", list(GRAPHS))
def test_edge_attention_compiles_whole_and_equals_eager(family, kind, mode, warm):
    """fullgraph=True of edge_attention with bias and returned weights; "warmed": the same Graph (or
    index tensor) went through an eager call first, "cold": it did not."""
    g = GRAPHS[family]()
    graph = _graph(kind, g)
    q, k, v = _inputs(g.num_dst, g.num_src, grad=mode == "training")
    bias = torch.randn(g.num_edges, 2, requires_grad=mode == "training")

    def fn(q, k, v, bias, graph):
        return edge_attention(q, k, v, graph, bias=bias, clamp=None, return_weights=True)

    if warm:
        with torch.no_grad():
            fn(q, k, v, bias, graph)
    count, breaks, reasons = _breaks(fn, q, k, v, bias, graph)
    assert (count, breaks) == (1, 0), reasons
    compiled = torch.compile(fn, fullgraph=True, backend=BACKEND)
    with torch.set_grad_enabled(mode == "training"):
        out, w = compiled(q, k, v, bias, graph)
        ref, ref_w = edge_attention(q, k, v, g, bias=bias, clamp=None, return_weights=True, backend="reference")
    _assert_close(out, ref, "out")
    _assert_close(w, ref_w, "weights")
    if mode == "training":
        got = torch.autograd.grad((out * ref.detach()).sum() + (w * ref_w.detach()).sum(), (q, k, v, bias))
        want = torch.autograd.grad((ref * ref.detach()).sum() + (ref_w * ref_w.detach()).sum(), (q, k, v, bias))
        for name, a, b in zip("q k v bias".split(), got, want):
            _assert_close(a, b, f"d{name}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["raw", "graph"])
def test_inductor_compiles_the_same_values_and_gradients(kind):
    """The tests above trace with aot_eager (AOTAutograd without code generation); inductor too."""
    g = GRAPHS["knn"]()
    q, k, v = _inputs(g.num_dst, g.num_src)
    fn = torch.compile(lambda q, k, v, graph: edge_attention(q, k, v, graph, clamp=(-1.0, 1.0)), fullgraph=True)
    out = fn(q, k, v, _graph(kind, g))
    ref = edge_attention(q, k, v, g, clamp=(-1.0, 1.0), backend="reference")
    _assert_close(out, ref, "out")
    for name, a, b in zip("qkv", _grads(out, (q, k, v), ref.detach()), _grads(ref, (q, k, v), ref.detach())):
        _assert_close(a, b, f"d{name}")


class _Layer(torch.nn.Module):
    """A pre-norm residual attention layer on a graph, as users write one around EdgeAttention."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.attn = EdgeAttention(dim, heads)
        self.ff = torch.nn.Linear(dim, dim)

    def forward(self, x, graph):
        x = x + self.attn(self.norm(x), graph)
        return x + self.ff(torch.relu(x))


def test_a_graphs_cached_structure_aliases_none_of_its_index():
    """Compiled code reads what a Graph cached as its inputs; a view of the graph's edge_index among
    them (the CSR's sources of an already-sorted graph were `edge_index[0]` itself) reaches inductor
    as an aliased input whose base size a dynamic-shape backward fails to bind (InductorError: "For
    8*s18, expected [s18] to have been codegen-ed", `test_inductor_trains_on_eagerly_used_graphs`)."""
    for g in (graphs.window(40, 3), graphs.causal(12), graphs.random(30, 30, 90, seed=0)):
        g.csr(), g.csc()
        for name, t in [*zip(("csr.ptr", "csr.idx", "csr.perm"), g.csr()), *zip(("csc.ptr", "csc.idx"), g.csc())]:
            assert t._base is None and t.untyped_storage().data_ptr() != g.edge_index.untyped_storage().data_ptr(), (
                f"{g}: {name} is a view of edge_index"
            )


def test_inductor_trains_on_eagerly_used_graphs():  # ~15 s: the default run's only inductor backward
    """dynamic=True, inductor, forward and backward on graphs that eager code used first (so they
    carry cached structure, interleaved on some sizes and head-major on others): no InductorError,
    values of eager code. This failed on the sixth graph while the CSR aliased the edge_index."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Layer(128, 8)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    batches = [(graphs.window(n, r), torch.randn(n, 128)) for n, r in [(1000 + 700 * i, 2 + i % 5) for i in range(7)]]
    for g, x in batches:
        compiled(x, _graph("graph", g)).sum().backward()
    for g, x in batches:
        model(x, g).sum().backward()
    for i, (g, x) in enumerate(batches):
        out = compiled(x, g)
        out.sum().backward()
        _assert_close(out, model(x, g), f"batch {i}")


@pytest.mark.parametrize("kind", ["raw", "graph"])
def test_a_module_compiles_once_for_batches_of_every_size(kind):
    """dynamic=True: ten batches of different N and E compile once and recompile zero times (the
    frame keeps one compiled entry), with the outputs and gradients of eager code."""
    torch._dynamo.reset()
    model = _Layer()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=BACKEND)
    for i, n in enumerate(range(20, 120, 10)):
        g = graphs.random(n, n, (3 + i % 4) * n, seed=i)  # E varies independently of N
        x = torch.randn(n, 16, generator=torch.Generator().manual_seed(i)).requires_grad_()
        out = compiled(x, _graph(kind, g))
        ref = model(x, g)
        _assert_close(out, ref, f"batch {i}")
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + i))
        for a, b in zip(_grads(out, (x, *model.parameters()), weight), _grads(ref, (x, *model.parameters()), weight)):
            _assert_close(a, b, f"gradients of batch {i}", atol=1e-4)
    entries = _debug_get_cache_entry_list(model.forward.__func__.__code__)  # torch.compile(module) compiles forward
    entries = entries or _debug_get_cache_entry_list(compiled._orig_mod.forward.__func__.__code__)
    assert len(entries) == 1, f"{len(entries)} compiled entries: a recompilation happened"


def test_fake_tensors_count_as_tracing(monkeypatch):
    """AOTAutograd traces the backward under a fake-tensor mode, where torch 2.11's is_compiling()
    is False: the kernels' Python then ran on fake tensors and csr's sparse CSR tensors failed to
    build ("Values and compressed tensor instance need to be on the same device", an H100 with torch
    2.11). Under a fake mode the ops are taken, whatever is_compiling() says."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sparseattn._tracing import tracing

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)  # as torch 2.11 answers there
    assert not tracing()
    g = graphs.window(50, 4)
    edge_attention(torch.randn(50, 2, 8), torch.randn(50, 2, 8), torch.randn(50, 2, 8), g, backend="csr")  # index built
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        assert tracing()
        q = mode.from_tensor(torch.randn(50, 2, 8)).requires_grad_()
        out = edge_attention(q, q, q, g, clamp=None, backend="csr")  # the ops' fakes: no sparse tensor built
        (grad,) = torch.autograd.grad(out.sum(), q)
        assert grad.shape == q.shape


def test_a_graph_reused_across_calls_keeps_what_compiled_code_built():
    """Compiled code caches on a Graph what it built (dynamo replays the writes after the call): the
    next call with that graph compiles once more, for a graph that has its structure, and from then
    on reads it. Fresh graphs keep taking the first entry."""
    torch._dynamo.reset()
    g = Graph(graphs.window(50, 4).edge_index, 50, 50)

    def fn(x, graph):
        return edge_attention(x, x, x, graph, backend="csr")  # auto runs "small" here, which caches nothing

    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=BACKEND)
    x = torch.randn(50, 2, 8)
    for _ in range(4):
        _assert_close(compiled(x, g), edge_attention(x, x, x, g, backend="reference"), "out")
    assert g._csr is not None and any(key.startswith("csr_pattern") for key in g._cache)
    assert len(_debug_get_cache_entry_list(fn.__code__)) == 2
    fresh = Graph(graphs.window(60, 3).edge_index, 60, 60)
    x = torch.randn(60, 2, 8)
    _assert_close(compiled(x, fresh), edge_attention(x, x, x, fresh, backend="reference"), "a fresh graph")
    assert len(_debug_get_cache_entry_list(fn.__code__)) == 2


def test_an_invalid_index_fails_inside_compiled_code_as_in_eager():
    """A raw index is not validated when traced (that would read it): the op that sorts it checks it."""
    fn = torch.compile(lambda x, ei: edge_attention(x, x, x, ei), fullgraph=True, backend=BACKEND)
    x = torch.randn(5, 1, 4)
    with pytest.raises(IndexError, match=r"edge_index\[0\] \(sources\) contains node id 7, out of range for 5 nodes"):
        fn(x, torch.tensor([[0, 7], [1, 2]]))


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
def test_a_graph_over_other_nodes_fails_compiled_with_eagers_message(dynamic, fullgraph):
    """A Graph whose num_dst is not q's rows: compiled code raises eager code's ValueError (under
    fullgraph=True dynamo's error quotes it), not torch._check's "Expected cond to be True". The
    first call, on a graph that fits, compiles; the second fails its guard and traces again."""
    torch._dynamo.reset()
    g = graphs.random(10, 10, 30, seed=0)
    bad = Graph(g.edge_index, 10, 12)
    x = torch.randn(10, 2, 4)
    with pytest.raises(ValueError) as eager:
        edge_attention(x, x, x, bad)
    assert "graph has num_dst=12 but q has 10 rows" in str(eager.value)
    compiled = torch.compile(
        lambda x, graph: edge_attention(x, x, x, graph), backend=BACKEND, dynamic=dynamic, fullgraph=fullgraph
    )
    compiled(x, g)
    with pytest.raises(Exception, match=re.escape(str(eager.value))) as got:
        compiled(x, bad)
    assert fullgraph or got.type is ValueError


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors reach triton only in the interpreter (no GPU)")
@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None], ids=["clamp", "exact"])
def test_triton_ops_compile_in_the_interpreter(clamp):
    """The triton backend's kernels are custom ops too: compiled code calls them whole (here on CPU
    tensors through Triton's interpreter)."""
    pytest.importorskip("triton")
    if "triton" not in kernels.available_backends():
        pytest.skip("triton is not importable")
    g = GRAPHS["random"]()
    q, k, v = _inputs(g.num_dst, g.num_src)

    def fn(q, k, v, graph):
        return edge_attention(q, k, v, graph, clamp=clamp, backend="triton")

    assert _breaks(fn, q, k, v, g.edge_index)[:2] == (1, 0)
    out = torch.compile(fn, fullgraph=True, backend=BACKEND)(q, k, v, g.edge_index)
    ref = edge_attention(q, k, v, g, clamp=clamp, backend="reference")
    _assert_close(out, ref, "out")
    for name, a, b in zip("qkv", _grads(out, (q, k, v), ref.detach()), _grads(ref, (q, k, v), ref.detach())):
        _assert_close(a, b, f"d{name}")


@pytest.mark.parametrize("kind", ["full", "causal"])
@pytest.mark.parametrize("clamp", [(-0.5, 0.5), (-5.0, 5.0), None], ids=["binds", "cannot-bind", "exact"])
def test_dense_compiles_when_asked_by_name(kind, clamp):
    """Inside a trace "auto" never takes dense (its batch shapes come from the block structure, so each
    new batch would compile anew); backend="dense" compiles it, every clamp-mode row through one
    differentiable expression instead of routing rows to SDPA on their data as eager mode does."""
    g = graphs.from_blocks([(kind, 16, 16)] * 4)
    q, k, v = _inputs(g.num_dst, g.num_src)
    assert choose_auto(torch.zeros(1, 64, 64), g) == "dense"  # with heads wide enough not to be "small"

    def fn(q, k, v):
        return edge_attention(q, k, v, g, clamp=clamp, backend="dense")

    assert _breaks(fn, q, k, v)[:2] == (1, 0)
    out = torch.compile(fn, fullgraph=True, backend=BACKEND)(q, k, v)
    ref = edge_attention(q, k, v, g, clamp=clamp, backend="reference")
    _assert_close(out, ref, "out")
    for name, a, b in zip("qkv", _grads(out, (q, k, v), ref.detach()), _grads(ref, (q, k, v), ref.detach())):
        _assert_close(a, b, f"d{name}")
    graphs_seen = []
    wide = torch.zeros(1, 64, 64)
    torch.compile(lambda q: graphs_seen.append(choose_auto(wide, g)) or q, backend=BACKEND)(q)
    assert graphs_seen == ["csr"]  # "auto" while tracing


# ---- torch.export -------------------------------------------------------------------------------------
def _exported(kind, tmp_path):
    """A _Layer exported with a graph argument of dynamic node and edge counts, saved and loaded."""
    model = _Layer().eval()
    g = graphs.random(30, 30, 100, seed=0)
    x = torch.randn(30, 16)
    graph_dims = {1: Dim.AUTO} if kind == "raw" else Graph.dynamic_shapes()
    ep = torch.export.export(model, (x, _graph(kind, g)), dynamic_shapes=({0: Dim.AUTO}, graph_dims))
    torch.export.save(ep, tmp_path / f"{kind}.pt2")
    return model, torch.export.load(tmp_path / f"{kind}.pt2")


@pytest.mark.parametrize("kind", ["raw", "graph"])
def test_export_takes_a_graph_of_any_size(kind, tmp_path):
    model, loaded = _exported(kind, tmp_path)
    modules = [m for m in loaded.graph_module.modules() if hasattr(m, "graph")]  # the autocast-off region nests
    targets = {str(n.target) for m in modules for n in m.graph.nodes if n.op == "call_function"}
    assert "sparseattn.csr_attention_fwd.default" in targets
    sizes = [graphs.random(n, n, e, seed=n) for n, e in ((57, 300), (12, 12), (200, 1500))]
    for g in sizes + TINY_GRAPHS:
        x = torch.randn(g.num_dst, 16)
        graph = _graph(kind, g)
        _assert_close(loaded.module()(x, graph), model(x, g), f"N={g.num_dst}, E={g.num_edges}")
        _assert_close(model(x, graph), model(x, g), "eager on the graph the program took")  # no fake tensors kept


# 1 node with a self-loop, 1 node without edges, 2 nodes: export specializes sizes 0 and 1 (it
# assumes N >= 2), and with Dim.AUTO for the row pointers the program refused N = 1 ("Guard
# failed: graph.ptr.size()[0] >= 3"); Graph.dynamic_shapes() declares N >= 0 instead
TINY_GRAPHS = [
    Graph(torch.tensor([[0], [0]]), 1, 1),
    Graph(torch.zeros(2, 0, dtype=torch.long), 1, 1),
    Graph(torch.tensor([[0, 1, 1], [1, 0, 1]]), 2, 2),
]


def test_export_takes_two_graphs_over_different_nodes():
    """Each Graph.dynamic_shapes() names its Dims afresh: with one name for both, export would tie
    the two graphs' node counts ("Expected input L['g2'].ptr.size()[0] to be equal to ...")."""

    def attend(x, graph):
        x = x.view(-1, 2, 4)  # (N, H, D)
        return edge_attention(x, x, x, graph).sum(0)

    class Two(torch.nn.Module):
        def forward(self, x1, g1, x2, g2):
            return attend(x1, g1) + attend(x2, g2)

    args = (
        torch.randn(20, 8),
        graphs.random(20, 20, 60, seed=0),
        torch.randn(30, 8),
        graphs.random(30, 30, 90, seed=1),
    )
    auto = {0: Dim.AUTO}
    ep = torch.export.export(Two(), args, dynamic_shapes=(auto, Graph.dynamic_shapes(), auto, Graph.dynamic_shapes()))
    g1, g2 = TINY_GRAPHS[0], graphs.random(7, 7, 20, seed=2)
    x1, x2 = torch.randn(1, 8), torch.randn(7, 8)
    _assert_close(ep.module()(x1, g1, x2, g2), Two()(x1, g1, x2, g2), "two graphs")


def test_a_graph_over_other_nodes_than_an_exported_programs_inputs(tmp_path):
    """ep.module() runs torch's guards first, as its graph's first node, and its message is torch's
    (pinned here, quoted in docs/guide/compile.md); sparseattn's op reads the node counts from the
    guarded sizes, so it cannot come first. graphs.exported_module(ep) checks the Graph arguments
    before the guards and raises eager's kind of ValueError; a program exported without
    Graph.dynamic_shapes() is named as the cause for a graph of another size."""
    model, loaded = _exported("graph", tmp_path)
    g = graphs.random(45, 45, 200, seed=3)
    mismatched = (torch.randn(40, 16), Graph(g.edge_index, 45, 45))
    guard = "Guard failed: -1 + graph.src_ptr.size()[0] == x.size()[0]"
    with pytest.raises(AssertionError, match=re.escape(guard)):
        loaded.module()(*mismatched)
    assert f"AssertionError: {guard}" in (pathlib.Path(__file__).parents[2] / "docs/guide/compile.md").read_text()
    checked = graphs.exported_module(loaded)
    ours = "graph has num_dst=45 but x has 40 rows, which the exported program takes to be equal"
    with pytest.raises(ValueError, match=re.escape(ours)):
        checked(*mismatched)
    with pytest.raises(ValueError, match=re.escape(ours)):
        checked(mismatched[0], graph=mismatched[1])
    cross = Graph(graphs.random(50, 45, 200, seed=1).edge_index, 50, 45)  # sources other than x's rows
    with pytest.raises(ValueError, match=re.escape("graph has num_src=50 but x has 45 rows")):
        checked(torch.randn(45, 16), cross)
    with pytest.raises(AssertionError, match="Guard failed"):  # not a graph's: torch's guard says it
        checked(torch.randn(45, 8), Graph(g.edge_index, 45, 45))
    x = torch.randn(45, 16)
    _assert_close(checked(x, Graph(g.edge_index, 45, 45)), model(x, g), "checked module")
    static = graphs.exported_module(torch.export.export(model, (torch.randn(30, 16), graphs.random(30, 30, 90))))
    with pytest.raises(ValueError, match=re.escape("takes only num_dst=30: export it with dynamic_shapes=(..., Graph")):
        static(x, Graph(g.edge_index, 45, 45))


def test_an_aot_inductor_package_runs_on_the_cpu(tmp_path):
    """AOTInductor compiles the exported program ahead of time (~20 s here); the package
    calls sparseattn's ops, so it runs where sparseattn is imported."""
    model, loaded = _exported("graph", tmp_path)
    path = torch._inductor.aoti_compile_and_package(loaded, package_path=str(tmp_path / "layer.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    g = graphs.random(45, 45, 200, seed=3)
    x = torch.randn(45, 16)
    _assert_close(runner(x, Graph(g.edge_index, 45, 45)), model(x, g), "AOTInductor")
    for tiny in TINY_GRAPHS:
        x = torch.randn(tiny.num_dst, 16)
        _assert_close(runner(x, tiny), model(x, tiny), f"AOTInductor, N={tiny.num_dst}, E={tiny.num_edges}")
    # x of 40 rows, a graph of 45 nodes: the package checks nothing of its own ("allocated size does
    # not match required size" in the first kernel); sparseattn's check runs first, with eager's message
    with pytest.raises(ValueError) as eager:
        model(torch.randn(40, 16), g)
    with pytest.raises(RuntimeError, match=re.escape(str(eager.value))):
        runner(torch.randn(40, 16), Graph(g.edge_index, 45, 45))


# ---- the structure ops ----------------------------------------------------------------------------------
def test_structure_ops_pass_opcheck():
    """Schema and fake (shape-only) kernels of the ops that build what kernels read from a graph, and
    of the one that checks an exported program's graph against the tensors' rows."""
    from sparseattn.graphs.exported import checked_row_pointers
    from sparseattn.graphs.structure import compress_op
    from sparseattn.kernels.csr import index

    g = Graph(graphs.random(9, 7, 30, seed=2).edge_index[:, torch.randperm(30)], 9, 7)  # unsorted
    csr, csc = g.csr(), g.csc()
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(compress_op, (g.dst, g.src, 7, 9, False), test_utils=checks)
    torch.library.opcheck(compress_op, (g.src, g.dst, 9, 7, True), test_utils=checks)
    torch.library.opcheck(checked_row_pointers, (csr.ptr, csc.ptr, 9, 7), test_utils=checks)
    with pytest.raises(ValueError, match=r"graph has num_dst=7 but q has 6 rows"):
        checked_row_pointers(csr.ptr, csc.ptr, 9, 6)
    for int32 in (False, True):
        torch.library.opcheck(index.interleaved_slots.op, (csr.ptr, csr.idx, 3, int32), test_utils=checks)
        torch.library.opcheck(index.interleaved_rows.op, (csr.ptr, csr.idx, 3, int32), test_utils=checks)
        torch.library.opcheck(index.interleaved_from_caller.op, (csr.ptr, csr.perm, 3, int32), test_utils=checks)
        pos = index.sorted_positions(g)
        torch.library.opcheck(index.interleaved_to_caller.op, (csr.ptr, g.dst, pos, 3, int32), test_utils=checks)
        to_sorted = index.transposed_sorted_positions(g)
        torch.library.opcheck(
            index.interleaved_transposed.op, (csr.ptr, csc.ptr, csc.idx, to_sorted, 3, int32), test_utils=checks
        )
