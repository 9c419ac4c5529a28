import random

import numpy as np
import pytest
import torch

from sparseattn import graphs
from sparseattn.models import GraphPool, bucket_batches, token_batches


def test_graph_batch_holds_three_block_diagonal_graphs():
    pool = GraphPool()
    src, tgt = [[3, 4, 5], [6], [7, 8]], [[9, 9], [10, 11, 12], []]
    b = pool.batch(src, tgt, bos=1, eos=2)
    assert b.src.tolist() == [3, 4, 5, 6, 7, 8]
    assert b.src_pos.tolist() == [0, 1, 2, 0, 0, 1]
    assert b.tgt_in.tolist() == [1, 9, 9, 1, 10, 11, 12, 1]
    assert b.tgt_out.tolist() == [9, 9, 2, 10, 11, 12, 2, 2]
    assert b.tgt_pos.tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert b.src_lens == (3, 1, 2) and b.tgt_lens == (3, 4, 1) and b.num_tokens == 8
    assert b.enc_graph.num_edges == 9 + 1 + 4 and b.dec_graph.num_edges == 6 + 10 + 1
    assert b.cross_graph.num_edges == 3 * 3 + 1 * 4 + 2 * 1
    expected = graphs.batch([graphs.bipartite(3, 3), graphs.bipartite(1, 4), graphs.bipartite(2, 1)])
    assert torch.equal(b.cross_graph.edge_index, expected.edge_index)
    # no edge crosses sentences
    sent_src = torch.repeat_interleave(torch.arange(3), torch.tensor(b.src_lens))
    sent_dst = torch.repeat_interleave(torch.arange(3), torch.tensor(b.tgt_lens))
    assert torch.equal(sent_src[b.cross_graph.src], sent_dst[b.cross_graph.dst])
    assert torch.all(b.dec_graph.src <= b.dec_graph.dst)


def test_pool_caches_graphs_per_length():
    pool = GraphPool()
    assert pool.encoder(5) is pool.encoder(5)
    assert pool.cross(3, 4) is pool.cross(3, 4) and pool.cross(3, 4) is not pool.cross(4, 3)


def test_source_only_batch_for_decoding():
    b = GraphPool().batch([[3, 4], [5]])
    assert b.dec_graph is None and b.num_tokens == 0 and b.enc_graph.num_edges == 5


def test_bucket_batches_cover_every_index_once_and_are_seeded():
    lengths = [int(x) for x in torch.randint(1, 30, (1000,))]
    batches = bucket_batches(lengths, 64, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1000)) and max(len(b) for b in batches) <= 64
    assert batches == bucket_batches(lengths, 64, seed=3)
    assert batches != bucket_batches(lengths, 64, seed=4)
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 5  # similar lengths within a batch
    ordered = bucket_batches(lengths, 64)
    assert [lengths[i] for b in ordered for i in b] == sorted(lengths)


@pytest.mark.parametrize("seed", [None, 0, 1, 7])
@pytest.mark.parametrize("budget", [1, 20, 64, 500])
def test_token_batches_respect_budget_and_cover_every_pair_once(seed, budget):
    sizes = np.random.default_rng(3).integers(1, 60, size=300)
    batches = token_batches(sizes, budget, seed)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(sizes)))  # every pair exactly once
    for b in batches:
        assert sum(sizes[i] for i in b) <= budget or len(b) == 1  # only a single oversize pair exceeds it
    if seed is not None:
        assert token_batches(sizes, budget, seed) == batches  # deterministic in the seed


def test_token_batches_rejects_bad_budget():
    with pytest.raises(ValueError, match="max_tokens must be > 0"):
        token_batches([1, 2], 0)
    with pytest.raises(ValueError, match="max_tokens must be > 0"):
        token_batches([1, 2], 0, by_length=False)


def _chunking_batches_before_the_redesign(lengths, max_tokens, seed):
    """sparseattn/data/chunking.py's token_batches as it was: seeded shuffle (or in order), cut greedily."""
    order = list(range(len(lengths)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    out, count = [], 0
    for i in order:
        if out and out[-1] and count + lengths[i] <= max_tokens:
            out[-1].append(i)
            count += lengths[i]
        else:
            out.append([i])
            count = lengths[i]
    return out


def test_token_batches_not_by_length_cover_every_sentence_within_budget():
    lengths = [5, 9, 3, 12, 1, 7]
    for seed in (None, 0, 1):
        groups = token_batches(lengths, 10, seed, by_length=False)
        assert sorted(i for g in groups for i in g) == list(range(6))
        assert all(sum(lengths[i] for i in g) <= 10 or len(g) == 1 for g in groups)
    assert token_batches(lengths, 10, 3, by_length=False) == token_batches(lengths, 10, 3, by_length=False)
    assert token_batches(lengths, 10, None, by_length=False) == [[0], [1], [2], [3], [4, 5]]  # in order


@pytest.mark.parametrize("seed", [None, 0, 5])
@pytest.mark.parametrize("budget", [1, 10, 40, 1000])
def test_token_batches_not_by_length_equal_the_old_chunking_batches(seed, budget):
    lengths = np.random.default_rng(11).integers(1, 30, size=200).tolist()
    assert token_batches(lengths, budget, seed, by_length=False) == _chunking_batches_before_the_redesign(
        lengths, budget, seed
    )
