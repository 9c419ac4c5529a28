"""sparseattn.nn.GATConv and GATv2Conv against torch_geometric.nn's: same state dict, equal outputs,
attention weights and gradients (float64), and no (E, H, C) tensor kept for backward."""

import itertools
from typing import Dict, Optional

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sparseattn
from sparseattn.kernels.scores import default_chunk
from sparseattn.nn import GATConv, GATv2Conv

from .helpers import assert_close, grads_of

pyg_nn = pytest.importorskip("torch_geometric.nn")

N_SRC, N_DST, EDGE_DIM, C = 6, 5, 4, 3
# sources 0..5 into destinations 0..4: destination 3 has no in-edges (without self loops), (1 -> 0)
# and (4 -> 2) repeat, 2 -> 2 and 1 -> 1 are self loops, and the edges are not sorted
EDGE_INDEX = torch.tensor(
    [
        [1, 0, 4, 2, 1, 5, 4, 3, 0, 2, 5, 4, 1],
        [0, 4, 2, 0, 0, 1, 2, 4, 1, 2, 4, 2, 1],
    ]
)
OURS = {"GATConv": GATConv, "GATv2Conv": GATv2Conv}


def make_pair(name: str, bipartite: bool, **options):
    """PyG's layer and ours with PyG's state dict, in float64."""
    in_channels = (N_SRC - 1, N_DST - 1) if bipartite else N_SRC - 1
    theirs = getattr(pyg_nn, name)(in_channels, C, **options).double()
    ours = OURS[name](in_channels, C, **options).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def make_inputs(bipartite: bool, edge_dim: Optional[int], num_edges: int = EDGE_INDEX.shape[1]):
    leaves: Dict[str, torch.Tensor] = {}
    kw = dict(dtype=torch.float64, requires_grad=True)
    if bipartite:
        leaves["x_src"] = torch.randn(N_SRC, N_SRC - 1, **kw)
        leaves["x_dst"] = torch.randn(N_DST, N_DST - 1, **kw)
        x = (leaves["x_src"], leaves["x_dst"])
    else:
        leaves["x"] = torch.randn(N_SRC, N_SRC - 1, **kw)
        x = leaves["x"]
    edge_attr = None
    if edge_dim is not None:
        edge_attr = leaves["edge_attr"] = torch.randn(num_edges, edge_dim, **kw)
    return x, edge_attr, leaves


def compare(theirs, ours, x, edge_attr, leaves, edge_index=EDGE_INDEX):
    """Outputs, attention weights (and their edge index) and gradients of a random projection of
    the output and weights with respect to the inputs and every parameter."""
    out_t, (ei_t, alpha_t) = theirs(x, EDGE_INDEX, edge_attr, return_attention_weights=True)
    out_o, (ei_o, alpha_o) = ours(x, edge_index, edge_attr, return_attention_weights=True)
    assert_close(out_o, out_t, torch.float64, "output vs PyG", "GAT output")
    assert torch.equal(ei_o, ei_t)
    assert_close(alpha_o, alpha_t, torch.float64, "alpha vs PyG", "GAT alpha")
    proj = torch.randn_like(out_t)
    proj_a = torch.randn_like(alpha_t)
    named = lambda m: {**leaves, **dict(m.named_parameters())}  # noqa: E731
    grads_t = grads_of((out_t * proj).sum() + (alpha_t * proj_a).sum(), named(theirs))
    grads_o = grads_of((out_o * proj).sum() + (alpha_o * proj_a).sum(), named(ours))
    assert sorted(grads_o) == sorted(grads_t)
    for name in grads_t:
        assert_close(grads_o[name], grads_t[name], torch.float64, f"d/d{name} vs PyG", "GAT gradients")


def eager_and_compiled(ours, compiled, x, edge_index, edge_attr, leaves):
    """[(out, gradients of leaves)] of the eager layer, then the compiled one, each given a fresh copy
    of edge_index, the output weighted by a fixed ramp."""
    results = []
    for fn in (ours, compiled):
        out = fn(x, edge_index.clone(), edge_attr)
        results.append((out, grads_of((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), leaves)))
    return results


GAT_CASES = list(itertools.product([1, 3], [True, False], [None, EDGE_DIM], [True, False], [False, True]))


