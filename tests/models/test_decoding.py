import pytest
import torch

from sparseattn import Graph
from sparseattn.models import GraphPool, beam_search, decode, greedy_decode
from sparseattn.models.seq2seq import cross_graph_for_hyps

from .helpers import BOS, EOS, make_model, random_pairs

KINDS = ["transformer", "ut"]


def _sources(num=5, seed=0):
    return random_pairs(num, seed, lo=2, hi=8)[0]


def _naive_greedy(model, src, max_len):
    """One sentence, full recomputation of the teacher-forced forward on the growing prefix."""
    pool = GraphPool()
    out = []
    for _ in range(max_len):
        logits = model(pool.batch([src], [out], BOS, EOS)).logits  # decoder input BOS + out
        tok = int(logits[-1].argmax())
        if tok == EOS:
            break
        out.append(tok)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_batched_greedy_equals_one_sentence_full_recomputation(kind):
    model = make_model(kind)
    sources = _sources(5)
    batch = GraphPool().batch(sources)
    outs = greedy_decode(model, batch, BOS, EOS, max_len=6)
    for src, got in zip(sources, outs):
        assert got == _naive_greedy(model, src, 6)
        assert len(got) <= 6 and EOS not in got


@pytest.mark.parametrize("kind", KINDS)
def test_beam_size_one_equals_greedy(kind):
    model = make_model(kind)
    batch = GraphPool().batch(_sources(6, seed=1))
    limits = [n + 3 for n in batch.src_lens]
    assert beam_search(model, batch, BOS, EOS, limits, beam=1, alpha=0.6) == greedy_decode(
        model, batch, BOS, EOS, limits
    )


@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_respects_limits_and_scores_at_least_greedy(kind):
    model = make_model(kind)
    sources = _sources(4, seed=2)
    batch = GraphPool().batch(sources)
    greedy = greedy_decode(model, batch, BOS, EOS, 5)
    beams = beam_search(model, batch, BOS, EOS, 5, beam=4, alpha=0.0)
    pool = GraphPool()

    def logprob(src, out):
        logits = model(pool.batch([src], [out], BOS, EOS)).logits
        full = out + [EOS] if len(out) < 5 else out  # a hypothesis cut at max_len has no EOS
        return torch.log_softmax(logits, -1)[torch.arange(len(full)), torch.tensor(full)].sum().item()

    for src, g, b in zip(sources, greedy, beams):
        assert len(b) <= 5 and EOS not in b
        assert logprob(src, b) >= logprob(src, g) - 1e-9  # alpha=0: beam never finds a worse sequence


def test_decode_keeps_input_order_across_buckets():
    model = make_model("transformer")
    sources = _sources(9, seed=4)
    outs = decode(model, sources, BOS, EOS, batch_size=2, max_len_a=0.0, max_len_b=4)
    single = [decode(model, [s], BOS, EOS, max_len_a=0.0, max_len_b=4)[0] for s in sources]
    assert outs == single


def test_wide_beams_decode_fewer_sentences_at_a_time(monkeypatch):
    """A batch keeps at most max_hypotheses (sentences x beam): with a budget of 6 and beam 3 the
    9 sources go two at a time, with the outputs of one batch of all nine."""
    from sparseattn.models import decoding

    model = make_model("transformer")
    sources = _sources(9, seed=5)
    sizes = []
    real = decoding.beam_search
    monkeypatch.setattr(
        decoding, "beam_search", lambda m, batch, *a, **k: sizes.append(batch.num_sentences) or real(m, batch, *a, **k)
    )
    narrow = decode(model, sources, BOS, EOS, beam=3, batch_size=9, max_len_a=0.0, max_len_b=4, max_hypotheses=6)
    assert max(sizes) == 2 and sum(sizes) == 9
    assert narrow == decode(model, sources, BOS, EOS, beam=3, batch_size=9, max_len_a=0.0, max_len_b=4)


@pytest.mark.parametrize(
    "hyp_sent", [[0, 1, 2, 3], [0] * 4 + [1] * 4 + [3] * 4, [3, 3, 3, 3, 1, 1, 1, 1, 0], [2, 2, 2, 2]]
)
@pytest.mark.parametrize("steps", [1, 3])
def test_cross_graph_equals_the_validated_graph(hyp_sent, steps):
    """cross_graph_for_hyps is built without validation: same edges as a validated Graph of each
    hypothesis' sentence into its steps nodes, and the blocks that Graph detects (or None)."""
    lens, num_src = [3, 5, 0, 4], 12  # sentence 2 is empty
    ptr = [0, 3, 8, 8]
    edges = [(ptr[s] + i, h * steps + j) for h, s in enumerate(hyp_sent) for j in range(steps) for i in range(lens[s])]
    checked = Graph(
        torch.tensor(edges, dtype=torch.long).reshape(-1, 2).t(), num_src=num_src, num_dst=len(hyp_sent) * steps
    )
    g = cross_graph_for_hyps(torch.tensor(ptr), torch.tensor(lens), torch.tensor(hyp_sent), steps, num_src)
    assert torch.equal(g.edge_index, checked.edge_index)
    assert (g.num_src, g.num_dst, g.is_sorted_by_dst) == (checked.num_src, checked.num_dst, checked.is_sorted_by_dst)
    assert g.blocks == checked.blocks
