"""sparseattn.nn.GlobalAttention against GraphGPS's global attention: pad each graph of the batch
(`to_dense_batch`), run nn.MultiheadAttention with a key padding mask, keep the real rows."""

from typing import Tuple

import pytest
import torch
from torch import nn

import sparseattn
from sparseattn.kernels import choose_auto
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


# a few sizes (the dense path's case) and many sizes (padded buckets: csr)
@pytest.mark.parametrize("sizes,auto_choice", [([3, 8, 1, 3, 8], "dense"), ([3, 9, 1, 5, 7, 2, 8], "csr")])
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
    assert torch.equal(ours(x, graph=complete_per_graph(ptr=ptr)), by_batch)
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
