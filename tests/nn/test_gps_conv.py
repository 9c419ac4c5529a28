"""sparseattn.nn.GPSConv against torch_geometric.nn.GPSConv (same state dict, float64): outputs,
gradients and norm statistics over conv (none, PyG's GINConv, our TransformerConv and GATConv),
batch (one graph, graphs of different sizes) and norm; and PyG's own GPSConv with our
GlobalAttention swapped in for its nn.MultiheadAttention."""

import copy
import sys
from typing import Optional

import pytest
import torch
from torch import nn

from sparseattn.nn import GATConv, GlobalAttention, GPSConv, TransformerConv

from ..optional import needs_module
from .helpers import assert_close, grads_of

C, HEADS = 12, 3
SIZES = [5, 9, 1, 7]  # graphs of different sizes, a single-node one among them


def make_conv(kind: str) -> Optional[nn.Module]:
    """The local message passing layer of a case, (x, edge_index) -> (N, C)."""
    if kind == "none":
        return None
    if kind == "gin":
        from torch_geometric.nn import GINConv

        return GINConv(nn.Sequential(nn.Linear(C, C), nn.ReLU(), nn.Linear(C, C)))
    if kind == "transformer":
        return TransformerConv(C, C // HEADS, heads=HEADS)
    return GATConv(C, C // HEADS, heads=HEADS)


def make_pair(conv: str, norm: Optional[str], **options):
    """PyG's GPSConv with every parameter (norms' included) drawn from U(-0.7, 0.7), float64, and
    ours with its state dict loaded."""
    from torch_geometric.nn import GPSConv as PyGGPSConv

    local = make_conv(conv)
    pyg = PyGGPSConv(C, local, heads=HEADS, norm=norm, **options).double()
    with torch.no_grad():
        for p in pyg.parameters():
            p.uniform_(-0.7, 0.7)
    ours = GPSConv(C, copy.deepcopy(local), heads=HEADS, norm=norm, **options).double()
    ours.load_state_dict(pyg.state_dict())
    return pyg, ours


def inputs(sizes: Optional[list]):
    """x (N, C) float64 requiring grad, a random edge_index within each graph, and batch (N,) or None."""
    torch.manual_seed(0)
    counts = sizes or [15]
    edges, start = [], 0
    for n in counts:
        edges.append(torch.randint(start, start + n, (2, 3 * n)))
        start += n
    x = torch.randn(start, C, dtype=torch.float64, requires_grad=True)
    batch = None if sizes is None else torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, torch.cat(edges, dim=1), batch


def assert_same_run(pyg: nn.Module, ours: nn.Module, sizes: Optional[list], what: str) -> None:
    """Outputs and gradients (x and every parameter) of the two layers on the same input agree."""
    x, edge_index, batch = inputs(sizes)
    expected = pyg(x, edge_index, batch)
    got = ours(x, edge_index, batch)
    assert_close(got, expected, torch.float64, f"{what}: output", f"{what}: output")
    w = torch.randn_like(expected)
    g_ref = grads_of((expected * w).sum(), {"x": x, **dict(pyg.named_parameters())})
    g_got = grads_of((got * w).sum(), {"x": x, **dict(ours.named_parameters())})
    assert g_ref.keys() == g_got.keys()
    for name in g_ref:
        assert_close(g_got[name], g_ref[name], torch.float64, f"{what}: grad of {name}", f"{what}: grads")


@needs_module("torch_geometric")
@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", "graph_norm", None])
@pytest.mark.parametrize("sizes", [None, SIZES], ids=["one-graph", "batch"])
@pytest.mark.parametrize("conv", ["none", "gin", "transformer", "gat"])
def test_matches_pyg_gps_conv_in_eval_and_training(conv, sizes, norm):
    pyg, ours = make_pair(conv, norm)
    assert ours.norm_with_batch == pyg.norm_with_batch == (norm in ("layer_norm", "graph_norm"))
    pyg.eval(), ours.eval()
    assert_same_run(pyg, ours, sizes, "GPSConv vs PyG (eval)")
    pyg.train(), ours.train()  # dropout 0: batch norm's batch statistics, and its running ones updated
    assert_same_run(pyg, ours, sizes, "GPSConv vs PyG (train)")
    for key, value in pyg.state_dict().items():
        assert_close(ours.state_dict()[key].double(), value.double(), torch.float64, key, "GPSConv vs PyG: buffers")


@needs_module("torch_geometric")
@pytest.mark.parametrize("backend", ["auto", "csr"])
def test_attention_backends_and_attention_options_match_pyg(backend):
    """The graph path (csr) and the padded one (auto on small graphs) alike, with an MLP activation
    given with its kwargs and attention without biases."""
    options = dict(act="leaky_relu", act_kwargs={"negative_slope": 0.3}, attn_kwargs={"bias": False})
    pyg, ours = make_pair("gin", "layer_norm", **options)
    ours.attn.backend = backend
    pyg.eval(), ours.eval()
    assert_same_run(pyg, ours, SIZES, "GPSConv vs PyG (eval)")


@needs_module("torch_geometric")
def test_state_dict_loads_both_ways_and_init_matches_pyg():
    from torch_geometric.nn import GPSConv as PyGGPSConv

    torch.manual_seed(3)
    pyg = PyGGPSConv(C, None, heads=HEADS, norm="graph_norm")
    torch.manual_seed(3)
    ours = GPSConv(C, None, heads=HEADS, norm="graph_norm")
    assert list(ours.state_dict()) == list(pyg.state_dict())
    for key, value in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key  # same init order, same values
    assert [name for name, _ in ours.named_children()] == [name for name, _ in pyg.named_children()]
    PyGGPSConv(C, None, heads=HEADS, norm="graph_norm").load_state_dict(ours.state_dict())
    assert isinstance(ours.attn, GlobalAttention) and repr(ours) == repr(pyg)
    ours.reset_parameters()


def test_bad_attn_type_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="attn_type must be 'multihead'.*or 'performer'.*got 'bigbird'"):
        GPSConv(C, None, heads=HEADS, norm=None, attn_type="bigbird")


PERFORMER_OPTIONS = [{}, {"head_channels": None, "qkv_bias": True, "attn_out_bias": False}, {"kernel": nn.GELU()}]


@needs_module("torch_geometric")
@pytest.mark.parametrize("options", PERFORMER_OPTIONS, ids=["default", "biases", "gelu"])
@pytest.mark.parametrize("sizes", [None, SIZES], ids=["one-graph", "batch"])
@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", None])
def test_performer_matches_pyg_gps_conv(norm, sizes, options):
    """attn_type="performer": outputs and gradients (x, every parameter) equal PyG's, whose normalizer
    also counts the padded key slots of to_dense_batch (graphs of 5, 9, 1 and 7 nodes: L = 9)."""
    pyg, ours = make_pair("gin", norm, attn_type="performer", attn_kwargs=options)
    assert torch.equal(ours.attn.fast_attn.projection_matrix, pyg.attn.fast_attn.projection_matrix)
    pyg.eval(), ours.eval()
    assert_same_run(pyg, ours, sizes, "performer GPSConv vs PyG (eval)")
    pyg.train(), ours.train()
    assert_same_run(pyg, ours, sizes, "performer GPSConv vs PyG (train)")


@needs_module("torch_geometric")
def test_performer_padding_and_pygs_padded_call():
    """The padded slots count as PyG counts them: a graph's output changes with the batch's largest
    graph (as PyG's); PyG's own call (x (B, L, C), mask) equals PyG's PerformerAttention; a NaN in one
    graph reaches its rows only; an empty graph id in the middle, an empty batch and wrong inputs."""
    from torch_geometric.nn.attention import PerformerAttention as PyGPerformer
    from torch_geometric.utils import to_dense_batch

    from sparseattn.nn.performer import PerformerAttention

    torch.manual_seed(1)
    theirs = PyGPerformer(C, HEADS, head_channels=5).double()
    ours = PerformerAttention(C, HEADS, head_channels=5).double()
    assert list(ours.state_dict()) == list(theirs.state_dict()) and repr(ours) == repr(theirs)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(13, C, dtype=torch.float64)
    batch = torch.tensor([0] * 4 + [2] * 9)  # graph 1 has no node: a row of padding
    dense, mask = to_dense_batch(x, batch)
    assert_close(ours(dense, mask=mask), theirs(dense, mask=mask), torch.float64, "padded call", "performer")
    assert_close(ours(dense), theirs(dense), torch.float64, "padded call, no mask", "performer")
    expected = theirs(dense, mask=mask)[mask]
    assert_close(ours(x, batch), expected, torch.float64, "(N, C) call", "performer")
    alone = ours(x[:4])  # the first graph without the 9-node one: no padding in its normalizer
    assert not torch.allclose(alone, expected[:4])
    assert_close(alone, theirs(x[:4].unsqueeze(0)).squeeze(0), torch.float64, "one graph", "performer")
    assert ours(x[:0], batch[:0]).shape == (0, C)
    poisoned = x.clone()
    poisoned[1, 3] = float("nan")  # in graph 0: its rows only
    out = ours(poisoned, batch)
    assert out[:4].isnan().all() and out[4:].isfinite().all()
    assert torch.equal(out[4:], ours(x, batch)[4:])
    with pytest.raises(ValueError, match="sorted"):
        ours(x, batch.flip(0))
    with pytest.raises(ValueError, match=r"mask must be a bool tensor \(3, 9\)"):
        ours(dense, mask=mask.double())
    with pytest.raises(ValueError, match="takes mask=, not batch"):
        ours(dense, batch)
    old = ours.fast_attn.projection_matrix.clone()
    ours.redraw_projection_matrix()
    new = ours.fast_attn.projection_matrix
    assert new.dtype == torch.float64 and not torch.equal(new, old)
    block = new[: ours.fast_attn.num_cols]  # orthonormal rows within a block (drawn in float32)
    torch.testing.assert_close(block @ block.t(), torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-6)


@needs_module("torch_geometric")
def test_performer_init_and_state_dict_equal_pygs():
    from torch_geometric.nn import GPSConv as PyGGPSConv

    torch.manual_seed(4)
    pyg = PyGGPSConv(C, None, heads=HEADS, norm=None, attn_type="performer")
    torch.manual_seed(4)
    ours = GPSConv(C, None, heads=HEADS, norm=None, attn_type="performer")
    assert list(ours.state_dict()) == list(pyg.state_dict())
    for key, value in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key  # same draws in the same order
    assert repr(ours) == repr(pyg)
    PyGGPSConv(C, None, heads=HEADS, norm=None, attn_type="performer").load_state_dict(ours.state_dict())
    before = ours.attn.fast_attn.projection_matrix.clone()
    ours.reset_parameters()
    assert not torch.equal(ours.attn.fast_attn.projection_matrix, before)


def test_without_torch_geometric_names_resolve_in_torch_or_ask_for_the_extra(monkeypatch):
    """Activations resolve among torch.nn's; PyG's norm layers need PyG: an ImportError naming the extra."""
    for name in [m for m in sys.modules if m == "torch_geometric" or m.startswith("torch_geometric.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "torch_geometric", None)
    layer = GPSConv(C, None, heads=HEADS, act="leaky_relu", act_kwargs={"negative_slope": 0.3}, norm=None)
    assert isinstance(layer.mlp[1], nn.LeakyReLU) and layer.mlp[1].negative_slope == 0.3
    assert layer(torch.randn(6, C), None, torch.tensor([0, 0, 1, 1, 1, 2])).shape == (6, C)
    with pytest.raises(ImportError, match=r"norm='batch_norm'.*sparseattn\[examples\]"):
        GPSConv(C, None, heads=HEADS)
    with pytest.raises(ValueError, match="act='nope'"):
        GPSConv(C, None, heads=HEADS, act="nope", norm=None)


@needs_module("torch_geometric")
@pytest.mark.parametrize("sizes", [None, SIZES], ids=["one-graph", "batch"])
def test_our_attention_inside_pygs_gps_conv_equals_its_multihead_attention(sizes):
    """PyG's GPSConv runs its attention only if `isinstance(self.attn, nn.MultiheadAttention)`: before
    GlobalAttention subclassed it, swapping ours in switched attention off without an error. Now PyG
    calls it as MHA (padded, key_padding_mask) and the layer gives MHA's output and gradients."""
    from torch_geometric.nn import GINConv
    from torch_geometric.nn import GPSConv as PyGGPSConv

    local = GINConv(nn.Sequential(nn.Linear(C, C), nn.ReLU(), nn.Linear(C, C)))
    pyg = PyGGPSConv(C, local, heads=HEADS, norm="layer_norm").double()
    with torch.no_grad():
        for p in pyg.parameters():
            p.uniform_(-0.7, 0.7)
    swapped = copy.deepcopy(pyg)
    swapped.attn = GlobalAttention(C, HEADS, batch_first=True).double()
    swapped.attn.load_state_dict(pyg.attn.state_dict())
    pyg.eval(), swapped.eval()
    assert_same_run(pyg, swapped, sizes, "PyG GPSConv, GlobalAttention vs MHA")
    pyg.train(), swapped.train()
    assert_same_run(pyg, swapped, sizes, "PyG GPSConv, GlobalAttention vs MHA")
    swapped.reset_parameters()  # PyG's reset calls attn._reset_parameters(), MHA's


@needs_module("torch_geometric")
def test_our_attention_in_pygs_gps_conv_with_the_wrong_layout_fails_loudly():
    """batch_first=False (MHA's default, and ours) reads PyG's (B, L, C) as (L, B, C): the key
    padding mask's shape then disagrees, a ValueError, never a silently wrong output."""
    from torch_geometric.nn import GPSConv as PyGGPSConv

    pyg = PyGGPSConv(C, None, heads=HEADS, norm=None)
    pyg.attn = GlobalAttention(C, HEADS)
    x, _, batch = inputs(SIZES)
    with pytest.raises(ValueError, match="key_padding_mask must be a bool tensor"):
        pyg(x.float(), None, batch)


def test_torch_jit_script_fails_in_one_line_naming_torch_compile():
    with pytest.raises(RuntimeError, match=r"^sparseattn\.nn\.GPSConv does not support torch\.jit\.script"):
        torch.jit.script(GPSConv(C, None, heads=HEADS, norm=None))


def test_compiled_with_dynamic_shapes_equals_eager_and_builds_the_graph_outside_the_trace():
    """torch.compile(dynamic=True) of a GPSConv stack: outputs and gradients equal eager's on batches
    of two sizes (eval: batch norm's running statistics would change between the two runs); each
    global attention's per-graph complete graph is built eagerly, the one reason the trace breaks
    (torch._dynamo.explain: 2 breaks, 7 when the batch vector's host reads were traced)."""
    torch.manual_seed(0)
    model = nn.ModuleList(GPSConv(16, TransformerConv(16, 4, heads=4), heads=4) for _ in range(2)).double().eval()

    def run(x, edge_index, batch):
        for layer in model:
            x = layer(x, edge_index, batch)
        return x

    compiled = torch.compile(run, dynamic=True)
    for sizes in ([3, 5, 4], [6, 2, 7, 3]):
        batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        n = batch.numel()
        edge_index = torch.stack([torch.arange(n), torch.arange(n).roll(1)])
        x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
        eager, comp = run(x, edge_index, batch), compiled(x, edge_index, batch)
        assert_close(comp, eager, torch.float64, "compiled vs eager")
        grad = torch.randn_like(eager)
        for a, b in zip(torch.autograd.grad(comp, [x, *model.parameters()], grad),
                        torch.autograd.grad(eager, [x, *model.parameters()], grad)):  # fmt: skip
            assert_close(a, b, torch.float64, "compiled vs eager gradient")
    torch._dynamo.reset()
    batch = torch.tensor([0, 0, 1, 1, 1])
    explained = torch._dynamo.explain(GlobalAttention(16, 4))(torch.randn(5, 16), batch)
    assert explained.graph_break_count <= 2
    for reason in explained.break_reasons:  # only where the graph is built (eagerly)
        assert reason.user_stack[-1].filename.endswith("within_graphs.py"), reason.reason


def test_performer_compiles_over_new_batch_sizes():
    """Under torch.compile(dynamic=True) the performer's padded layout (host reads of the batch's
    sizes) runs eagerly as one call; outputs and input gradients equal eager's over three batches."""
    from sparseattn.nn.performer import PerformerAttention

    torch.manual_seed(7)
    attn = PerformerAttention(C, HEADS, head_channels=4).double()
    compiled = torch.compile(attn, dynamic=True, backend="aot_eager")
    for sizes in ([3, 5], [4, 1, 6], [2, 2, 2, 7]):
        batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        x = torch.randn(sum(sizes), C, dtype=torch.float64, requires_grad=True)
        eager, traced = attn(x, batch), compiled(x, batch)
        assert_close(traced, eager, torch.float64, "compiled performer", "performer")
        w = torch.randn_like(eager)
        (g_e,) = torch.autograd.grad((eager * w).sum(), x)
        (g_c,) = torch.autograd.grad((traced * w).sum(), x)
        assert_close(g_c, g_e, torch.float64, "compiled performer d/dx", "performer")
