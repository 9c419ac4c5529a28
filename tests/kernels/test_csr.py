"""The csr backend: hand-computed cases, float64 gradcheck of its custom ops (both layouts), the
index they read, no (E, H, D) tensors."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sparseattn import Graph, edge_attention, graphs
from sparseattn.kernels import csr as csr_module
from sparseattn.kernels.contract import AttentionInputs
from sparseattn.kernels.csr import csr_attention
from sparseattn.kernels.csr import index as csr_index
from sparseattn.kernels.csr.index import interleaved_index


@pytest.fixture(autouse=True, params=["interleaved", "head-major"])
def layout(request, monkeypatch):
    """Every test here runs in both layouts: the automatic choice is forced one way or the other."""
    monkeypatch.setattr(csr_module, "prefers_head_major", lambda *args: request.param == "head-major")
    return request.param


def test_hand_computed_with_a_duplicate_edge():
    """One destination, sources 0 and 1 (1 twice), D=1, scale 1: scores 2, 8, 8 clamp to 2, 5, 5."""
    q = torch.tensor([[[2.0]]], dtype=torch.float64)
    k = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64)
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64)
    ei = torch.tensor([[1, 0, 1], [0, 0, 0]])
    out, w = edge_attention(q, k, v, ei, scale=1.0, backend="csr", return_weights=True)
    wa, wb = math.exp(2.0), math.exp(5.0)
    assert out.item() == pytest.approx((wa * 10 + 2 * wb * 20) / (wa + 2 * wb), rel=1e-12)
    assert w[:, 0].tolist() == pytest.approx([wb / (wa + 2 * wb), wa / (wa + 2 * wb), wb / (wa + 2 * wb)], rel=1e-12)
    exact = edge_attention(q, k, v, ei, scale=1.0, clamp=None, backend="csr")
    wa, wb = math.exp(2.0 - 8.0), 1.0
    assert exact.item() == pytest.approx((wa * 10 + 2 * wb * 20) / (wa + 2 * wb), rel=1e-12)


def test_more_duplicates_than_matrix_entries():
    """sampled_addmm rejects nnz > rows * cols; the kernel pads around it (1 x 1 graph, 5 edges)."""
    q, k = torch.randn(1, 1, 3, dtype=torch.float64), torch.randn(1, 1, 3, dtype=torch.float64)
    v = torch.randn(1, 1, 2, dtype=torch.float64)
    ei = torch.zeros(2, 5, dtype=torch.long)
    bias = torch.arange(5.0, dtype=torch.float64)[:, None] * 0.1  # each duplicate keeps its own bias
    out, w = edge_attention(q, k, v, ei, bias=bias, backend="csr", return_weights=True)
    ref, ref_w = edge_attention(q, k, v, ei, bias=bias, backend="reference", return_weights=True)
    assert torch.allclose(out, ref) and torch.allclose(w, ref_w)
    assert torch.allclose(out, v[0])


def _gradcheck_inputs(clamp, heads=2):
    gen = torch.Generator().manual_seed(0)
    ei = torch.tensor([[0, 2, 1, 1, 3, 0, 2, 2], [1, 0, 1, 1, 2, 2, 0, 4]])  # unsorted, duplicates, dst 3 isolated
    g = Graph(ei, num_src=4, num_dst=5)
    q = torch.randn(5, heads, 3, generator=gen, dtype=torch.float64).requires_grad_()
    k = torch.randn(4, heads, 3, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(4, heads, 2, generator=gen, dtype=torch.float64).requires_grad_()
    bias = (0.5 * torch.randn(8, heads, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = (torch.rand(8, heads, generator=gen) > 0.3).double() / 0.7
    return g, q, k, v, bias, mask


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), (-0.4, 0.4), None])
@pytest.mark.parametrize("use_mask", [False, True])
def test_gradcheck_through_the_ops(clamp, use_mask):
    """The forward op's autograd rule (its backward op) in float64, on unsorted edges with a
    duplicate, an isolated destination, bias, dropout mask and returned weights."""
    g, q, k, v, bias, mask = _gradcheck_inputs(clamp)

    def f(q, k, v, bias):
        out, w = csr_attention(AttentionInputs(q, k, v, g, 0.7, clamp, bias, mask if use_mask else None, True))
        return out, w  # both outputs: the weights carry their own gradient

    assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-7)


_INDEX_NAMES = ("crow", "col", "offsets", "row", "ccrow", "ccol", "to_csc", "from_caller", "to_caller")


def _op_index(g, layout):
    """The forward op's index arguments by name for g with 2 heads in `layout`, as csr_attention builds them."""
    from sparseattn.kernels.csr.index import head_major_index

    if layout == "head-major":
        hm = head_major_index(g)
        index = (hm.crow, hm.col, hm.offsets, hm.row, hm.ccrow, hm.ccol, hm.to_csc, hm.from_caller, hm.to_caller)
    else:
        ix = interleaved_index(g, 2)
        index = (ix.crow, ix.col, ix.offsets, ix.row, *ix.transposed(), ix.from_caller, ix.to_caller)
    return dict(zip(_INDEX_NAMES, index), head_major_layout=layout == "head-major")


