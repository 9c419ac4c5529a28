"""The dense backend: hand-computed cases, gradcheck, bucketing and padding waste, its limits."""

import math

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels.contract import AttentionInputs
from sparseattn.kernels.dense import MAX_WASTE, dense_attention, plan
from sparseattn.kernels.dense.dispatch import _clamp_cannot_bind

from ..tolerances import assert_within_reference_error

HALF = [torch.float16, torch.bfloat16]
ALL = HALF + [torch.float32]


def test_hand_computed_complete_pair():
    """complete(2), D=1, scale 1: destination 0 sees scores q0*k0, q0*k1 (clamped)."""
    q = torch.tensor([[[2.0]], [[0.5]]], dtype=torch.float64)
    k = torch.tensor([[[1.0]], [[4.0]]], dtype=torch.float64)
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64)
    out = edge_attention(q, k, v, graphs.complete(2), scale=1.0, backend="dense")
    wa, wb = math.exp(2.0), math.exp(5.0)  # 8 clamps to 5
    assert out[0].item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)
    wa, wb = math.exp(0.5), math.exp(2.0)
    assert out[1].item() == pytest.approx((wa * 10 + wb * 20) / (wa + wb), rel=1e-12)


def test_graph_without_blocks_is_rejected():
    q = torch.randn(10, 1, 4)
    with pytest.raises(ValueError, match="blocks"):
        edge_attention(q, q, q, graphs.window(10, 2), backend="dense")
    with pytest.raises(ValueError, match="blocks"):
        edge_attention(q, q, q, torch.tensor([[0, 1], [1, 0]]), backend="dense")


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), (-0.3, 0.3), None])
def test_gradcheck(clamp):
    g = graphs.from_blocks([("full", 3, 2), ("causal", 3, 3), ("full_no_self", 2, 2), ("causal_no_self", 1, 1)])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(g.num_dst, 2, 3, generator=gen, dtype=torch.float64).requires_grad_()
    k = torch.randn(g.num_src, 2, 3, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(g.num_src, 2, 2, generator=gen, dtype=torch.float64).requires_grad_()
    bias = (0.5 * torch.randn(g.num_edges, 2, generator=gen, dtype=torch.float64)).requires_grad_()

    def f(q, k, v, bias):
        return dense_attention(AttentionInputs(q, k, v, g, 0.7, clamp, bias, None, True))

    assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["full", "causal"])