@pytest.mark.parametrize("heads,concat,edge_dim,add_self_loops,bipartite", GAT_CASES)
def test_gatconv_equals_pyg(heads, concat, edge_dim, add_self_loops, bipartite):
    torch.manual_seed(0)
    theirs, ours = make_pair(
        "GATConv", bipartite, heads=heads, concat=concat, edge_dim=edge_dim, add_self_loops=add_self_loops
    )
    compare(theirs, ours, *make_inputs(bipartite, edge_dim))


V2_CASES = [(*case, False) for case in GAT_CASES] + [
    (heads, True, edge_dim, True, False, True) for heads in (1, 3) for edge_dim in (None, EDGE_DIM)
]


@pytest.mark.parametrize("edge_chunk", [None, 4])
@pytest.mark.parametrize("heads,concat,edge_dim,add_self_loops,bipartite,share_weights", V2_CASES)
def test_gatv2conv_equals_pyg(heads, concat, edge_dim, add_self_loops, bipartite, share_weights, edge_chunk):
    """edge_chunk None: a graph this small takes the reference's scores; 4: the chunked op (over the
    edges in destination order when add_self_loops made a Graph)."""
    torch.manual_seed(0)
    options = dict(concat=concat, edge_dim=edge_dim, add_self_loops=add_self_loops, share_weights=share_weights)
    theirs, ours = make_pair("GATv2Conv", bipartite, heads=heads, **options)
    ours.edge_chunk = edge_chunk
    compare(theirs, ours, *make_inputs(bipartite, edge_dim))


@pytest.mark.parametrize("backend", ["csr", "reference"])
@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_each_backend_equals_pyg(name, backend):
    """Small float64 graphs take the reference's path under "auto"; each named backend too."""
    torch.manual_seed(1)
    for bipartite, edge_dim in ((False, EDGE_DIM), (True, None)):
        theirs, ours = make_pair(name, bipartite, heads=3, edge_dim=edge_dim)
        ours.backend = backend
        compare(theirs, ours, *make_inputs(bipartite, edge_dim))


def test_gatv2_edge_chunks_give_one_result():
    """Scores computed 3 edges at a time (the chunked op, the last chunk short) equal PyG's."""
    torch.manual_seed(8)
    theirs, ours = make_pair("GATv2Conv", True, heads=2, edge_dim=EDGE_DIM)
    ours.edge_chunk = 3
    compare(theirs, ours, *make_inputs(True, EDGE_DIM))
    assert GATv2Conv(4, 64, heads=4).edge_chunk is None  # by device at each call: 2^20 values per chunk on a CPU
    assert default_chunk(4, 64, torch.device("cpu")) == 2**20 // 256
    assert default_chunk(4, 64, torch.device("cuda")) == 2**27 // 256
    with pytest.raises(ValueError, match="edge_chunk must be a positive int or None, got 0"):
        GATv2Conv(4, 64, edge_chunk=0)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize("fill_value", ["mean", "add", "max", "min", "mul", 0.5, "tensor"])
