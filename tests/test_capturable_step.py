"""A training step as it runs on a GPU reads nothing back to the host once its tensors have been seen
(`graphs.memo`), so it can be captured in a CUDA graph (warm-up, then capture on the same tensors), and
a step on new tensors reads only in its first layer. Checked on the CPU by counting the ops that read
(`host_reads.HostReads`), with the decisions a GPU makes: the triton backend (in its interpreter here),
one graph per padded row (`kernels.auto.choose_packing`) and the structure built without host reads
(`graphs.structure.reading_stalls`). The capture itself runs in benchmarks/gpu_check.sh."""

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.graphs import structure
from sparseattn.nn import GATConv, GATv2Conv, GPSConv, TransformerConv

from .host_reads import HostReads

pytest.importorskip("triton", reason="triton is not importable (pip install triton)")

SIZES = [3, 5]  # small, and one head: the triton interpreter runs each program in Python


def _batch():
    """A batch of two small graphs (windows of radius 1): x (N, 16), edge_index, edge_attr (E, 3), batch."""
    torch.manual_seed(0)
    offsets = torch.tensor([0, *SIZES]).cumsum(0).tolist()
    edge_index = torch.cat([graphs.window(s, radius=1).edge_index + o for s, o in zip(SIZES, offsets)], dim=1)
    batch = torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))
    return torch.randn(batch.numel(), 16, requires_grad=True), edge_index, torch.randn(edge_index.shape[1], 3), batch


LAYERS = {
    "GPSConv(TransformerConv)": lambda: GPSConv(16, TransformerConv(16, 16, edge_dim=3, backend="triton"), heads=1),
    "GATConv": lambda: GATConv(16, 16, edge_dim=3, backend="triton"),
    "GATv2Conv": lambda: GATv2Conv(16, 16, edge_dim=3, backend="triton"),
}


def _forward(layers, x, edge_index, edge_attr, batch) -> torch.Tensor:
    h = x
    for layer in layers:
        gps = isinstance(layer, GPSConv)
        h = layer(h, edge_index, batch, edge_attr=edge_attr) if gps else layer(h, edge_index, edge_attr)
    return h


def _step(layers, x, edge_index, edge_attr, batch) -> None:
    _forward(layers, x, edge_index, edge_attr, batch).sum().backward()


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    import sparseattn.kernels.within_graphs as within_graphs

    monkeypatch.setattr(structure, "reading_stalls", lambda device: True)
    monkeypatch.setattr(within_graphs, "choose_packing", lambda device: False)


@pytest.mark.triton
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_step_on_tensors_seen_before_reads_nothing(name, as_on_a_gpu):
    x, edge_index, edge_attr, batch = _batch()
    layers = [LAYERS[name]() for _ in range(2)]
    _step(layers, x, edge_index, edge_attr, batch)  # the warm-up a capture makes first
    with HostReads() as reads:
        _step(layers, x, edge_index, edge_attr, batch)
    assert reads.ops == []


@pytest.mark.parametrize("edges", [300, 1 << 16])
def test_csr_on_a_raw_edge_index_reads_nothing_once_the_index_was_seen(edges, as_on_a_gpu):
    """csr (what a GPU runs for D > 256) given a raw edge_index builds its head-interleaved index in
    every call; for a pattern of at most _SMALL_SLOTS slots (H * E) it takes the edge count from the
    index's shape, not from the row pointers' last value, so a warm call reads nothing. A larger
    pattern walks its slots in chunks sized by reads (a Graph, built once, reads nothing there)."""
    from sparseattn.kernels.csr.index import _SMALL_SLOTS

    heads = 2
    n = 400
    edge_index = graphs.random(n, n, edges, seed=0).edge_index
    q, k, v = (torch.randn(n, heads, 8, requires_grad=True) for _ in range(3))
    edge_attention(q, k, v, edge_index, backend="csr").sum().backward()  # the ids checked, remembered
    with HostReads() as reads:
        edge_attention(q, k, v, edge_index, backend="csr").sum().backward()
    if edges * heads <= _SMALL_SLOTS:
        assert reads.ops == []
    else:
        assert reads.count > 0  # the chunked walk: documented, and what this test would notice changing
    graph = graphs.Graph(edge_index, n, n)
    edge_attention(q, k, v, graph, backend="csr").sum().backward()
    with HostReads() as reads:
        edge_attention(q, k, v, graph, backend="csr").sum().backward()
    assert reads.ops == []


# The reads of a step on new tensors, all in its first layer: the edge index's ids (one read for
# both rows) and whether it comes destination-major (one); GPSConv's batch vector checked and its
# graph count (one), its graph sizes (one); GAT's self-loop positions (nonzero).
NEW_TENSOR_READS = {"GPSConv(TransformerConv)": 4, "GATConv": 3, "GATv2Conv": 3}


@pytest.mark.triton
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_step_on_new_tensors_reads_in_its_first_layer_only(name, as_on_a_gpu):
    x, edge_index, edge_attr, batch = _batch()
    counts = []
    for depth in (1, 2):
        layers = [LAYERS[name]() for _ in range(depth)]
        with HostReads() as reads:
            _step(layers, x, edge_index.clone(), edge_attr, batch.clone())
        counts.append(reads.count)
    assert 0 < counts[0] <= NEW_TENSOR_READS[name] and counts[1] == counts[0], (counts, reads.ops)


@pytest.mark.parametrize("num_rows", [0, 1, 7, 300])
def test_counts_without_sync_are_bincounts(num_rows):
    rows = torch.randint(0, max(num_rows, 1), (0 if num_rows == 0 else 1000,))
    expected = torch.bincount(rows, minlength=num_rows)
    assert torch.equal(structure.counts_without_sync(rows, num_rows), expected)
    ptr = structure.row_pointers(rows, num_rows)
    torch.testing.assert_close(ptr[1:] - ptr[:-1], expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_sorted_id_counts_check_and_count_a_batch_vector_in_one_read(dtype, as_on_a_gpu):
    batch = torch.tensor([0, 0, 1, 3, 3, 3], dtype=dtype)
    with HostReads() as reads:
        counts = structure.sorted_id_counts(batch)
    assert reads.count == 1, reads.ops
    assert counts.tolist() == [2, 1, 0, 3]
    assert structure.sorted_id_counts(batch, 6).tolist() == [2, 1, 0, 3, 0, 0]  # trailing empty graphs kept
    assert structure.sorted_id_counts(batch, 2).tolist() == [2, 1, 0, 3]
    assert structure.sorted_id_counts(torch.tensor([1, 0], dtype=dtype)) is None  # unsorted
    assert structure.sorted_id_counts(torch.tensor([-1, 0], dtype=dtype)) is None  # a negative id


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU (gpu_check.sh runs this)")
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_step_captured_in_a_cuda_graph_replays_the_eager_step(name):
    x, edge_index, edge_attr, batch = (t.detach().cuda() for t in _batch())
    layers = torch.nn.ModuleList(LAYERS[name]() for _ in range(2)).cuda()
    params = list(layers.parameters())

    def step() -> torch.Tensor:
        for p in params:
            if p.grad is not None:
                p.grad.zero_()  # in place: the captured step keeps the gradients' addresses
        loss = _forward(layers, x, edge_index, edge_attr, batch).square().mean()
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.set_sync_debug_mode("error")  # a warm eager step: any host read raises, naming its op
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    expected, expected_grads = step(), [p.grad.clone() for p in params]
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, expected)
    for p, g in zip(params, expected_grads):
        torch.testing.assert_close(p.grad, g)
