"""PyG interop: `graphs.from_pyg` on real torch_geometric Data/Batch objects, torch_geometric.EdgeIndex
wherever a (2, E) tensor goes, and the errors that point a PyG user to the fix."""

import types

import pytest
import torch

from sparseattn import EdgeAttention, Graph, edge_attention, graphs
from sparseattn.kernels import choose_auto
from tests.dense import dense_attention

pyg_data = pytest.importorskip("torch_geometric.data", reason="torch_geometric is a test dependency only")
pyg_utils = pytest.importorskip("torch_geometric.utils")
Data, Batch = pyg_data.Data, pyg_data.Batch


def complete_data(n, self_loops=True):
    """A complete graph as PyG lists it: source-major (sorted by edge_index[0])."""
    i = torch.arange(n)
    ei = torch.stack([i.repeat_interleave(n), i.repeat(n)])
    return Data(edge_index=ei if self_loops else ei[:, ei[0] != ei[1]], num_nodes=n)


def qkv(n, heads=2, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, d, generator=gen, dtype=torch.float64) for _ in range(3)]


def test_data_node_count_keeps_trailing_isolated_nodes():
    ei = torch.tensor([[0, 1, 3], [1, 2, 0]])
    assert Graph(ei).num_dst == 3  # guessed from the largest id: nodes 4 and 5 are lost
    g = graphs.from_pyg(Data(edge_index=ei, x=torch.randn(6, 3)))
    assert (g.num_src, g.num_dst, g.num_edges, g.num_graphs) == (6, 6, 3, 1)
    assert torch.equal(g.edge_index, ei)  # the data's edge order
    assert graphs.from_pyg(Data(edge_index=ei, num_nodes=7)).num_dst == 7
    assert graphs.from_pyg(Data(edge_index=ei, num_nodes=7), num_nodes=9).num_dst == 9
    q, k, v = qkv(6)
    out = edge_attention(q, k, v, g, clamp=None)
    assert torch.equal(out[4:], torch.zeros_like(out[4:]))  # isolated nodes get 0


def test_batch_records_graphs_and_matches_graph_by_graph():
    parts = [
        Data(edge_index=torch.tensor([[0, 2, 1], [1, 1, 0]]), num_nodes=4),  # node 3 isolated
        Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=0),  # an empty graph
        Data(edge_index=torch.tensor([[0, 1, 2, 2], [2, 2, 0, 1]]), num_nodes=3),
    ]
    b = Batch.from_data_list(parts)
    g = graphs.from_pyg(b)
    assert (g.num_src, g.num_dst, g.num_graphs) == (7, 7, 3)
    assert g.dst_ptr == g.src_ptr == tuple(b.ptr.tolist()) == (0, 4, 4, 7)
    assert [x.shape[0] for x in g.split_dst(torch.zeros(7))] == [4, 0, 3]
    # the same offsets from the batch vector alone (num_graphs keeps a trailing empty graph)
    bare = types.SimpleNamespace(edge_index=b.edge_index, num_nodes=7, batch=b.batch, num_graphs=3)
    assert graphs.from_pyg(bare).dst_ptr == (0, 4, 4, 7)
    q, k, v = qkv(7)
    out = edge_attention(q, k, v, g, clamp=None)
    for piece, data, qs, ks, vs in zip(g.split_dst(out), parts, g.split_dst(q), g.split_src(k), g.split_src(v)):
        assert torch.allclose(piece, edge_attention(qs, ks, vs, data.edge_index, clamp=None), atol=1e-12)


@pytest.mark.parametrize("self_loops", [True, False])
def test_complete_block_batches_take_the_dense_backend(self_loops):
    b = Batch.from_data_list([complete_data(n, self_loops) for n in (5, 8, 5)])
    edge_attr = torch.randn(b.num_edges, 2, dtype=torch.float64)
    # PyG lists edges source-major: kept as given (edge_attr still lines up), so no blocks
    as_given = graphs.from_pyg(b)
    assert as_given.blocks is None and torch.equal(as_given.edge_index, b.edge_index)
    # sorted destination-major (edge_attr along), each graph is one recorded block
    ei, attr = pyg_utils.sort_edge_index(b.edge_index, edge_attr, num_nodes=b.num_nodes, sort_by_row=False)
    g = graphs.from_pyg(Data(edge_index=ei, num_nodes=b.num_nodes, ptr=b.ptr))
    kind = "full" if self_loops else "full_no_self"
    assert [(blk.kind, blk.n_dst) for blk in g.blocks] == [(kind, 5), (kind, 8), (kind, 5)]
    assert g.num_graphs == 3 and g.dst_ptr == (0, 5, 13, 18)
    q, k, v = qkv(18)
    if self_loops:  # unpadded buckets of complete blocks (5 x 5 twice, 8 x 8)
        assert choose_auto(torch.zeros(1, 64, 64), g) == "dense"  # heads wide enough not to be "small"
    ref = dense_attention(q, k, v, b.edge_index, clamp=None)
    for graph, bias in ((g, attr), (as_given, edge_attr)):
        for backend in ("dense", "csr") if graph is g else ("csr",):
            assert torch.allclose(edge_attention(q, k, v, graph, clamp=None, backend=backend), ref, atol=1e-12)
            biased = edge_attention(q, k, v, graph, clamp=None, bias=bias, backend=backend)
            assert torch.allclose(biased, edge_attention(q, k, v, b.edge_index, clamp=None, bias=edge_attr))