def test_sdpa_path_equals_reference(kind):
    """clamp=None without bias/dropout/weights takes F.scaled_dot_product_attention on uniform buckets."""
    g = graphs.from_blocks([(kind, 6, 6)] * 3)
    q, k, v = (torch.randn(18, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = edge_attention(q, k, v, g, clamp=None, backend="dense")
    ref = edge_attention(q, k, v, g, clamp=None, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12)
    ga = torch.autograd.grad(out.sum(), (q, k, v))
    gb = torch.autograd.grad(ref.sum(), (q, k, v))
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(ga, gb))


def test_variable_lengths_are_bucketed_with_bounded_waste():
    lengths = list(range(5, 51)) * 2
    p = plan(graphs.from_blocks([("full", n, n) for n in lengths]))
    assert 0.0 < p.waste <= MAX_WASTE
    assert 1 < len(p.buckets) < len(set(lengths))  # grouped, but not one padded batch
    assert sum(bk.b for bk in p.buckets) == len(lengths)


def test_buckets_gather_their_rows_of_each_input_once():
    """However many buckets, q, k and v are each read by one gather (split per bucket): the
    backward of every gather fills a zero tensor of the input's size, which per bucket made the
    zero fills a third of the time of a variable-length batch. Outputs and gradients stay equal."""
    g = graphs.from_blocks([("full", n, n) for n in (3, 9, 20, 21, 40, 7)] + [("causal", 5, 5), ("causal", 8, 8)])
    assert len(plan(g).buckets) >= 4
    q, k, v = (torch.randn(g.num_dst, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    # the kernel itself: the registered backend runs it behind the finiteness check (guard.py), whose
    # autograd node hides the kernel's graph from this walk
    out, _ = dense_attention(AttentionInputs(q, k, v, g, 3**-0.5, (-5.0, 5.0), None, None, False))

    def gathers_reading(leaf: torch.Tensor) -> int:
        seen, stack, count = set(), [out.grad_fn], 0
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            nexts = [f for f, _ in fn.next_functions]
            if type(fn).__name__.startswith("IndexBackward"):
                count += any(getattr(f, "variable", None) is leaf for f in nexts)
            stack.extend(nexts)
        return count

    assert [gathers_reading(x) for x in (q, k, v)] == [1, 1, 1]
    ref = edge_attention(q, k, v, g, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12)
    ga, gb = (torch.autograd.grad(o.sum(), (q, k, v)) for o in (out, ref))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(ga, gb))


def test_uniform_batch_is_one_unpadded_bucket():
    p = plan(graphs.batch([graphs.complete(8)] * 5))
    assert len(p.buckets) == 1 and p.waste == 0.0 and p.contiguous_out
    assert p.buckets[0].mask is None  # full blocks without padding need no mask


def test_blocks_without_edges_and_rows_without_in_edges_give_zero():
    g = graphs.from_blocks([("causal_no_self", 3, 3), ("full", 0, 2), ("full_no_self", 1, 1)])
    q = torch.randn(g.num_dst, 2, 4, requires_grad=True)
    k = torch.randn(g.num_src, 2, 4, requires_grad=True)
    for clamp in [(-5.0, 5.0), None]:
        out = edge_attention(q, k, k, g, clamp=clamp, backend="dense")
        isolated = torch.tensor([0, 3, 4, 5])  # first causal row, the 0-source block, the 1-node block
        assert (out[isolated] == 0).all()
        q.grad = None
        out.sum().backward()
        assert (q.grad[isolated] == 0).all() and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("spec", [[("full", 3, 2), ("full", 2, 3)], [("causal", 4, 4)] * 2, [("full_no_self", 3, 3)]])
@pytest.mark.parametrize("clamp", [(-5.0, 5.0), (-0.3, 0.3)])
def test_clamp_function_gradcheck(spec, clamp):
    """DenseClampAttention (clamp mode, no bias/dropout/weights; scores of +-6 make the clamp bind)."""
    g = graphs.from_blocks(spec)
    gen = torch.Generator().manual_seed(1)
    q = (3 * torch.randn(g.num_dst, 2, 3, generator=gen, dtype=torch.float64)).requires_grad_()
    k = torch.randn(g.num_src, 2, 3, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(g.num_src, 2, 2, generator=gen, dtype=torch.float64).requires_grad_()

    def f(q, k, v):
        return dense_attention(AttentionInputs(q, k, v, g, 0.7, clamp, None, None, False))[0]

    assert not _clamp_cannot_bind(*(x[:, None].transpose(1, 2) for x in (q, k)), 0.7, clamp, False).all()
    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["full", "causal"])
@pytest.mark.parametrize("size, binds", [(0.3, False), (3.0, True)])
def test_clamp_mode_paths_equal_dense_reference(kind, size, binds):
    """Clamp mode on unpadded full/causal buckets: SDPA when the Cauchy-Schwarz bound proves the
    clamp cannot bind, DenseClampAttention when it might; both equal tests/dense.py."""
    from tests.dense import dense_attention as dense_ref

    g = graphs.from_blocks([(kind, 7, 7)] * 3)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (size * torch.randn(21, 2, 5, generator=gen, dtype=torch.float64) for _ in range(3))
    qb, kb = (x.view(3, 7, 2, 5).transpose(1, 2) for x in (q, k))
    assert bool(_clamp_cannot_bind(qb, kb, 5**-0.5, (-5.0, 5.0), kind == "causal").all()) == (not binds)
    if binds:  # some score really is outside [-5, 5]
        assert (torch.einsum("thd,shd->hts", q, k).abs() * 5**-0.5).max() > 5.0
    for x in (q, k, v):
        x.requires_grad_()
    out = edge_attention(q, k, v, g, backend="dense")
    ref = dense_ref(q, k, v, g.edge_index)
    assert torch.allclose(out, ref, atol=1e-12)
    ga = torch.autograd.grad((out * v).sum(), (q, k, v))
    gb = torch.autograd.grad((ref * v).sum(), (q, k, v))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(ga, gb))


@pytest.mark.parametrize("tile_bytes", [1 << 20, 1 << 14, 1 << 11, 16])
@pytest.mark.parametrize(
    "spec",
    [
        [("full", 70, 70)] * 3,  # one tile per batch element, or per few heads
        [("full", 9, 9)] * 5,  # small blocks: tiles of several batch elements
        [("causal", 80, 80)] * 2,  # causal row blocks of 40 rows, dk and dv added up over them
        [("causal", 9, 9), ("causal", 7, 7), ("causal", 5, 5)],  # padded: a mask per batch element
        [("full", 6, 4), ("full", 5, 4), ("full_no_self", 4, 4)],  # padded bipartite, and without self-loops
        [("causal_no_self", 6, 6), ("causal_no_self", 4, 4)],  # padded, a first row without edges
    ],
)
def test_clamp_tiles_equal_reference(spec, tile_bytes):
    """Clamp mode on dense blocks runs tile by tile (kernel_options dense_tile_bytes): with tiles of one
    (batch, head) pair, some heads of one batch element, or one head of several batch elements, and
    causal row blocks, values and gradients equal the reference; the scores (3x the usual) make the
    clamp bind."""
    g = graphs.from_blocks(spec)
    gen = torch.Generator().manual_seed(5)
    q = (3 * torch.randn(g.num_dst, 3, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    k, v = (torch.randn(g.num_src, 3, 4, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    out = edge_attention(q, k, v, g, backend="dense", kernel_options={"dense_tile_bytes": tile_bytes})
    ref = edge_attention(q, k, v, g, backend="reference")
    assert (torch.einsum("thd,shd->ths", q, k).abs() * 0.5).amax() > 5.0
    assert torch.allclose(out, ref, atol=1e-12)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    ga, gb = (torch.autograd.grad(o, (q, k, v), grad_out) for o in (out, ref))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(ga, gb))


@pytest.mark.parametrize(
    "spec",
    [
        [("full", 5, 5)] * 2,
        [("full", 6, 4), ("full", 5, 3), ("full", 3, 4)],  # padded bipartite
        [("full_no_self", 5, 5), ("full_no_self", 3, 3)],
        [("causal", 6, 6)] * 2,
        [("causal", 6, 6), ("causal", 2, 2)],
        [("causal_no_self", 5, 5), ("causal_no_self", 3, 3)],
    ],
)
def test_off_edge_biases_mark_exactly_the_masked_scores(spec):
    """Clamp mode's tiles add `OFF_EDGE` where a bucket has no edge (a (lq, lk) term from the block
    kind plus a (B, 1, lk) term at the padding keys) instead of a boolean fill: on every row with
    an edge, the two terms are negative exactly where the bucket's mask is False; `rows` marks the
    rows that have one."""
    from sparseattn.kernels.dense.plan import OFF_EDGE

    for bk in plan(graphs.from_blocks(spec)).buckets:
        off = bk.off_edges
        bias = torch.zeros(bk.b, bk.lq, bk.lk)
        for term in (off.shape, off.keys):
            if term is not None:
                bias = bias + term
        mask = bk.mask[:, 0] if bk.mask is not None else torch.ones(bk.b, bk.lq, bk.lk, dtype=torch.bool)
        has_edges = mask.any(-1)  # (B, lq)
        assert torch.equal((bias < 0)[has_edges], ~mask[has_edges])
        assert set(bias.unique().tolist()) <= {0.0, OFF_EDGE}
        if has_edges.all():
            assert off.rows is None
        else:
            assert torch.equal(off.rows[:, 0, :, 0], has_edges)


def test_nan_query_of_a_row_without_edges_reaches_nothing():
    """Row 0 of a causal block without self-loops reads no key: NaN there must not leak into the
    clamp-mode tiles (its scores would be NaN), so out and every gradient equal the reference."""
    g = graphs.from_blocks([("causal_no_self", 5, 5)] * 2)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(10, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    q[0] = q[5] = float("nan")
    q[1:5] *= 6  # the clamp binds on the other rows
    for x in (q, k, v):
        x.requires_grad_()
    out = edge_attention(q, k, v, g, backend="dense")
    ref = edge_attention(q, k, v, g, backend="reference")
    assert torch.isfinite(out).all() and torch.allclose(out, ref, atol=1e-12)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    ga, gb = (torch.autograd.grad(o, (q, k, v), grad_out) for o in (out, ref))
    assert all(torch.isfinite(a).all() and torch.allclose(a, b, atol=1e-10) for a, b in zip(ga, gb))


def test_clamp_gradient_counts_scores_at_the_bounds():
    """Scores exactly at lo or hi pass the gradient, as torch.clamp's backward does (the tiles use
    hardtanh_backward, which is exclusive, with bounds one ulp outside). Both rows take the tiles:
    the Cauchy-Schwarz bound (|q| max|k| = 2) cannot rule the clamp out."""
    g = graphs.complete(2)
    q = torch.tensor([[[1.0]], [[-1.0]]], dtype=torch.float64, requires_grad=True)
    k = torch.tensor([[[1.0]], [[-2.0]]], dtype=torch.float64, requires_grad=True)  # scores: hi, -2; lo, 2
    v = torch.tensor([[[1.0]], [[3.0]]], dtype=torch.float64)
    out, ref = (edge_attention(q, k, v, g, scale=1.0, clamp=(-1.0, 1.0), backend=b) for b in ("dense", "reference"))
    ga, gb = (torch.autograd.grad(o.sum(), (q, k)) for o in (out, ref))
    assert (gb[0].abs() > 0.1).all()  # only the scores at the bounds carry q's gradient
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(ga, gb))


def test_clamp_tiles_allocate_per_call_not_per_tile(one_thread):
    """The tiles write into buffers made once per call (out= ops): with 4 tiles or 64, forward and
    backward allocate the same number of tensors. A fresh tensor per tile op made glibc refault
    its pages, slowing the elementwise ops 4-5x on long blocks."""
    from torch.profiler import profile

    import sparseattn.kernels.dense.tiles as dense_tiles

    g = graphs.from_blocks([("full", 64, 64)] * 4)
    q, k, v = (torch.randn(256, 4, 8, requires_grad=True) for _ in range(3))
    q.data *= 4  # the clamp may bind: the tiles run, not SDPA
    grad = torch.randn(256, 4, 8)  # (an expanded gradient, as .sum() gives, would be copied per tile by bmm)

    def allocations(tile_bytes: int) -> int:
        options = {"dense_tile_bytes": tile_bytes}
        assert (
            len(dense_tiles._clamp_tiles((4, 4, 64, 64), 4, False, tile_bytes))
            == {4 * 64 * 64 * 4: 4, 64 * 64: 64}[tile_bytes]
        )
        edge_attention(q, k, v, g, backend="dense", kernel_options=options).backward(grad)  # builds the plan
        with profile() as prof:
            edge_attention(q, k, v, g, backend="dense", kernel_options=options).backward(grad)
        return sum(e.name in ("aten::empty", "aten::empty_strided") for e in prof.events())

    assert allocations(64 * 64) == allocations(4 * 64 * 64 * 4)


def test_clamp_tiles_cover_each_score_once():
    """_clamp_tiles: every (batch, head, row, key) a row can see lies in exactly one tile, for
    full and causal buckets and tile budgets from one pair to the whole bucket; each tile's
    `shape` (which sizes the scratch buffers) is that of its scores."""
    import sparseattn.kernels.dense.tiles as dense_tiles

    for causal in (False, True):
        for budget in (16, 1 << 12, 1 << 16, 1 << 30):
            tiles = dense_tiles._clamp_tiles((3, 4, 150, 150), 4, causal, budget)
            count = torch.zeros(3, 4, 150, 150, dtype=torch.int32)
            for t in tiles:
                assert count[t.batch, t.heads, t.rows, t.keys].shape == t.shape
                count[t.batch, t.heads, t.rows, t.keys] += 1
            seen = torch.ones(150, 150, dtype=torch.bool).tril_() if causal else torch.ones(150, 150, dtype=torch.bool)
            assert (count[:, :, seen] == 1).all() and (count <= 1).all()


def test_clamp_bound_fails_on_nonfinite_and_narrow_clamps():
    qb = torch.ones(1, 1, 2, 4) * 0.1

    def holds(q, k, clamp):
        return bool(_clamp_cannot_bind(q, k, 1.0, clamp, False).all())

    assert holds(qb, qb, (-1.0, 1.0))
    assert not holds(qb, qb, (0.0, 1.0))  # a score of 0.04 is above lo, but the bound is not
    assert not holds(qb, qb, (-1.0, 0.01))
    assert not holds(qb.clone().index_fill_(2, torch.tensor([0]), float("nan")), qb, (-5.0, 5.0))
    assert not holds(qb.clone().index_fill_(2, torch.tensor([0]), float("inf")), qb, (-5.0, 5.0))


def test_causal_bound_is_per_row_prefix():
    """Row i of a causal block is bounded by the keys j <= i only."""
    kb = torch.ones(1, 1, 3, 2) * 0.1
    kb[0, 0, 2] = 100.0  # only the last row sees it
    rows = _clamp_cannot_bind(torch.ones(1, 1, 3, 2), kb, 1.0, (-5.0, 5.0), True)
    assert rows.view(-1).tolist() == [True, True, False]
    assert not _clamp_cannot_bind(torch.ones(1, 1, 3, 2), kb, 1.0, (-5.0, 5.0), False).any()


@pytest.mark.parametrize("kind", ["full", "causal"])
def test_mixed_rows_equal_reference_and_stay_local(kind):
    """Some rows provably inside the clamp (SDPA), some not (the lean path), in one bucket:
    values and gradients equal the reference; changing a later token or another block leaves a
    row's output bit for bit (its path depends only on what it attends to)."""
    g = graphs.from_blocks([(kind, 6, 6)] * 3)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(18, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    q[7:9] *= 8  # block 1, rows 1-2: the clamp may bind there
    for x in (q, k, v):
        x.requires_grad_()
    out = edge_attention(q, k, v, g, backend="dense")
    ref = edge_attention(q, k, v, g, backend="reference")
    assert torch.allclose(out, ref, atol=1e-12)
    ga, gb = (torch.autograd.grad((o * v).sum(), (q, k, v)) for o in (out, ref))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(ga, gb))
    k2 = k.detach().clone()
    k2[11] *= 50  # the last token of block 1: now every row of block 1 that sees it may bind
    out2 = edge_attention(q, k2, v, g, backend="dense")
    assert torch.equal(out2[:6], out[:6]) and torch.equal(out2[12:], out[12:])
    if kind == "causal":
        assert torch.equal(out2[6:11], out[6:11])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype, clamp", [(dt, None) for dt in ALL] + [(dt, (-5.0, 5.0)) for dt in HALF])
def test_cuda_buckets_take_fused_kernels_in_the_input_dtype(monkeypatch, dtype, clamp):
    """On CUDA, unpadded full/causal buckets go to fused kernels with the inputs as they are: SDPA
    in exact mode (its kernels accumulate in float32; upcasting first ran the float32 kernel, 5-10x
    slower on an H100), triton_blocks in clamp mode for half types; values and gradients stay
    within a few times the reference backend's own error in that dtype."""
    import torch.nn.functional as F

    from sparseattn.kernels.dense import triton_blocks

    seen = []

    def spy(module, name):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda q, *a, **kw: seen.append(q.dtype) or real(q, *a, **kw))

    spy(F, "scaled_dot_product_attention")
    spy(triton_blocks, "block_clamp_attention")
    g = graphs.from_blocks([("full", 64, 64)] * 3 + [("causal", 64, 64)] * 2, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (3 * torch.randn(g.num_dst, 2, 16, generator=gen, device="cuda", dtype=torch.float64) for _ in range(3))
    q[:32] *= 0.1  # rows inside the clamp next to rows where it binds
    ins = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    gold_in = [x.detach().double().requires_grad_() for x in ins]
    out = edge_attention(*ins, g, clamp=clamp, backend="dense")
    gold = edge_attention(*gold_in, g, clamp=clamp, backend="reference")
    same = [x.detach().requires_grad_() for x in ins]
    ref = edge_attention(*same, g, clamp=clamp, backend="reference")  # the reference's own error
    assert out.dtype == dtype and seen == [dtype, dtype]  # one call per bucket (full, causal)
    assert_within_reference_error(out, ref, gold, factor=4.0, what="out")
    d_out = torch.randn(gold.shape, generator=gen, device="cuda", dtype=torch.float64)
    grads = torch.autograd.grad(out, ins, d_out.to(dtype))
    refs = torch.autograd.grad(ref, same, d_out.to(dtype))
    golds = torch.autograd.grad(gold, gold_in, d_out)
    for name, a, r, b in zip("qkv", grads, refs, golds):
        assert_within_reference_error(a, r, b, factor=4.0, what=f"d{name}")


def test_fused_clamp_kernel_only_where_tensor_cores_take_the_dtype():
    from sparseattn.kernels.dense.dispatch import _tensor_cores_take

    assert _tensor_cores_take(torch.bfloat16, (9, 0)) and _tensor_cores_take(torch.bfloat16, (8, 0))
    assert not _tensor_cores_take(torch.bfloat16, (7, 5))  # Turing: no bfloat16 tensor cores
    assert _tensor_cores_take(torch.float16, (7, 5)) and not _tensor_cores_take(torch.float16, (7, 0))
