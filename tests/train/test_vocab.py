"""Vocab: specials first, then the symbols; `vocab[symbol]`, encode/decode, the unknown-symbol id."""

import pytest

from sparseattn.train.vocab import Vocab


def test_specials_come_first_then_symbols_without_duplicates():
    vocab = Vocab(["a", "b", "<pad>", "c"], specials=("<pad>", "<unk>"), unk="<unk>")
    assert vocab.itos == ["<pad>", "<unk>", "a", "b", "c"] and len(vocab) == 5
    assert vocab["<pad>"] == 0 and vocab["a"] == 2 and vocab["c"] == 4
    assert vocab["zzz"] == vocab.unk == 1  # unknown symbols map to the unk special


def test_encode_decode_round_trip():
    vocab = Vocab(list("abc"), specials=("<s>",))
    ids = vocab.encode(list("cab"))
    assert ids == [3, 1, 2] and vocab.decode(ids) == list("cab")


def test_without_unk_an_unknown_symbol_is_a_key_error():
    vocab = Vocab(["O", "B-NP"])
    assert vocab.unk is None and vocab["B-NP"] == 1
    with pytest.raises(KeyError, match="'I-XX' is not in the vocabulary"):
        vocab["I-XX"]
    with pytest.raises(KeyError):
        vocab.encode(["O", "nope"])


def test_unk_must_be_a_special():
    with pytest.raises(ValueError, match="must be one of the specials"):
        Vocab(["a"], specials=("<pad>",), unk="<unk>")
