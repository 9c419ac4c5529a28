import pytest
import torch

from sparseattn.models import TransformerTagger
from sparseattn.train.tasks.chunking import chunk_f1
from sparseattn.train.tasks.conll_reader import encode

from .tagging_helpers import SMALL_FEATURES, fit, sample, sizes


def small(vocab, **kw):
    kw = dict(dict(dim=16, heads=2, layers=1, ffn_dim=32, dropout=0.0, features=SMALL_FEATURES), **kw)
    return TransformerTagger(*sizes(vocab), **kw)


@pytest.mark.parametrize(
    "kw", [{}, {"ffn": "linear"}, {"window": 1}, {"rel_pos": 3, "layers": 2}, {"clamp": (-5.0, 5.0)}]
)
def test_logits_shape_and_predict(kw):
    sentences, vocab, batch = sample()
    model = small(vocab, **kw).eval()
    logits = model(batch)
    assert logits.shape == (batch.num_tokens, len(vocab.tags))
    pred = model.predict(batch)
    assert [len(p) for p in pred] == [len(s) for s in sentences]
    assert torch.isfinite(model.loss(batch))


@pytest.mark.parametrize("kw", [{}, {"window": 2, "rel_pos": 2}])
def test_batched_equals_one_sentence_at_a_time(kw):
    sentences, vocab, batch = sample()
    model = small(vocab, layers=2, **kw).double().eval()
    together = model(batch)
    alone = torch.cat([model(encode([s], vocab)) for s in sentences])
    assert torch.allclose(together, alone, atol=1e-10)


def test_parameters_run_from_the_token_features_to_the_classifier():
    names = [name for name, _ in small(sample()[1]).named_parameters()]
    assert names[0].startswith("features.") and names[-2:] == ["classifier.weight", "classifier.bias"]


def test_graph_is_block_diagonal_without_padding():
    _, vocab, _ = sample()
    g = small(vocab).graph([3, 2], torch.device("cpu"))
    assert g.num_dst == 5 and g.num_edges == 9 + 4 and g.dst_ptr == (0, 3, 5)
    g = small(vocab, window=1).graph([4], torch.device("cpu"))
    assert g.num_edges == 4 + 2 * 3


def test_tiny_run_learns_the_sample():
    torch.manual_seed(0)
    sentences, vocab, batch = sample()
    model = small(vocab, layers=2)
    before = model.loss(batch).item()
    after = fit(model, batch, steps=80)
    assert after < 0.2 * before
    gold = [list(s.tags) for s in sentences]
    pred = [[vocab.tags.itos[i] for i in p] for p in model.predict(batch)]
    assert chunk_f1(gold, pred) > 0.9


def test_loads_a_state_dict_with_the_old_attn_and_ffn_keys():
    """Checkpoints written before the tagger used blocks.EncoderLayer name its sublayers attn/ffn."""
    sentences, vocab, batch = sample()
    torch.manual_seed(3)
    model = small(vocab, layers=2, rel_pos=2).double().eval()
    state = model.state_dict()
    old = {k.replace(".self_attn.", ".attn.").replace(".ff.", ".ffn."): v.clone() for k, v in state.items()}
    assert any(".attn." in k for k in old) and any(".ffn." in k for k in old) and old.keys() != state.keys()
    torch.manual_seed(4)
    fresh = small(vocab, layers=2, rel_pos=2).double().eval()
    assert not torch.equal(fresh(batch), model(batch))
    fresh.load_state_dict(old)  # strict: every old key maps to a current one
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert torch.equal(fresh(batch), model(batch))
