"""Bad input raises a clear error that names the argument and the problem."""

import pytest
import torch

from sparseattn import EdgeAttention, Graph, edge_attention, graphs
from sparseattn.functional import check_arguments

Q, K, V = torch.randn(3, 2, 4), torch.randn(5, 2, 4), torch.randn(5, 2, 6)
EI = torch.tensor([[0, 4, 2], [0, 1, 2]])


@pytest.mark.parametrize(
    "graph, exc, pattern",
    [
        (torch.tensor([[0.0, 1.0], [0.0, 1.0]]), TypeError, "integer dtype"),
        ([[0, 1], [0, 1]], TypeError, r"graph must be a \(2, E\) tensor or a sparseattn.Graph, got list"),
        (torch.tensor([0, 1, 2]), ValueError, r"shape \(2, E\).*got shape \(3,\)"),
        (torch.zeros(3, 4, dtype=torch.long), ValueError, r"shape \(2, E\).*got shape \(3, 4\)"),
        (torch.tensor([[0, -1], [0, 1]]), IndexError, r"negative node id \(-1\)"),
        (torch.tensor([[0, 5], [0, 1]]), IndexError, "sources.*node id 5.*5 nodes"),
        (torch.tensor([[0, 1], [0, 3]]), IndexError, "destinations.*node id 3.*3 nodes"),
        (torch.tensor([[0, 9], [0, -2]]), IndexError, r"edge_index\[0\] \(sources\) contains node id 9"),
        (
            torch.tensor([[0, 1], [-2, 1]]),
            IndexError,
            r"edge_index\[1\] \(destinations\) contains a negative node id \(-2\)",
        ),
    ],
)
def test_bad_edge_index(graph, exc, pattern):
    with pytest.raises(exc, match=pattern):
        edge_attention(Q, K, V, graph)


def test_a_pyg_batch_with_an_id_beyond_num_nodes_names_the_row_and_num_nodes():
    """graphs.from_pyg checks both rows of data.edge_index in one read and names the row and the count."""
    pyg_data = pytest.importorskip("torch_geometric.data")
    data = pyg_data.Data(edge_index=torch.tensor([[0, 1], [1, 4]]), num_nodes=3)
    with pytest.raises(IndexError, match=r"data.edge_index\[1\] \(destinations\) contains node id 4.*num_nodes=5"):
        graphs.from_pyg(data)


