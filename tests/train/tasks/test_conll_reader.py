from pathlib import Path

import pytest
import torch

from sparseattn.models import CAPS_CLASSES, IGNORE, TaggingBatch
from sparseattn.train.tasks.conll_reader import (
    Sentence,
    TaggingVocab,
    caps_class,
    encode,
    normalize_word,
    read_conll,
    split_dev,
)

SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "conll_sample.txt"


def test_read_sample():
    sentences = read_conll(SAMPLE)
    assert len(sentences) == 8 and len(sentences[1]) == 3
    assert sentences[1].words == ("Dogs", "bark", ".") and sentences[1].tags == ("B-NP", "B-VP", "O")


def test_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("a DT B-NP\nb NN\n")
    with pytest.raises(ValueError, match="bad.txt:2"):
        read_conll(path)


def test_split_dev_is_seeded_and_disjoint():
    sentences = read_conll(SAMPLE)
    train, dev = split_dev(sentences, 0.25, seed=3)
    assert (train, dev) == split_dev(sentences, 0.25, seed=3)
    assert len(dev) == 2 and len(train) == 6 and not set(dev) & set(train)


def test_features():
    assert normalize_word("May1989") == "may0000"
    assert [CAPS_CLASSES[caps_class(w)] for w in ("dog", "Dog", "USA", "iPod", "3.5")] == [
        "lower",
        "title",
        "upper",
        "mixed",
        "nocase",
    ]


def test_vocab_and_encode():
    sentences = read_conll(SAMPLE)
    vocab = TaggingVocab.build(sentences, min_freq=2)
    assert vocab.words.itos[:2] == ["<pad>", "<unk>"] and vocab.tags.itos[0] == "O"
    assert vocab.words["cat"] == 1  # seen once: <unk> at min_freq=2
    assert vocab.words["<unk>"] == 1 and vocab.words["."] > 1 and vocab.pos["DT"] > 1
    with pytest.raises(KeyError):
        vocab.tags["B-UCP"]  # tags have no <unk>
    b = encode(sentences[:2], vocab)
    assert isinstance(b, TaggingBatch)
    assert b.lengths.tolist() == [7, 3] and b.num_tokens == 10
    assert b.chars.shape == (10, 4) and b.chars[1, 3] == 0  # "cat" padded along characters only
    assert [vocab.tags.itos[i] for i in b.tags[7:]] == ["B-NP", "B-VP", "O"]
    again = TaggingVocab.from_state_dict(vocab.state_dict())
    assert torch.equal(encode(sentences, again).words, encode(sentences, vocab).words)


def test_tag_unseen_in_training_is_ignored_by_the_loss():
    vocab = TaggingVocab.build(read_conll(SAMPLE))
    b = encode([Sentence(("x", "y"), ("NN", "NN"), ("B-UCP", "O"))], vocab)
    assert b.tags.tolist() == [IGNORE, vocab.tags["O"]]
