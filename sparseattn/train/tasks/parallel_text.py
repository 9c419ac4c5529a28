"""Multi30k-format parallel text -> joint subword vocabulary -> token ids, and back.

A data directory holds `{split}.{lang}` files, one sentence per line, line i of the source
file translating line i of the target file (Multi30k task 1: `train`, `val`,
`test_2016_flickr`; see docs/guide/translation.md for where to get them). Nothing is downloaded.

The vocabulary is one BPE model (Hugging Face `tokenizers`) trained on both sides of the
training split, so source, target and generator embeddings can be shared. Words are split
on whitespace (kept as the `▁` marker) and punctuation, so `decode` restores the original
spacing and the output can be scored with sacrebleu as plain text.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Sequence, Tuple

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
SPLIT_FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}


def read_parallel(data_dir: str, split: str, src_lang: str = "en", tgt_lang: str = "de") -> Tuple[List[str], List[str]]:
    """Read one split as (source sentences, target sentences). `split` is train, val or test
    (test_2016_flickr) or a file stem present in `data_dir`."""
    stem = SPLIT_FILES.get(split, split)
    paths = [os.path.join(data_dir, f"{stem}.{lang}") for lang in (src_lang, tgt_lang)]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(
            f"data_dir {data_dir!r} lacks {', '.join(os.path.basename(p) for p in missing)}; it must hold "
            f"Multi30k-format files {stem}.{src_lang} and {stem}.{tgt_lang} (see docs/guide/translation.md)"
        )
    src, tgt = ([line.rstrip("\n") for line in open(p, encoding="utf-8")] for p in paths)
    if len(src) != len(tgt):
        raise ValueError(f"{paths[0]} has {len(src)} lines but {paths[1]} has {len(tgt)}; they must pair up")
    return src, tgt


class SubwordVocab:
    """A joint BPE vocabulary with `<pad>`, `<unk>`, `<s>` and `</s>` at ids 0-3."""

    pad, unk, bos, eos = range(4)

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> "SubwordVocab":
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
        )
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str) -> "SubwordVocab":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(path))

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        self.tokenizer.save(tmp)
        os.replace(tmp, path)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> List[int]:
        """Subword ids of `text`, without `<s>`/`</s>`."""
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text; stops at `</s>` and drops the special tokens."""
        ids = list(ids)
        if self.eos in ids:
            ids = ids[: ids.index(self.eos)]
        return self.tokenizer.decode([i for i in ids if i >= len(SPECIALS)])