def test_self_loop_fill_values_equal_pyg(name, fill_value):
    torch.manual_seed(1)
    fill = torch.randn(EDGE_DIM, dtype=torch.float64) if fill_value == "tensor" else fill_value
    theirs, ours = make_pair(name, False, heads=2, edge_dim=EDGE_DIM, fill_value=fill)
    compare(theirs, ours, *make_inputs(False, EDGE_DIM))


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize("bipartite", [False, True])
def test_residual_no_bias_and_slope_equal_pyg(name, bipartite):
    torch.manual_seed(2)
    theirs, ours = make_pair(name, bipartite, heads=2, residual=True, bias=False, negative_slope=0.5)
    compare(theirs, ours, *make_inputs(bipartite, None))


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_a_graph_or_adj_t_equals_its_edge_index(name):
    """A Graph (with or without self loops added) gives PyG's edge_index result; a CSR adj_t
    (duplicate edges kept) PyG's adj_t result, the weights as a sparse (N_dst, N_src, H) CSR tensor."""
    torch.manual_seed(3)
    for loops in (True, False):
        theirs, ours = make_pair(name, True, heads=2, edge_dim=EDGE_DIM, add_self_loops=loops)
        graph = sparseattn.Graph(EDGE_INDEX, num_src=N_SRC, num_dst=N_DST)
        compare(theirs, ours, *make_inputs(True, EDGE_DIM), edge_index=graph)
    theirs, ours = make_pair(name, True, heads=2, add_self_loops=False)
    order = torch.argsort(EDGE_INDEX[1] * N_SRC + EDGE_INDEX[0], stable=True)  # CSR's storage order
    sorted_index = EDGE_INDEX[:, order]
    crow = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(sorted_index[1], minlength=N_DST).cumsum(0)])
    adj_t = torch.sparse_csr_tensor(
        crow, sorted_index[0], torch.ones(order.shape[0]), (N_DST, N_SRC), check_invariants=False
    )
    x, _, _ = make_inputs(True, None)
    expected, (weights_t, alpha_t) = theirs(x, adj_t, return_attention_weights=True)
    got, (weights, alpha) = ours(x, adj_t, return_attention_weights=True)
    assert weights.layout == weights_t.layout == torch.sparse_csr  # PyG's answer to an adj_t: adj_t's weights
    assert torch.equal(weights.crow_indices(), weights_t.crow_indices())
    assert torch.equal(weights.col_indices(), weights_t.col_indices())
    assert_close(got, expected, torch.float64, "adj_t vs PyG", "GAT output")
    assert_close(alpha, alpha_t, torch.float64, "adj_t alpha vs PyG", "GAT alpha")
    assert_close(weights.values(), alpha_t, torch.float64, "adj_t weights vs PyG", "GAT alpha")


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_a_kept_graph_keeps_its_self_looped_graph(name):
    """With add_self_loops, the Graph with loops added is built once per caller's Graph: the second
    call attends over the same Graph object (its kernel structure kept), with the same result."""
    torch.manual_seed(4)
    theirs, ours = make_pair(name, True, heads=2, edge_dim=EDGE_DIM, add_self_loops=True)
    graph = sparseattn.Graph(EDGE_INDEX, num_src=N_SRC, num_dst=N_DST)
    x, edge_attr, _ = make_inputs(True, EDGE_DIM)
    seen = []
    real = sparseattn.nn._gat_common.edge_attention

    def spy(*args, **kwargs):
        seen.append(args[3])
        return real(*args, **kwargs)

    sparseattn.nn._gat_common.edge_attention = spy
    try:
        first, second = ours(x, graph, edge_attr), ours(x, graph, edge_attr)
    finally:
        sparseattn.nn._gat_common.edge_attention = real
    assert len(seen) == 2 and seen[0] is seen[1] and isinstance(seen[0], sparseattn.Graph)
    assert torch.equal(first, second)
    assert_close(first, theirs(x, EDGE_INDEX, edge_attr), torch.float64, "kept graph vs PyG", "GAT output")


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_state_dicts_load_both_ways_and_lazy_widths(name):
    torch.manual_seed(4)
    theirs = getattr(pyg_nn, name)((-1, -1), C, heads=2, edge_dim=EDGE_DIM, residual=True).double()
    ours = OURS[name]((-1, -1), C, heads=2, edge_dim=EDGE_DIM, residual=True).double()
    x, edge_attr, _ = make_inputs(True, EDGE_DIM)
    theirs(x, EDGE_INDEX, edge_attr), ours(x, EDGE_INDEX, edge_attr)  # infer the widths
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())  # ours into theirs, glorot-initialized at the first call
    assert_close(ours(x, EDGE_INDEX, edge_attr), theirs(x, EDGE_INDEX, edge_attr), torch.float64, "lazy vs PyG")
    for lin in ("lin_src", "lin_dst") if name == "GATConv" else ("lin_l", "lin_r"):
        weight = getattr(ours, lin).weight
        bound = (6.0 / sum(weight.shape)) ** 0.5
        assert type(getattr(ours, lin)) is torch.nn.Linear and weight.abs().max() <= bound


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_dropout_in_training_only(name):
    """eval() equals PyG; in training with one in-edge per node (self loops only) each output row is
    0 or W x / (1 - p), both seen, and one seed gives one result."""
    torch.manual_seed(5)
    theirs, ours = make_pair(name, False, heads=2, dropout=0.5, bias=False)
    theirs.eval(), ours.eval()
    x, _, leaves = make_inputs(False, None)
    compare(theirs, ours, x, None, leaves)
    ours.train()
    n = 200
    x = torch.randn(n, N_SRC - 1, dtype=torch.float64)
    loops_only = torch.empty(2, 0, dtype=torch.long)
    torch.manual_seed(6)
    out = ours(x, loops_only).view(n, 2, C)
    torch.manual_seed(6)
    assert torch.equal(ours(x, loops_only).view(n, 2, C), out)
    lin = ours.lin if name == "GATConv" else ours.lin_l
    kept = (lin(x).view(n, 2, C) / 0.5).detach()
    is_zero = (out == 0).all(-1)
    assert is_zero.any() and (~is_zero).any()
    assert torch.allclose(out[~is_zero], kept[~is_zero])


