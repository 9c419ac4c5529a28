import os

import pytest

pytest.importorskip("tokenizers", reason="translation needs the 'translate' extra (tokenizers)")

from sparseattn.train.tasks.parallel_text import SPECIALS, SubwordVocab, read_parallel  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(TESTS, "fixtures", "multi30k_sample")
SHARED = os.path.join(TESTS, "..", "..", "shared", "data", "multi30k")


def test_read_parallel_sample():
    src, tgt = read_parallel(SAMPLE, "train")
    assert len(src) == len(tgt) == 8 and src[0] == "A dog runs on the beach."
    assert read_parallel(SAMPLE, "test")[1][1] == "Ein Mann wirft einen Ball."


def test_read_parallel_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks train.en, train.de"):
        read_parallel(str(tmp_path), "train")
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("a\n")
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        read_parallel(str(tmp_path), "train")


def test_vocab_roundtrip_specials_and_save(tmp_path):
    src, tgt = read_parallel(SAMPLE, "train")
    vocab = SubwordVocab.train(src + tgt, vocab_size=200, min_frequency=1)
    assert [vocab.tokenizer.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    for line in src + tgt:
        ids = vocab.encode(line)
        assert min(ids) >= len(SPECIALS)
        assert vocab.decode(ids) == line
        assert vocab.decode([vocab.bos, *ids, vocab.eos, 9, 9]) == line  # stops at </s>
    path = str(tmp_path / "tokenizer.json")
    vocab.save(path)
    assert SubwordVocab.load(path).encode(src[0]) == vocab.encode(src[0])


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="shared Multi30k files not present")
def test_shared_multi30k_splits_have_the_documented_sizes():
    sizes = {split: len(read_parallel(SHARED, split)[0]) for split in ("train", "val", "test")}
    assert sizes == {"train": 29000, "val": 1014, "test": 1000}
