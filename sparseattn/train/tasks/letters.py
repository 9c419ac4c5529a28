"""The letter tasks `copy`, `sort` and `reverse`: sequences of letters a-z generated from a seed
(9000/1000/1000 train/valid/test sequences, lengths floor(Normal(15, 3)), at least 1, as in
DGL's example); nothing is downloaded. Sources are the letters then EOS; targets the
transformed letters (the decoder adds BOS and EOS).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import List

import numpy as np

from ..config import at_least, cfg_field, in_range, seed_value
from ..vocab import Vocab
from .base import Seq2SeqTask, register_task

MAX_LENGTH = 10_000  # the splits are generated in memory and attended over in full: longer is a typo


@dataclass
class LetterConfig:
    """Sizes and length distribution of a letter task's seeded splits."""

    data_seed: int = cfg_field(0, "seed of the generated sequences", check=seed_value)
    num_train: int = cfg_field(9000, "training sequences", check=at_least(1))
    num_valid: int = cfg_field(1000, "validation sequences", check=at_least(1))
    num_test: int = cfg_field(1000, "test sequences", check=at_least(1))
    seq_mean: float = cfg_field(
        15.0, f"mean sequence length (normal, floored, at least 1; at most {MAX_LENGTH})", check=in_range(1, MAX_LENGTH)
    )
    seq_std: float = cfg_field(3.0, "standard deviation of the length", check=in_range(0, MAX_LENGTH))
    src_eos: bool = cfg_field(True, "end each source with EOS, so the decoder sees where the input stops")


def letter_sequences(num: int, seed: int, mean: float = 15.0, std: float = 3.0) -> List[List[str]]:
    """`num` sequences of letters a-z with lengths max(1, floor(Normal(mean, std)))."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, np.floor(rng.normal(mean, std, size=num))).astype(int)
    letters = np.array(list(string.ascii_lowercase))
    return [letters[rng.integers(0, 26, size=n)].tolist() for n in lengths]


SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, BOS, EOS (no padding is needed)


class LetterTask(Seq2SeqTask):
    """A seeded letter task; subclasses define transform(source letters) -> target letters."""

    SPLITS = ("train", "valid", "test")

    def transform(self, letters: List[str]) -> List[str]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"src_vocab": self.src_vocab.itos, "tgt_vocab": self.tgt_vocab.itos}

    def setup(self, cfg) -> None:
        data = cfg.task_cfg
        self.src_vocab = self.tgt_vocab = Vocab(list(string.ascii_lowercase), specials=SPECIALS, unk="<unk>")
        sizes = {"train": data.num_train, "valid": data.num_valid, "test": data.num_test}
        for i, split in enumerate(self.SPLITS):
            seqs = letter_sequences(sizes[split], seed=data.data_seed * 10 + i, mean=data.seq_mean, std=data.seq_std)
            end = [self.eos] if data.src_eos else []
            self.splits[split] = (
                [self.src_vocab.encode(s) + end for s in seqs],
                [self.tgt_vocab.encode(self.transform(s)) for s in seqs],
            )


@register_task("copy", config=LetterConfig)
class CopyTask(LetterTask):
    def transform(self, letters: List[str]) -> List[str]:
        return list(letters)


@register_task("sort", config=LetterConfig, default_model="ut")
class SortTask(LetterTask):
    def transform(self, letters: List[str]) -> List[str]:
        return sorted(letters)


@register_task("reverse", config=LetterConfig)
class ReverseTask(LetterTask):
    def transform(self, letters: List[str]) -> List[str]:
        return letters[::-1]