@pytest.mark.parametrize(
    "q, k, v, exc, pattern",
    [
        (Q, K, torch.randn(5, 3, 6), ValueError, "same number of heads"),
        (Q, torch.randn(5, 2, 3), V, ValueError, "same head dim D"),
        (Q, K, torch.randn(4, 2, 6), ValueError, "same number of source nodes"),
        (Q.double(), K, V, TypeError, "share one dtype"),
        (Q[0], K, V, ValueError, "q must have 3 dimensions"),
        (Q.long(), K, V, TypeError, "q must be a floating-point"),
        ("q", K, V, TypeError, "q must be a torch.Tensor"),
    ],
)
def test_bad_qkv(q, k, v, exc, pattern):
    with pytest.raises(exc, match=pattern):
        edge_attention(q, k, v, EI)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(bias=torch.zeros(4, 2)), ValueError, r"bias must have shape \(E, H\) = \(3, 2\)"),
        (dict(bias=torch.zeros(3, 3)), ValueError, "bias must have shape"),
        (dict(bias=torch.zeros(3, dtype=torch.long)), TypeError, "bias must be a floating-point"),
        (dict(bias=[0.0, 0.0, 0.0]), TypeError, r"bias must be a torch.Tensor of shape \(E, H\) or \(E,\), got list"),
        (dict(bias=0.5), TypeError, "bias must be a torch.Tensor.*got float"),
        (dict(clamp=(5.0, -5.0)), ValueError, "lo <= hi.*lo=5.0 > hi=-5.0"),
        (dict(clamp=5.0), TypeError, "clamp must be None or a pair"),
        (dict(backend="fast"), ValueError, "unknown backend 'fast'; valid names are 'auto', 'reference'"),
        (dict(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
        (dict(scale=float("nan")), ValueError, "scale must be finite"),
        (dict(scale="x"), TypeError, "scale must be a float"),
    ],
)
def test_bad_options(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        edge_attention(Q, K, V, EI, **kwargs)
    with pytest.raises(exc, match=pattern):  # the argument checks alone (sharded calls run them before their exchange)
        check_arguments(Q, K, V, EI, **kwargs)


def test_argument_checks_pass_what_edge_attention_takes_and_name_unknown_keywords():
    check_arguments(Q, K, V, EI, bias=torch.zeros(3, 2), clamp=None, return_weights=True, backend="csr")
    with pytest.raises(TypeError, match="unexpected keyword arguments: clam, sclae"):
        check_arguments(Q, K, V, EI, clam=None, sclae=1.0)


def test_graph_node_counts_must_match_tensors():
    with pytest.raises(ValueError, match="num_src=6 but k and v have 5"):
        edge_attention(Q, K, V, Graph(EI, num_src=6, num_dst=3))
    with pytest.raises(ValueError, match="num_dst=4 but q has 3"):
        edge_attention(Q, K, V, Graph(EI, num_src=5, num_dst=4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA)")
def test_tensors_on_different_devices():
    with pytest.raises(ValueError, match="one device.*q on cuda"):
        edge_attention(Q.cuda(), K, V, EI)


def test_device_check_names_tensors():
    # the check itself, exercised without a GPU through meta tensors
    from sparseattn._checks import check_same_device

    with pytest.raises(ValueError, match="q on cpu, k on meta"):
        check_same_device(q=Q, k=K.to("meta"))


def test_graph_constructor_checks():
    with pytest.raises(ValueError, match="num_src must be a non-negative int"):
        Graph(EI, num_src=-1)
    with pytest.raises(IndexError, match="node id 4, out of range for 2 nodes"):
        Graph(EI, num_src=2)
    with pytest.raises(TypeError, match="node_mask must be a bool"):
        graphs.complete(3).dst_subgraph(torch.ones(3))
    with pytest.raises(ValueError, match=r"node_mask must have shape \(3,\)"):
        graphs.complete(3).dst_subgraph(torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="n must be >= 0"):
        graphs.complete(-1)
    with pytest.raises(TypeError, match=r"graphs\[1\] must be a sparseattn.Graph"):
        graphs.batch([graphs.complete(2), EI])


@pytest.mark.parametrize(
    "blocks, exc, pattern",
    [
        ([("full", -1, 2)], ValueError, r"blocks\[0\] n_src must be >= 0, got -1"),
        ([("full", 2, 2), ("causal", -3, -3)], ValueError, r"blocks\[1\] n_src must be >= 0, got -3"),
        ([("full", 2, -1)], ValueError, r"blocks\[0\] n_dst must be >= 0, got -1"),
        ([("full", 2.0, 2)], TypeError, r"blocks\[0\] n_src must be an int, got float"),
        ([("full", 2)], TypeError, r"blocks\[0\] must be a \(kind, n_src, n_dst\) triple, got \('full', 2\)"),
        ([("diagonal", 2, 2)], ValueError, r"blocks\[0\] kind must be one of \('full', .*got 'diagonal'"),
        ([("causal", 2, 3)], ValueError, r"blocks\[0\]: a 'causal' block must be square, got 2 x 3"),
    ],
)
def test_from_blocks_checks(blocks, exc, pattern):
    with pytest.raises(exc, match=pattern):
        graphs.from_blocks(blocks)


def test_module_checks():
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        EdgeAttention(10, 3)
    with pytest.raises(ValueError, match="unknown backend"):
        EdgeAttention(8, 2, backend="nope")
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        EdgeAttention(8, 2, dropout=1.5)
    m = EdgeAttention(8, 2)
    with pytest.raises(ValueError, match=r"x_dst must have shape \(N_dst, embed_dim=8\)"):
        m(torch.randn(3, 7), graphs.complete(3))
    with pytest.raises(TypeError, match="bias must be a torch.Tensor.*got list"):
        m(torch.randn(3, 8), graphs.complete(3), edge_bias=[0.0] * 9)


def test_missing_x_value_when_kdim_differs_from_vdim_says_to_pass_it():
    m2 = EdgeAttention(8, 2, kdim=4, vdim=6)
    with pytest.raises(ValueError, match="pass x_value= when kdim != vdim"):
        m2(torch.randn(3, 8), graphs.bipartite(2, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"x_value must have shape \(N_src=2, vdim=6\)"):
        m2(torch.randn(3, 8), graphs.bipartite(2, 3), torch.randn(2, 4), x_value=torch.randn(2, 5))  # a wrong one


def test_nan_and_inf_inputs_reach_only_touched_destinations():
    """Documented behaviour: non-finite inputs do not leak into unrelated destinations;
    in clamp mode an infinite score is clamped like any other."""
    ei = torch.tensor([[0, 1, 2], [0, 1, 1]])
    q = torch.randn(3, 1, 2)
    k = torch.randn(3, 1, 2)
    v = torch.randn(3, 1, 2)
    v_nan = v.clone()
    v_nan[0] = float("nan")
    out = edge_attention(q, k, v_nan, ei)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1:]).all()
    q_inf = q.clone()
    q_inf[1] = float("inf")  # scores of destination 1 become +-inf (or nan if a k entry is 0)
    k_pos = k.abs() + 0.1
    out = edge_attention(q_inf, k_pos, v, ei)
    expected = (v[1] + v[2]) / 2  # both scores +inf -> clamped to hi -> equal weights
    assert torch.allclose(out[1], expected)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


@pytest.mark.parametrize(
    "dtype, clamp, bound",
    [
        (torch.float32, (-89.0, 89.0), 65.0),  # exp(89) overflows float32: all-NaN output before this check
        (torch.float32, (-5.0, 66.0), 65.0),  # exp(66) is finite, but 2^32 of them are not
        (torch.float32, (-110.0, 5.0), 65.0),  # exp(-110) is 0 in float32: all-at-lo destinations got 0
        (torch.float32, (float("-inf"), 5.0), 65.0),
        (torch.float16, (-89.0, 89.0), 65.0),  # half types accumulate in float32
        (torch.bfloat16, (-66.0, 0.0), 65.0),
        (torch.float64, (-700.0, 700.0), 686.0),
    ],
)
def test_clamp_bounds_whose_exp_overflows_or_underflows(dtype, clamp, bound):
    q, k, v = (t.to(dtype) for t in (Q, K, V))
    name = str(dtype).replace("torch.", "")
    with pytest.raises(ValueError, match=rf"clamp=.*{name} inputs.*largest safe bound is {bound}"):
        edge_attention(q, k, v, EI, clamp=clamp)


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 65.0), (torch.float64, 686.0)])
def test_the_largest_safe_clamp_bounds_compute_correctly(dtype, bound):
    """At +-bound, 64 in-edges whose scores all sit at hi stay finite, and all at lo give the mean of v."""
    g = graphs.complete(64)
    q = torch.full((64, 1, 4), 1e3, dtype=dtype)  # scores +-1e6 * scale: far beyond either bound
    v = torch.randn(64, 1, 3, dtype=dtype)
    for k in (q, -q):
        out, w = edge_attention(q, k, v, g, clamp=(-bound, bound), return_weights=True)
        torch.testing.assert_close(out, v.mean(0).expand_as(out))
        torch.testing.assert_close(w, torch.full_like(w, 1 / 64))


def test_module_clamp_is_checked_at_construction_and_per_call_dtype():
    with pytest.raises(ValueError, match=r"clamp=\(-700.0, 700.0\).*largest safe bound is 686.0"):
        EdgeAttention(8, 2, clamp=(-700.0, 700.0))  # too wide for every dtype
    m = EdgeAttention(8, 2, clamp=(-89.0, 89.0))  # fine for float64, so only a call can tell
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"clamp=\(-89.0, 89.0\).*float32 inputs.*largest safe bound is 65.0"):
        m(x, graphs.complete(3))
    assert torch.isfinite(m.double()(x.double(), graphs.complete(3))).all()