@pytest.mark.parametrize("kind", ["full", "full_no_self", "causal", "causal_no_self"])
def test_every_block_kind_is_recognized_in_a_batch(kind):
    """from_pyg records the blocks of a batch whose graphs are each one block of `kind` listed
    destination-major (an empty graph among them), and none once one edge is missing."""
    built = graphs.from_blocks([(kind, n, n) for n in (3, 4, 1)])
    ptr = torch.tensor([0, 3, 3, 7, 8])
    g = graphs.from_pyg(Data(edge_index=built.edge_index, num_nodes=8, ptr=ptr))
    assert g.blocks is not None and [(b.kind, b.n_dst) for b in g.blocks] == [(kind, 3), (kind, 4), (kind, 1)]
    assert torch.equal(g.edge_index, built.edge_index)
    fewer = graphs.from_pyg(Data(edge_index=built.edge_index[:, 1:], num_nodes=8, ptr=ptr))
    assert fewer.blocks is None


def test_self_loops_are_appended_for_nodes_without_one():
    ei = torch.tensor([[0, 2, 1], [1, 2, 0]])  # node 2 has a loop; 0, 1 and isolated 3 have none
    g = graphs.from_pyg(Data(edge_index=ei, num_nodes=4), self_loops=True)
    assert g.edge_index.tolist() == [[0, 2, 1, 0, 1, 3], [1, 2, 0, 0, 1, 3]]
    # a complete graph with loops gains none and keeps its block
    g = graphs.from_pyg(Data(edge_index=graphs.complete(4).edge_index, num_nodes=4), self_loops=True)
    assert g.num_edges == 16 and g.blocks is not None


def test_edge_index_subclass_is_a_plain_tensor_everywhere():
    edge_index_cls = pytest.importorskip("torch_geometric").EdgeIndex
    plain = torch.tensor([[0, 2, 1, 3, 0], [1, 1, 0, 2, 3]])
    ei = edge_index_cls(plain.int(), sparse_size=(5, 6))
    q, k, v = qkv(6)[0], qkv(5)[1], qkv(5)[2]
    out = edge_attention(q, k, v, ei)
    assert type(out) is torch.Tensor and torch.equal(out, edge_attention(q, k, v, plain))
    g = Graph(ei)  # node counts from the EdgeIndex's sparse size
    assert (g.num_src, g.num_dst) == (5, 6) and type(g.edge_index) is torch.Tensor
    assert g.edge_index.dtype == torch.long and torch.equal(g.edge_index, plain)
    assert Graph(edge_index_cls(plain)).num_dst == 4  # no sparse size: counted as for a tensor
    attn = EdgeAttention(8, 2).double()
    x_dst, x_src = torch.randn(6, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    assert torch.equal(attn(x_dst, ei, x_src), attn(x_dst, plain, x_src))
    rows = torch.tensor([1, 2])
    assert torch.equal(attn(x_dst[rows], ei, x_src, dst_rows=rows), attn(x_dst[rows], plain, x_src, dst_rows=rows))
    data = Data(edge_index=edge_index_cls(plain, sparse_size=(6, 6)), num_nodes=6)
    assert torch.equal(graphs.from_pyg(data).edge_index, plain)


def test_errors_name_the_fix():
    data = Data(edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    q, k, v = qkv(3)
    with pytest.raises(TypeError, match=r"got Data: convert .* sparseattn\.graphs\.from_pyg\(data\)"):
        edge_attention(q, k, v, data)
    with pytest.raises(TypeError, match=r"sparseattn\.graphs\.from_pyg"):
        EdgeAttention(8, 2)(torch.randn(3, 8), data)
    with pytest.raises(TypeError, match=r"got Data: convert .*graphs\.from_pyg"):
        Graph(data)
    adj_only = Data(adj_t=torch.eye(3).to_sparse(), num_nodes=3)
    with pytest.raises(TypeError, match="holds only adj_t"):
        graphs.from_pyg(adj_only)
    hetero = pyg_data.HeteroData()
    hetero["a"].x = torch.randn(3, 2)
    hetero["a", "to", "a"].edge_index = torch.tensor([[0], [1]])
    with pytest.raises(TypeError, match="HeteroData.*to_homogeneous"):
        graphs.from_pyg(hetero)
    with pytest.raises(TypeError, match=r"plain tensor use sparseattn\.Graph"):
        graphs.from_pyg(data.edge_index)
    with pytest.raises(ValueError, match=r"no num_nodes, no x.*num_nodes=N"):
        graphs.from_pyg(types.SimpleNamespace(edge_index=data.edge_index))
    with pytest.raises(IndexError, match=r"node id 2, out of range for 2 nodes \(num_nodes=2: pass num_nodes=3"):
        graphs.from_pyg(data, num_nodes=2)
    with pytest.raises(ValueError, match=r"data.ptr must be non-decreasing from 0 to num_nodes=3"):
        graphs.from_pyg(types.SimpleNamespace(edge_index=data.edge_index, num_nodes=3, ptr=torch.tensor([0, 2])))
    with pytest.raises(ValueError, match="data.batch must hold graph ids >= 0 in non-decreasing order"):
        graphs.from_pyg(types.SimpleNamespace(edge_index=data.edge_index, num_nodes=3, batch=torch.tensor([1, 0, 1])))


def test_node_count_errors_name_num_src_and_num_dst():
    ei = torch.tensor([[0, 3], [1, 2]])
    with pytest.raises(IndexError, match=r"node id 3, out of range for 2 nodes \(num_src=2: pass num_src=4 or more\)"):
        Graph(ei, num_src=2)
    with pytest.raises(IndexError, match=r"destinations\) contains node id 2.*\(num_dst=2: pass num_dst=3"):
        Graph(ei, num_dst=2)
    q, k, v = torch.randn(3, 2, 4), torch.randn(6, 2, 4), torch.randn(6, 2, 4)
    with pytest.raises(
        ValueError, match=r"num_src=4 but k and v have 6 rows.*Graph\(edge_index, num_src=6, num_dst=3\)"
    ):
        edge_attention(q, k, v, Graph(ei))