def test_edge_attr_errors_name_the_argument():
    layer = GATConv(4, 2)
    with pytest.raises(ValueError, match="edge_attr was given but the layer was built with edge_dim=None"):
        layer(torch.randn(3, 4), torch.tensor([[0, 1], [1, 2]]), torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"edge_attr must have shape \(E, edge_dim\) = \(2, 3\)"):
        GATConv(4, 2, edge_dim=3)(torch.randn(3, 4), torch.tensor([[0, 1], [1, 2]]), torch.randn(5, 3))
    with pytest.raises(ValueError, match="fill_value must be"):
        GATConv(4, 2, fill_value="median")
    with pytest.raises(ValueError, match=r"\(x_src, None\) is not supported"):  # PyG's GATv2Conv asserts
        GATv2Conv((4, 4), 2)((torch.randn(3, 4), None), torch.tensor([[0, 1], [1, 2]]))


class _LargestSaved:
    """The largest tensor (numel) autograd saves for backward outside checkpointed regions."""

    def __init__(self) -> None:
        self.largest = 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.largest = max(self.largest, t.numel())
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)


class _LargestOutput(TorchDispatchMode):
    """The largest tensor (numel) any op returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_no_edge_by_channel_tensor_is_kept_for_backward(name):
    """PyG saves (E, H, C) tensors for backward; ours saves nothing larger than O(E * H + N * H * C)
    (E = 48 N here, so E * H * C dwarfs both). GATv2's per-edge (chunk, H, C) sums are recomputed
    in backward, so with a small edge_chunk no op outputs an (E, H, C) tensor either."""
    n, heads, c, per_node = 32, 2, 16, 48
    gen = torch.Generator().manual_seed(7)
    edge_index = torch.stack([torch.randint(0, n, (n * per_node,), generator=gen), torch.arange(n).repeat(per_node)])
    x = torch.randn(n, 16, requires_grad=True)
    edge_attr = torch.randn(edge_index.shape[1], 4)
    e_h_c = (int((edge_index[0] != edge_index[1]).sum()) + n) * heads * c  # edges after self loops
    theirs = getattr(pyg_nn, name)(16, c, heads=heads, edge_dim=4)
    extra = {"edge_chunk": 256} if name == "GATv2Conv" else {}
    # backend csr: with "auto" a graph this small takes the "small" backend, whose
    # gathers keep (E, H, C) values (cheaper than building a CSR at this size)
    ours = OURS[name](16, c, heads=heads, edge_dim=4, backend="csr", **extra)
    with _LargestSaved() as saved_t:
        theirs(x, edge_index, edge_attr).sum().backward()
    with _LargestSaved() as saved_o:
        ours(x, edge_index, edge_attr).sum().backward()
    assert saved_t.largest >= e_h_c
    assert saved_o.largest < e_h_c / 4
    if name == "GATv2Conv":
        with _LargestOutput() as mode:
            ours(x, edge_index, edge_attr).sum().backward()
        assert mode.largest < e_h_c / 4


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_to_hetero_treats_them_as_message_passing(name):
    """sparseattn.nn.to_hetero gives PyG's to_hetero result on PyG's layer (outputs per node type)."""
    from .test_hetero import two_type_graph

    class Net(torch.nn.Module):
        def __init__(self, conv) -> None:
            super().__init__()
            self.conv1 = conv((-1, -1), 3, heads=2, edge_dim=2, add_self_loops=False)
            self.conv2 = conv((-1, -1), 4, add_self_loops=False)

        def forward(self, x, edge_index, edge_attr):
            return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index)

    data = two_type_graph()
    args = (data.x_dict, data.edge_index_dict, data.edge_attr_dict)
    theirs = pyg_nn.to_hetero(Net(getattr(pyg_nn, name)), data.metadata()).double()
    ours = sparseattn.nn.to_hetero(Net(OURS[name]), data.metadata()).double()
    expected = theirs(*args)
    ours(*args)
    ours.load_state_dict(theirs.state_dict())
    got = ours(*args)
    assert sorted(got) == sorted(expected) == ["a", "b"]
    for node_type in expected:
        assert_close(got[node_type], expected[node_type], torch.float64, "to_hetero vs PyG")


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize("fill_value", ["mean", "max", "mul", 0.5])
def test_compiled_layer_with_self_loops_equals_eager_over_new_sizes(name, fill_value):
    """torch.compile(dynamic=True) over a raw edge_index with self loops to remove and add: traced, the
    graph's own loops stay in place with a -inf score (`_gat_common.AttentionEdges.dropped`) and the
    loops' features reduce the other edges' only, so nothing's size comes from the data and the layer
    is one graph (3 before, 5 before that); two graphs of different sizes give eager's outputs,
    gradients and returned weights (PyG's edges: the dropped ones cut out) for each fill_value
    (aot_eager: the trace is what is tested, not inductor's code)."""
    torch.manual_seed(5)
    ours = OURS[name](N_SRC - 1, C, heads=2, edge_dim=EDGE_DIM, fill_value=fill_value).double()
    compiled = torch.compile(ours, dynamic=True, backend="aot_eager")
    bigger = torch.cat([EDGE_INDEX, torch.tensor([[3, 5, 0, 0], [3, 2, 4, 3]])], dim=1)
    for edge_index in (EDGE_INDEX, bigger):
        assert (edge_index[0] == edge_index[1]).any()  # loops to drop
        x, edge_attr, leaves = make_inputs(False, EDGE_DIM, edge_index.shape[1])
        (out_e, grads_e), (out_c, grads_c) = eager_and_compiled(ours, compiled, x, edge_index, edge_attr, leaves)
        assert_close(out_c, out_e, torch.float64, "compiled vs eager", "GAT output")
        for leaf in grads_e:
            assert_close(grads_c[leaf], grads_e[leaf], torch.float64, f"compiled d/d{leaf}", "GAT gradients")
        (_, (index_e, alpha_e)), (_, (index_c, alpha_c)) = (
            fn(x, edge_index.clone(), edge_attr, return_attention_weights=True) for fn in (ours, compiled)
        )
        assert torch.equal(index_c, index_e)
        assert_close(alpha_c, alpha_e, torch.float64, "compiled vs eager", "GAT weights")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ours)(x, bigger.clone(), edge_attr)
    assert explained.graph_count == 1, explained.break_reasons


@pytest.mark.parametrize("share_weights", [False, True])
def test_traced_gatv2_projects_its_input_in_one_product(share_weights):
    """Traced, GATv2Conv's maps of one input (lin_l, lin_r unless shared, res) are one product over
    their stacked weights (`kernels.auto.fuse_projections`): the traced graph holds one linear of x,
    and its outputs and the gradients of x, edge_attr and every parameter equal eager's (a product
    each); state dict unchanged."""
    torch.manual_seed(6)
    ours = GATv2Conv(N_SRC - 1, C, heads=2, edge_dim=EDGE_DIM, residual=True, share_weights=share_weights).double()
    keys = list(ours.state_dict())
    traced = []

    def record(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    compiled = torch.compile(ours, dynamic=True, backend=record)
    x, edge_attr, leaves = make_inputs(False, EDGE_DIM)
    named = {**leaves, **dict(ours.named_parameters())}
    (out_e, grads_e), (out_c, grads_c) = eager_and_compiled(ours, compiled, x, EDGE_INDEX, edge_attr, named)
    assert_close(out_c, out_e, torch.float64, "traced vs eager", "GATv2 output")
    assert sorted(grads_c) == sorted(grads_e)
    for name in grads_e:
        assert_close(grads_c[name], grads_e[name], torch.float64, f"traced d/d{name}", "GATv2 gradients")
    linears = [
        n for gm in traced for n in gm.graph.nodes
        if n.op == "call_function" and n.target in (torch._C._nn.linear, torch.nn.functional.linear)
    ]  # fmt: skip
    of_x = [n for n in linears if n.args[0].op == "placeholder" and n.args[0].name.startswith("l_x")]
    assert len(of_x) == 1, [str(n.args[0]) for n in linears]
    assert list(ours.state_dict()) == keys
