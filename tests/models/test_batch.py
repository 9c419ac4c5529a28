import torch

from sparseattn import graphs
from sparseattn.data.batching import GraphPool, bucket_batches


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
