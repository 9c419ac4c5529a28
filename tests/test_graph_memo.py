"""graphs.memo: what the first layer of a model checks and plans about the raw edge_index and batch
vector it is given is reused by the layers after it (no device reads of theirs), forgotten when the
tensor is edited in place, and never keeps the tensor alive."""

import gc
import weakref

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.graphs import memo
from sparseattn.nn import GATConv, GlobalAttention, TransformerConv

from .host_reads import HostReads


def test_recall_computes_once_per_tensor_and_version():
    t, calls = torch.arange(6), []

    def compute():
        calls.append(1)
        return len(calls)

    assert memo.recall(t, "k", compute) == 1
    assert memo.recall(t, "k", compute) == 1  # remembered
    assert memo.recall(t, "other", compute) == 2  # another key
    assert memo.recall(t.clone(), "k", compute) == 3  # another tensor, equal values
    t.add_(1)  # an in-place edit forgets what was known
    assert memo.recall(t, "k", compute) == 4
    with torch.inference_mode():
        frozen = torch.arange(3)
    assert memo.recall(frozen, "k", compute) == 5 and memo.recall(frozen, "k", compute) == 6  # no version counter


def test_a_failed_check_is_not_remembered():
    ids = torch.tensor([[0, 5], [1, 1]])
    q = torch.randn(2, 1, 4)
    for _ in range(2):  # the second call raises again
        try:
            edge_attention(q, q, q, ids)
        except IndexError as e:
            assert "edge_index[0] (sources) contains node id 5" in str(e)
        else:
            raise AssertionError("an out-of-range id was accepted")


def test_an_edited_edge_index_is_checked_again():
    """Before the memo an in-place edit was seen by the next call; it still is."""
    ids = torch.tensor([[0, 1], [1, 0]])
    q = torch.randn(2, 1, 4)
    edge_attention(q, q, q, ids)
    ids[0, 0] = 7
    try:
        edge_attention(q, q, q, ids)
    except IndexError:
        pass
    else:
        raise AssertionError("the edited index was not checked again")


def test_the_memo_does_not_keep_a_tensor_alive():
    ids = graphs.random(50, 50, 200, seed=0).edge_index.clone()
    batch = torch.repeat_interleave(torch.arange(5), 10)
    q = torch.randn(50, 2, 8)
    edge_attention(q, q, q, ids)
    GlobalAttention(16, 2)(q.reshape(50, 16), batch)
    GATConv(16, 4)(q.reshape(50, 16), ids)  # its self-looped index, remembered per edge_index too
    alive = [weakref.ref(ids), weakref.ref(batch)]
    del ids, batch
    gc.collect()
    assert [r() for r in alive] == [None, None]


def _model_step(layers: int, x, edge_index, edge_attr, batch) -> int:
    """Host reads of one forward+backward of `layers` x (TransformerConv(edge_dim) + GlobalAttention)."""
    torch.manual_seed(0)
    convs = [TransformerConv(16, 4, heads=4, edge_dim=3) for _ in range(layers)]
    attns = [GlobalAttention(16, 4) for _ in range(layers)]
    with HostReads() as reads:
        h = x
        for conv, attn in zip(convs, attns):
            h = conv(h, edge_index, edge_attr) + attn(h, batch)
        h.sum().backward()
    return reads.count


@pytest.mark.parametrize("packing", [False, True])
def test_host_reads_of_a_step_do_not_grow_with_the_layers(packing, monkeypatch):
    """A mini-batch of small graphs (the "small" backend) given as PyG gives it, a raw edge_index and a
    batch vector to every layer: the first layer checks and plans them, the others read nothing back,
    as on a GPU (one graph per padded row). Where the global attention packs several graphs into a
    row (the CPU), each call checks its result, forward and backward: two reads per layer more."""
    import sparseattn.kernels.within_graphs as within_graphs

    monkeypatch.setattr(within_graphs, "choose_packing", lambda device: packing)
    sizes = [5, 9, 7, 12]
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    n = batch.numel()
    edge_index = torch.cat([graphs.window(s, radius=1).edge_index + o for s, o in zip(sizes, [0, 5, 14, 21])], dim=1)
    x, edge_attr = torch.randn(n, 16, requires_grad=True), torch.randn(edge_index.shape[1], 3)
    one, three = (_model_step(layers, x, edge_index.clone(), edge_attr, batch.clone()) for layers in (1, 3))
    assert one > 0  # the first layer's checks do read
    assert three == one + (2 * 2 if packing else 0)
