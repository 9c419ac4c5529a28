import torch

from sparseattn.models import BiLSTMTagger
from sparseattn.train.tasks.chunking import chunk_f1
from sparseattn.train.tasks.conll_reader import encode

from .tagging_helpers import SMALL_FEATURES, fit, sample, sizes


def small(vocab):
    return BiLSTMTagger(*sizes(vocab), hidden=12, dropout=0.0, features=SMALL_FEATURES)


def test_logits_shape_and_packed_equals_one_sentence_at_a_time():
    sentences, vocab, batch = sample()
    model = small(vocab).double().eval()
    logits = model(batch)
    assert logits.shape == (batch.num_tokens, len(vocab.tags))
    alone = torch.cat([model(encode([s], vocab)) for s in sentences])
    assert torch.allclose(logits, alone, atol=1e-10)


def test_tiny_run_learns_the_sample():
    torch.manual_seed(0)
    sentences, vocab, batch = sample()
    model = small(vocab)
    before = model.loss(batch).item()
    assert fit(model, batch, steps=80) < 0.2 * before
    gold = [list(s.tags) for s in sentences]
    pred = [[vocab.tags.itos[i] for i in p] for p in model.predict(batch)]
    assert chunk_f1(gold, pred) > 0.9


def test_parameters_run_from_the_token_features_to_the_classifier():
    names = [name for name, _ in small(sample()[1]).named_parameters()]
    assert names[0].startswith("features.") and names[-2:] == ["classifier.weight", "classifier.bias"]
