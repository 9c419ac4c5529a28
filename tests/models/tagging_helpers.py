"""The sample CoNLL file, its vocabulary and a small model builder shared by the tagger tests."""

from pathlib import Path

import torch

from sparseattn.train.tasks.conll_reader import TaggingVocab, encode, read_conll

SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "conll_sample.txt"
SMALL_FEATURES = dict(word_dim=16, pos_dim=8, caps_dim=3, char_dim=8, char_out=8, dropout=0.0, word_dropout=0.0)


def sample():
    sentences = read_conll(SAMPLE)
    vocab = TaggingVocab.build(sentences, min_freq=1)
    return sentences, vocab, encode(sentences, vocab)


def sizes(vocab):
    return len(vocab.words), len(vocab.pos), len(vocab.chars), len(vocab.tags)


def fit(model, batch, steps=60, lr=1e-2):
    """Full-batch Adam steps on one batch; returns the final loss."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()
