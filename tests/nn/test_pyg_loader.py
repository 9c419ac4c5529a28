"""The PyG DataLoader recipe of docs/guide/nn.md: per batch, one `from_pyg` graph and one
`complete_per_graph` global graph, passed to every layer; equal to running each graph alone,
with a single-node graph (no edges) last in a batch."""

import pytest
import torch
from torch import nn

from sparseattn import Graph, graphs
from sparseattn import nn as snn

from .helpers import assert_close

pyg_data = pytest.importorskip("torch_geometric.data", reason="torch_geometric is a test dependency only")
pyg_loader = pytest.importorskip("torch_geometric.loader")

DIM, HEADS = 8, 2


class GPSLayer(nn.Module):
    """A GraphGPS-style layer: local TransformerConv over the edges plus global attention within each graph."""

    def __init__(self) -> None:
        super().__init__()
        self.local = snn.TransformerConv(DIM, DIM // HEADS, heads=HEADS, edge_dim=2)
        self.glob = snn.GlobalAttention(DIM, HEADS)

    def forward(self, h, graph, edge_attr, global_graph):
        return h + self.local(h, graph, edge_attr) + self.glob(h, graph=global_graph)


def molecules():
    """Five small graphs; the third and the last have a single node and no edge."""
    gen = torch.Generator().manual_seed(0)
    sizes_edges = [(4, [[0, 1, 2, 3], [1, 2, 3, 0]]), (3, [[0, 1], [2, 2]]), (1, [[], []]), (5, [[0, 4, 2], [4, 0, 1]])]
    sizes_edges.append((1, [[], []]))
    out = []
    for n, ei in sizes_edges:
        edge_index = torch.tensor(ei, dtype=torch.long).view(2, -1)
        x = torch.randn(n, DIM, generator=gen, dtype=torch.float64)
        edge_attr = torch.randn(edge_index.shape[1], 2, generator=gen, dtype=torch.float64)
        out.append(pyg_data.Data(x=x, edge_index=edge_index, edge_attr=edge_attr))
    return out


def run(layers, data, graph, global_graph):
    h = data.x
    for layer in layers:
        h = layer(h, graph, data.edge_attr, global_graph)
    return h


def test_dataloader_recipe_equals_each_graph_alone():
    torch.manual_seed(0)
    layers = nn.ModuleList(GPSLayer() for _ in range(2)).double().eval()
    dataset = molecules()
    outs = []
    for data in pyg_loader.DataLoader(dataset, batch_size=2):  # the last batch is one single-node graph
        graph = graphs.from_pyg(data)  # once per batch: node count from the batch, graph ranges from ptr
        global_graph = snn.complete_per_graph(ptr=data.ptr)  # once per batch, shared by every layer
        outs.append(run(layers, data, graph, global_graph))
    for data in pyg_loader.DataLoader(dataset, batch_size=3):  # the second batch ends with a single node
        if data.num_graphs == 2:
            # without node counts the index guesses N from the largest id and loses the last node
            assert Graph(data.edge_index).num_dst < data.num_nodes
        outs.append(run(layers, data, graphs.from_pyg(data), snn.complete_per_graph(ptr=data.ptr)))
    alone = torch.cat(
        [run(layers, d, graphs.from_pyg(d), snn.complete_per_graph(num_nodes=d.num_nodes)) for d in dataset]
    )
    assert_close(torch.cat(outs[:3]), alone, torch.float64, "DataLoader batches vs each graph alone")
    assert_close(torch.cat(outs[3:]), alone, torch.float64, "DataLoader batches vs each graph alone")
