"""sparseattn.nn.GlobalAttention against GraphGPS's global attention: pad each graph of the batch
(`to_dense_batch`), run nn.MultiheadAttention with a key padding mask, keep the real rows."""

from typing import Tuple

import pytest
import torch
from torch import nn

import sparseattn
from sparseattn.kernels import choose_auto, within_graphs
from sparseattn.kernels.auto import choose_packing
from sparseattn.kernels.padded import PADDED_MAX_WASTE, pack, padded_attention, plan_padding, rows_cost
from sparseattn.kernels.within_graphs import padded_batch
from sparseattn.nn import GlobalAttention, complete_per_graph

from .helpers import assert_close, grads_of

EMBED, HEADS = 12, 3


def to_dense_batch(x: torch.Tensor, batch: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """PyG's to_dense_batch in torch: x (N, F), sorted batch (N,) -> (B, L_max, F) zero-padded and
    the (B, L_max) mask of real rows."""
    sizes = torch.bincount(batch)
    first = torch.cumsum(sizes, 0) - sizes
    pos = torch.arange(x.shape[0]) - first[batch]  # (N,) position of each node in its graph
    dense = x.new_zeros(sizes.numel(), int(sizes.max()), x.shape[1])
    mask = torch.zeros(dense.shape[:2], dtype=torch.bool)
    dense[batch, pos], mask[batch, pos] = x, True
    return dense, mask


def graphgps_attention(mha: nn.MultiheadAttention, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """GraphGPS's `_sa_block` on a PyG batch: (N, E) -> (N, E)."""
    dense, mask = to_dense_batch(x, batch)
    return mha(dense, dense, dense, key_padding_mask=~mask, need_weights=False)[0][mask]


def batch_of(sizes) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def make_pair(dtype=torch.float64, **options):
    mha = nn.MultiheadAttention(EMBED, HEADS, batch_first=True, **options).to(dtype)
    with torch.no_grad():
        for p in mha.parameters():  # non-zero biases too
            p.uniform_(-0.7, 0.7)
    ours = GlobalAttention(EMBED, HEADS, **options).to(dtype)
    ours.load_state_dict(mha.state_dict())
    return mha, ours


# small graphs (the "small" backend's case), a few equal sizes (dense) and many sizes (padded buckets: csr)
CASES = [([3, 8, 1, 3, 8], "small"), ([70, 70, 70, 70], "dense"), ([40, 81, 55, 62, 48, 67], "csr")]


@pytest.mark.parametrize("sizes,auto_choice", CASES)
@pytest.mark.parametrize("backend", ["auto", "dense", "csr", "reference"])
def test_matches_padded_multihead_attention(sizes, auto_choice, backend):
    mha, ours = make_pair()
    ours.backend = backend
    batch = batch_of(sizes)
    x = torch.randn(batch.numel(), EMBED, dtype=torch.float64, requires_grad=True)
    graph = complete_per_graph(batch, num_nodes=x.shape[0])
    assert choose_auto(x.view(-1, HEADS, EMBED // HEADS), graph) == auto_choice
    expected = graphgps_attention(mha, x, batch)
    got = ours(x, batch)
    assert_close(got, expected, torch.float64, "global attention vs padded MHA")
    w = torch.randn_like(expected)
    g_ref = grads_of((expected * w).sum(), {"x": x, **dict(mha.named_parameters())})
    g_got = grads_of((got * w).sum(), {"x": x, **dict(ours.named_parameters())})
    assert g_ref.keys() == g_got.keys()
    for name in g_ref:
        assert_close(g_got[name], g_ref[name], torch.float64, f"grad of {name}", "global attention grads vs MHA")


def test_batch_ptr_and_graph_spellings_agree():
    _, ours = make_pair()
    sizes = [3, 5, 3]
    batch = batch_of(sizes)
    ptr = torch.tensor([0, 3, 8, 11])
    x = torch.randn(11, EMBED, dtype=torch.float64)
    by_batch = ours(x, batch)
    assert torch.equal(ours(x, ptr=ptr), by_batch)
    # a prebuilt graph takes the graph path, batch and ptr the padded one (`kernels.within_graphs`)
    assert_close(ours(x, graph=complete_per_graph(ptr=ptr)), by_batch, torch.float64, "graph vs padded path")
    one = ours(x[3:8])  # no batch: one graph
    assert_close(one, by_batch[3:8], torch.float64, "one graph vs its batch")
    # an empty graph in the middle of the batch holds no nodes and changes nothing
    assert torch.equal(ours(x, ptr=torch.tensor([0, 3, 3, 8, 11])), by_batch)


def test_dropout_eval_matches_and_training_drops():
    mha, ours = make_pair(dropout=0.5)
    batch = batch_of([4, 4])
    x = torch.randn(8, EMBED, dtype=torch.float64)
    mha.eval(), ours.eval()
    assert_close(ours(x, batch), graphgps_attention(mha, x, batch), torch.float64, "global attention vs padded MHA")
    ours.train()
    assert not torch.allclose(ours(x, batch), ours.eval()(x, batch))


def test_state_dict_loads_both_ways_and_init_matches_mha():
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(EMBED, HEADS)
    torch.manual_seed(1)
    ours = GlobalAttention(EMBED, HEADS)
    assert list(ours.state_dict()) == list(mha.state_dict())
    for key, value in mha.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    nn.MultiheadAttention(EMBED, HEADS).load_state_dict(ours.state_dict())
    no_bias = GlobalAttention(EMBED, HEADS, bias=False)
    no_bias.load_state_dict(nn.MultiheadAttention(EMBED, HEADS, bias=False).state_dict())


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        complete_per_graph(torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="rows"):
        complete_per_graph(torch.tensor([0, 0, 1]), num_nodes=4)
    with pytest.raises(ValueError, match="ptr"):
        complete_per_graph(ptr=torch.tensor([1, 3]))
    assert isinstance(complete_per_graph(num_nodes=3), sparseattn.Graph)


def test_a_graph_built_per_call_trains_csr_in_the_layout_for_one_call_graphs(head_major_calls):
    """Without `graph=`, the block graph is built for the call, like a raw edge_index: csr trains it
    head-major from HEAD_MAJOR_MIN_TRAINING_SLOTS on (no per-call H * E transposed index); a Graph
    passed in is kept, and trains in the interleaved layout."""
    from sparseattn.kernels.csr.head_major import HEAD_MAJOR_MIN_TRAINING_SLOTS

    sizes = [150, 160, 170, 180, 190, 200]  # more shapes than "dense" batches, so csr either way
    ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    graph = complete_per_graph(ptr=ptr)
    assert graph.num_edges * 4 >= HEAD_MAJOR_MIN_TRAINING_SLOTS
    layer = GlobalAttention(16, 4, backend="csr")
    x = torch.randn(int(ptr[-1]), 16, requires_grad=True)
    built = layer(x, ptr=ptr)
    assert head_major_calls == [1]
    kept = layer(x, graph=graph)
    assert head_major_calls == [1]
    assert_close(built, kept, torch.float32, "a graph built per call against one passed in")


def padded(sizes, batch_first=True):
    """x (B, L, E) (or (L, B, E)) float64 and its key padding mask (B, L), True at padding."""
    batch = batch_of(sizes)
    dense, real = to_dense_batch(torch.randn(batch.numel(), EMBED, dtype=torch.float64), batch)
    return (dense if batch_first else dense.transpose(0, 1).contiguous()), ~real


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_an_mha_style_call_returns_mhas_out_and_weights(batch_first, need_weights, average):
    """GraphGPS's self_attn(x, x, x, key_padding_mask=~mask, need_weights=...) on the layer gives
    nn.MultiheadAttention's (out, weights) on every row, padded ones included, so its [0] is the
    whole output. Before, a TypeError (no key_padding_mask, no batch_first); a call without them
    returned a tensor, whose [0] is node 0's row, broadcast by GraphGPS's residual without an error."""
    mha = nn.MultiheadAttention(EMBED, HEADS, batch_first=batch_first).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.uniform_(-0.7, 0.7)
    ours = GlobalAttention(EMBED, HEADS, batch_first=batch_first).double()
    ours.load_state_dict(mha.state_dict())
    x, mask = padded([3, 8, 1, 5], batch_first)
    kwargs = dict(key_padding_mask=mask, need_weights=need_weights, average_attn_weights=average)
    out, weights = ours(x, x, x, **kwargs)
    ref, ref_weights = mha(x, x, x, **kwargs)
    assert_close(out, ref, torch.float64, "MHA-style call vs MHA")
    if need_weights:
        assert_close(weights, ref_weights, torch.float64, "MHA-style call vs MHA")
    else:
        assert weights is None and ref_weights is None
    one = x[0] if batch_first else x[:, 0]  # unbatched (L, E), no mask
    assert_close(ours(one, one, one)[0], mha(one, one, one)[0], torch.float64, "MHA-style call vs MHA")


def test_graphgps_block_gives_the_native_result():
    """GraphGPS's `_sa_block(h_dense, None, ~mask)[mask]` with this layer in place of MHA equals the
    unpadded call `layer(h, batch)`, and `layer(h, batch, need_weights=False)[0]` is that output."""
    _, ours = make_pair()
    ours.batch_first = True
    batch = batch_of([4, 7, 1, 2])
    h = torch.randn(batch.numel(), EMBED, dtype=torch.float64)
    dense, real = to_dense_batch(h, batch)
    sa_block = ours(dense, dense, dense, attn_mask=None, key_padding_mask=~real, need_weights=False)[0][real]
    native = ours(h, batch)
    assert_close(sa_block, native, torch.float64, "MHA-style call vs native")
    out, weights = ours(h, batch, need_weights=False)
    assert torch.equal(out, native) and weights is None
    out, weights = ours(h, batch, need_weights=True)
    assert_close(out, native, torch.float64, "one graph vs its batch")
    assert weights.shape == (16 + 49 + 1 + 4, HEADS)


def test_mismatched_mha_style_calls_name_the_argument():
    ours = GlobalAttention(EMBED, HEADS, batch_first=True)
    x, mask = padded([2, 3])
    x = x.float()
    with pytest.raises(ValueError, match="one tensor as query, key and value"):
        ours(x, x.clone(), x)
    with pytest.raises(ValueError, match="no attn_mask or is_causal"):
        ours(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor \(2, 3\).*got torch.float32"):
        ours(x, x, x, key_padding_mask=mask.float())
    with pytest.raises(ValueError, match="key_padding_mask.*belong to the nn.MultiheadAttention-style call"):
        ours(x[0], torch.zeros(3, dtype=torch.long), key_padding_mask=mask[0])


def test_a_float_batch_vector_is_refused_naming_its_dtype():
    """Before: 'batch must be a 1-D integer tensor ... (37,) for 37 node rows, got (37,)'."""
    x = torch.randn(37, EMBED)
    batch = torch.zeros(37)
    with pytest.raises(ValueError, match=r"^batch must be an integer tensor of graph ids .*got torch\.float32$"):
        GlobalAttention(EMBED, HEADS)(x, batch)
    with pytest.raises(ValueError, match=r"ptr must be .* got shape \(2,\), dtype torch\.float32"):
        GlobalAttention(EMBED, HEADS)(x, ptr=torch.tensor([0.0, 37.0]))


@pytest.mark.parametrize("sizes", [[3, 8, 1, 3, 8], [5, 0, 4, 6], [7]])
def test_the_padded_path_equals_the_graph_path_and_trains_alike(sizes):
    """backend "auto" runs a batch of small graphs as one padded SDPA: the same output and gradients
    as the block graph on csr, by batch and by ptr (an empty graph included)."""
    _, ours = make_pair()
    ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    batch = batch_of(sizes)
    x = torch.randn(batch.numel(), EMBED, dtype=torch.float64, requires_grad=True)
    plan = padded_batch(batch, None, x.shape[0], x.dtype)
    assert plan is not None and plan.packed == (len(sizes) > 1)  # several graphs per row
    assert padded_batch(None, ptr, x.shape[0], x.dtype) is not None
    got = ours(x, batch)
    assert torch.equal(ours(x, ptr=ptr), got)
    assert torch.equal(ours(x, batch.int()), got)  # int32 graph ids, as some loaders give them
    ours.backend = "csr"
    expected = ours(x, batch)
    assert_close(got, expected, torch.float64, "padded path vs csr")
    w = torch.randn_like(expected)
    g_got = grads_of((got * w).sum(), {"x": x, **dict(ours.named_parameters())})
    g_ref = grads_of((expected * w).sum(), {"x": x, **dict(ours.named_parameters())})
    for name in g_ref:
        assert_close(g_got[name], g_ref[name], torch.float64, f"grad of {name}", "padded path vs csr")


def test_the_padded_path_is_left_for_wasteful_or_unusual_batches():
    """None (the graph path) when the packed rows would cost more than PADDED_MAX_WASTE times the
    edges, for an unsorted batch, a ptr not starting at 0, clamp mode or need_weights."""
    _, ours = make_pair()
    sizes = [1] * 600  # rows of 32 single nodes: each row's overhead buys one edge per node
    plan = plan_padding(sizes, torch.float64, torch.device("cpu"))
    assert rows_cost(plan.rows, plan.length) > PADDED_MAX_WASTE * sum(n * n for n in sizes)
    x = torch.randn(len(sizes), EMBED, dtype=torch.float64)
    assert padded_batch(batch_of(sizes), None, x.shape[0], x.dtype) is None
    assert padded_batch(torch.tensor([0, 1, 0, 1]), None, 4, x.dtype) is None
    assert padded_batch(None, torch.tensor([1, 3, 5]), 4, x.dtype) is None
    small = batch_of([4, 4])
    assert padded_batch(small, None, 8, x.dtype) is not None
    out, weights = ours(x[:8], small, need_weights=True)  # weights per edge: the graph path
    assert weights is not None and weights.shape == (32, HEADS)
    exact = ours(x[:8], small)
    ours.clamp = (-0.01, 0.01)  # binds: clamp mode runs on the graph, not in SDPA
    clamped = ours(x[:8], small)
    assert not torch.allclose(clamped, exact)
    ours.backend = "csr"
    assert_close(clamped, ours(x[:8], small), torch.float64, "clamp mode on auto vs csr")


@pytest.mark.parametrize("length", [8, 11, 32])
def test_packing_places_each_graph_once_within_its_row(length):
    """First-fit decreasing: every non-empty graph in exactly one row, no row past its length, the
    largest graphs first, no two rows that one row could hold; empty graphs take no slot."""
    sizes = [3, 8, 0, 1, 3, 8, 5, 2, 0, 7, 1]
    rows = pack(sizes, length)
    placed = sorted(i for row in rows for i in row)
    assert placed == [i for i, n in enumerate(sizes) if n > 0]
    fills = [sum(sizes[i] for i in row) for row in rows]
    assert max(fills) <= length
    assert all(a + b > length for j, a in enumerate(fills) for b in fills[j + 1 :])  # first fit merges
    assert len(rows) >= -(-sum(sizes) // length)
    plan = plan_padding(sizes, torch.float32, torch.device("cpu"))
    assert plan.packed and plan.rows < sum(n > 0 for n in sizes)
    assert plan.slot.unique().numel() == sum(sizes) and int(plan.slot.max()) < plan.rows * plan.length
    alone = plan.alone()
    assert not alone.packed and alone.rows == len(sizes) and alone.length == max(sizes)
    # packing that saves little (11 rows for 12) is not worth its (L, L) mask and its checks
    barely = plan_padding([40] * 10 + [20, 20], torch.float32, torch.device("cpu"))
    assert not barely.packed and barely.rows == 12 and barely.mask.shape == (12, 1, 1, 40)
    assert plan_padding([40, 20, 20], torch.float32, torch.device("cpu")).packed  # 2 rows for 3
    # packing is the CPU's (its SDPA's per-row cost); elsewhere one graph per row, no checks to make
    assert choose_packing(torch.device("cpu")) and not choose_packing(torch.device("meta"))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("where", ["x", "grad"])
def test_a_nan_in_one_graph_of_a_packed_row_stays_in_that_graph(where, compiled, monkeypatch):
    """Several graphs share a padded row (packed), but a NaN in one graph's input, or in the incoming
    gradient at one of its nodes, reaches that graph's rows only, forward and backward, as on csr:
    the packed rows' result is checked and recomputed with one graph per row. Under torch.compile
    too, where the attention runs eagerly between the compiled projections, packed rows included."""
    masks = []

    def recorded(q, k, v, slot, mask, dropout_p):
        masks.append(tuple(mask.shape))
        return padded_attention(q, k, v, slot, mask, dropout_p)

    monkeypatch.setattr(within_graphs, "padded_attention", recorded)
    _, ours = make_pair()
    run = torch.compile(ours, dynamic=True) if compiled else ours
    sizes = [3, 8, 1, 3, 8]
    batch = batch_of(sizes)
    plan = padded_batch(batch, None, batch.numel(), torch.float64)
    assert plan is not None and plan.packed
    x = torch.randn(batch.numel(), EMBED, dtype=torch.float64)
    w = torch.randn(batch.numel(), EMBED, dtype=torch.float64)
    if where == "x":
        x[4, 2] = float("nan")  # node 4: graph 1 (nodes 3-10)
    else:
        w[5, 0] = float("nan")
    results = {}
    for backend in ("auto", "csr"):
        ours.backend = backend
        xg = x.clone().requires_grad_()
        out = (run if backend == "auto" else ours)(xg, batch)
        (out * w).sum().backward()
        results[backend] = (out.detach(), xg.grad)
    # the packed rows ran (a (rows, 1, L, L) mask), and their fallback with one graph per row
    assert masks[0] == (plan.rows, 1, plan.length, plan.length) and masks[1][2] == 1
    graph1 = batch == 1
    for name, got, expected in zip(("out", "grad of x"), results["auto"], results["csr"]):
        bad = ~torch.isfinite(got).all(1)
        if name == "out":
            assert bad[graph1].all() if where == "x" else not bad.any()
        else:
            assert bad[graph1].any()
        assert not bad[~graph1].any(), f"{name}: a NaN reached another graph"
        assert_close(got[~graph1], expected[~graph1], torch.float64, f"{name} outside the NaN's graph", "packed vs csr")


def test_attn_bias_per_edge_and_head_equals_mha_with_that_additive_mask():
    """attn_bias (E, H) over complete_per_graph's edges (destination-major per graph) equals MHA run
    graph by graph with the same scores as its float attn_mask (H, n, n); its gradient flows, and the
    weights come back with it."""
    mha, ours = make_pair()
    sizes = [3, 5, 2]
    batch = batch_of(sizes)
    x = torch.randn(batch.numel(), EMBED, dtype=torch.float64)
    bias = torch.randn(sum(n * n for n in sizes), HEADS, dtype=torch.float64, requires_grad=True)
    out, weights = ours(x, batch, attn_bias=bias, need_weights=True)
    assert weights.shape == bias.shape
    expected, node, edge = [], 0, 0
    for n in sizes:
        mask = bias[edge : edge + n * n].detach().view(n, n, HEADS).permute(2, 0, 1)  # (H, dst, src)
        xg = x[node : node + n].unsqueeze(0)
        expected.append(mha(xg, xg, xg, attn_mask=mask, need_weights=False)[0][0])
        node, edge = node + n, edge + n * n
    assert_close(out, torch.cat(expected), torch.float64, "global attention with bias vs MHA with attn_mask")
    out.sum().backward()
    assert bias.grad is not None and bias.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="attn_bias"):
        xd = x[:4].view(1, 4, EMBED)
        ours(xd, xd, xd, attn_bias=bias[:16])


def test_export_with_a_batch_vector_names_the_graph_input_that_exports():
    """torch.export cannot size the graphs of a batch vector (they are its values): the export fails
    with one line naming graph=complete_per_graph(batch); exported with that Graph as an input, the
    program equals the eager layer on a batch of other sizes."""
    from torch.export import Dim

    layer = GlobalAttention(16, 2, batch_first=True).eval()
    x, batch = torch.randn(12, 16), torch.tensor([0] * 5 + [1] * 7)
    with pytest.raises(ValueError, match=r"graph=graphs.complete_per_graph\(batch\)"):
        torch.export.export(layer, (x, batch))

    class WithGraph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor, graph: sparseattn.Graph) -> torch.Tensor:
            return self.layer(x, graph=graph)

    shapes = ({0: Dim.AUTO}, sparseattn.Graph.dynamic_shapes())
    program = torch.export.export(WithGraph(), (x, complete_per_graph(batch)), dynamic_shapes=shapes)
    other = torch.tensor([0] * 3 + [1] * 4 + [2] * 2)
    y = torch.randn(9, 16)
    got = program.module()(y, complete_per_graph(other))
    assert_close(got, layer(y, other), torch.float32, "exported with a Graph input vs eager with batch")