def _op_args(g, q, k, v, bias, mask, clamp, layout):
    """The forward op's arguments in its order, bound by name (`CSR_OP.forward.bind`)."""
    from sparseattn.kernels.csr.ops import CSR_OP

    return CSR_OP.forward.bind(
        q=q, k=k, v=v, edge_index=g.edge_index, bias=bias, mask=mask, eps=0.0, scale=0.7, clamp=clamp,
        return_weights=True, **_op_index(g, layout),
    )  # fmt: skip


@pytest.mark.parametrize("clamp", [[-0.5, 0.5], None])
def test_opcheck_of_the_forward_op(clamp, layout):
    """Schema, fake (shape-only) kernel and autograd registration of the forward op (torch.library.opcheck)."""
    from sparseattn.kernels.csr.ops import csr_attention_fwd

    g, q, k, v, bias, mask = _gradcheck_inputs(clamp)
    args = _op_args(g, q, k, v, bias, mask, clamp, layout)
    torch.library.opcheck(
        csr_attention_fwd, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )


def test_clamp_inference_keeps_no_score(layout):
    """A clamp-mode forward that no backward reads (interleaved: csr_attention leaves out `row`) clamps
    its scores in place and returns an empty score, which the fake kernel agrees with; the output
    is the reference's, including a score beyond the clamp."""
    from sparseattn.kernels.csr.ops import CSR_OP, csr_attention_fwd
    from sparseattn.kernels.reference import reference_attention

    clamp = [-0.5, 0.5]
    g, q, k, v, bias, mask = _gradcheck_inputs(clamp)
    q, k, v = (t.detach() * 3 for t in (q, k, v))  # scores well beyond the clamp
    index = _op_index(g, layout)
    if layout == "interleaved":
        index["row"] = None
    args = CSR_OP.forward.bind(
        q=q, k=k, v=v, edge_index=g.edge_index, bias=None, mask=None, eps=0.0, scale=0.7, clamp=clamp,
        return_weights=False, **index,
    )  # fmt: skip
    with torch.no_grad():
        out, _, w, score, _ = CSR_OP.forward_op(*args)
        kept = layout == "head-major"
        assert score.numel() == (w.numel() if kept else 0)
        expected = reference_attention(AttentionInputs(q, k, v, g, 0.7, tuple(clamp), None, None, False))[0]
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(edge_attention(q, k, v, g, scale=0.7, clamp=tuple(clamp), backend="csr"), expected)
    torch.library.opcheck(csr_attention_fwd, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("clamp", [[-0.5, 0.5], None])
def test_opcheck_of_the_backward_op(clamp, layout):
    """The backward op, whose schema and fake follow from the forward's description
    (attention_op.backward_spec): schema and fake-tensor shapes against the real kernel."""
    from sparseattn.kernels.csr.ops import CSR_OP, csr_attention_bwd

    g, q, k, v, bias, mask = _gradcheck_inputs(clamp)
    fwd_args = _op_args(g, q, k, v, bias, mask, clamp, layout)
    with torch.no_grad():
        out, weights, w, score, z = CSR_OP.forward_op(*fwd_args)
    named = dict(zip(CSR_OP.forward.names, fwd_args))
    given = {n: named[n] for n in CSR_OP.backward.names if n in named}
    args = CSR_OP.backward.bind(
        **given, grad_out=torch.randn_like(out), grad_weights=torch.randn_like(weights), w=w, score=score, z=z,
        needs=[n in ("q", "k", "v", "bias") for n in CSR_OP.forward.grad_args],
    )  # fmt: skip
    grads = csr_attention_bwd(*args)
    assert [t.shape for t in grads[:4]] == [q.shape, k.shape, v.shape, bias.shape]
    torch.library.opcheck(csr_attention_bwd, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("clamp", [[-0.5, 0.5], None])
def test_eager_entry_runs_the_registered_rule(clamp, layout):
    """Eager code enters the forward op through an autograd.Function (op_spec.autograd_entry);
    traced code through the op's registered rule. Both run the same op, setup and backward: equal
    outputs, returned weights, first and second derivatives."""
    from sparseattn.kernels.csr.ops import CSR_OP, csr_attention_fwd

    g, q, k, v, bias, mask = _gradcheck_inputs(clamp)
    args = _op_args(g, q, k, v, bias, mask, clamp, layout)
    results = []
    for fn in (CSR_OP.call, csr_attention_fwd):
        out, weights, *_ = fn(*args)
        assert out.grad_fn is not None
        loss = (out * out).sum() + (weights * weights).sum()
        grads = torch.autograd.grad(loss, (q, k, v, bias), create_graph=True)
        second = torch.autograd.grad(sum(g_.sum() for g_ in grads), (q, k, v, bias))
        results.append((out, weights, *grads, *second))
    eager_entry = type(results[0][0].grad_fn).__name__
    assert "csr_attention_fwd_eager" in eager_entry, f"eager code entered through {eager_entry}"
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_weights_gradient_matches_reference():
    g, q, k, v, bias, _ = _gradcheck_inputs(None)
    grads = []
    for backend in ("csr", "reference"):
        out, w = edge_attention(q, k, v, g, bias=bias, clamp=None, backend=backend, return_weights=True)
        loss = (out**2).sum() + (w * torch.arange(w.numel(), dtype=w.dtype).view_as(w)).sum()
        grads.append(torch.autograd.grad(loss, (q, k, v, bias)))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-12)


class _LargestIntermediate(TorchDispatchMode):
    """Records the largest dense tensor any op allocates (views of its inputs are not allocations).
    Eager kernels run their Python directly, so every op inside them is seen, not only the
    custom ops' outputs."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = list(args) + list((kwargs or {}).values())
        given = {
            a.untyped_storage().data_ptr() for a in flat if isinstance(a, torch.Tensor) and a.layout == torch.strided
        }
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (
                isinstance(t, torch.Tensor)
                and t.layout == torch.strided
                and t.untyped_storage().data_ptr() not in given
            ):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_allocates_an_edge_by_feature_tensor():
    """Forward and backward stay within O(E * H + N * H * D): no (E, H, D) tensor."""
    n, heads, d = 64, 2, 16
    g = graphs.window(n, radius=12)  # E ~ 25 N, so E * H * D dwarfs everything else
    q, k, v = (torch.randn(n, heads, d, requires_grad=True) for _ in range(3))
    bias = torch.randn(g.num_edges, heads, requires_grad=True)
    csr_module.prepare(g, heads)  # the cached index build may use (E, H) int tensors; not what we measure
    with _LargestIntermediate() as mode:
        out, w = csr_attention(AttentionInputs(q, k, v, g, 0.25, (-5.0, 5.0), bias, None, True))
        (out.sum() + w.sum()).backward()
    assert mode.largest <= max(g.num_edges * heads + 1, n * heads * d)  # + 1: the index build's sentinel
    assert mode.largest < g.num_edges * heads * d


def test_index_is_cached_per_head_count():
    g = graphs.window(10, 2)
    assert interleaved_index(g, 2) is interleaved_index(g, 2)
    assert interleaved_index(g, 3) is not interleaved_index(g, 2)


def test_half_inputs_return_half_and_match_float32():
    g = graphs.random(30, 20, 120, seed=1)
    q, k, v = (torch.randn(n, 2, 8) for n in (20, 30, 30))
    for dtype in (torch.float16, torch.bfloat16):
        out = edge_attention(q.to(dtype), k.to(dtype), v.to(dtype), g, backend="csr")
        assert out.dtype == dtype
        ref = edge_attention(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), g, backend="csr")
        assert torch.allclose(out.float(), ref, atol=1e-2)


@pytest.mark.parametrize("slots_per_pass", [1, 7, 10**6])
def test_index_built_in_chunks_equals_one_pass(monkeypatch, slots_per_pass):
    """The index is built in chunks of whole head rows: chunk sizes smaller than one head row,
    not dividing the rows, or covering everything give the same results (unsorted edges,
    duplicates, destinations without edges; values, weights and gradients)."""
    monkeypatch.setattr(csr_index, "_SLOTS_PER_PASS", slots_per_pass)
    monkeypatch.setattr(csr_index, "_MAX_RUNS", 0)  # the chunked walk, not the degree-run broadcasts
    monkeypatch.setattr(csr_index, "_SMALL_SLOTS", 0)  # nor the one scatter of small patterns
    g, q, k, v, bias, _ = _gradcheck_inputs(None, heads=3)
    out, w = edge_attention(q, k, v, g, bias=bias, backend="csr", return_weights=True)
    ref, ref_w = edge_attention(q, k, v, g, bias=bias, backend="reference", return_weights=True)
    assert torch.allclose(out, ref, atol=1e-12) and torch.allclose(w, ref_w, atol=1e-12)
    grads = torch.autograd.grad((out * ref.detach()).sum() + w.sum(), (q, k, v, bias))
    want = torch.autograd.grad((ref * ref.detach()).sum() + ref_w.sum(), (q, k, v, bias))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads, want))


@pytest.mark.parametrize(
    "graph",
    [
        graphs.window(40, 3),  # a long run of degree 7 between shorter boundary rows
        graphs.from_blocks([("full", 3, 3), ("causal", 4, 4), ("full", 5, 2)]),
        graphs.random(30, 20, 90, seed=4),  # isolated destinations, duplicates
    ],
    ids=["window", "blocks", "random"],
)
def test_index_from_degree_runs_equals_the_chunked_walk(monkeypatch, graph):
    """Rows in runs of equal degree are filled by broadcasts; the same index as the chunked walk."""
    built = []
    assert csr_index._degree_runs(graph.csr().ptr) is not None  # few enough runs: the broadcast path
    monkeypatch.setattr(csr_index, "_SMALL_SLOTS", 0)
    for max_runs in (10**6, 0):  # runs always, then never
        monkeypatch.setattr(csr_index, "_MAX_RUNS", max_runs)
        g = Graph(graph.edge_index, num_src=graph.num_src, num_dst=graph.num_dst)
        ix = interleaved_index(g, 3)
        built.append([ix.crow, ix.col, ix.row, *ix.transposed(), ix.from_caller, ix.to_caller])
    for a, b in zip(*built):
        assert torch.equal(a, b)


def _molecule_like(sizes, seed=0):
    """A batch of tree-plus-ring graphs of the given sizes, every bond both ways, bonds in random order."""
    gen, parts, offset = torch.Generator().manual_seed(seed), [], 0
    for n in sizes:
        a = torch.cat([torch.arange(1, n), torch.randint(0, n, (n // 4,), generator=gen)])
        b = torch.cat([(torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long(), (a[n - 1 :] + 1) % n])
        parts.append(torch.stack([torch.cat([a, b]), torch.cat([b, a])]) + offset)
        offset += n
    ei = torch.cat(parts, 1)
    return Graph(ei[:, torch.randperm(ei.shape[1], generator=gen)], num_src=offset, num_dst=offset)


@pytest.mark.parametrize("heads", [1, 3, 4])
def test_small_patterns_built_in_one_scatter_equal_the_walk_and_the_runs(monkeypatch, heads):
    """Patterns of at most _SMALL_SLOTS slots are filled from one scatter mapping each slot to its
    edge and head: the same index as the degree-run broadcasts and the chunked walk, on a batch of
    many small graphs of mixed degrees (isolated nodes included) and on a window graph."""
    for graph in (_molecule_like([5, 1, 17, 60, 9, 33]), graphs.window(40, 3)):
        built = []
        for small, max_runs in ((1 << 16, 64), (0, 10**6), (0, 0)):
            monkeypatch.setattr(csr_index, "_SMALL_SLOTS", small)
            monkeypatch.setattr(csr_index, "_MAX_RUNS", max_runs)
            g = Graph(graph.edge_index, num_src=graph.num_src, num_dst=graph.num_dst)
            ix = interleaved_index(g, heads)
            built.append([ix.crow, ix.col, ix.row, *ix.transposed(), ix.from_caller, ix.to_caller])
        for parts in zip(*built):
            assert all(torch.equal(parts[0], p) for p in parts[1:])
