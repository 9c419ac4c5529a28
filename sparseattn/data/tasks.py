"""Tasks: what `sparseattn train --task NAME` trains on, and how it is scored.

Built in: `copy`, `sort` and `reverse`, sequences of letters a-z generated from a seed (as in
the seed example: 9000/1000/1000 train/valid/test sequences, lengths floor(Normal(15, 3)),
at least 1); nothing is downloaded.

Extension point: subclass `Task` (or `Seq2SeqTask` for a new sequence-to-sequence dataset) and
decorate it with `@register_task("name")`. The training loop (train.py) only calls:
    task.setup(cfg)                                build data and vocabularies (deterministic)
    task.model_kwargs()                            vocabulary sizes etc. for the model registry
    task.batch_indices(split, cfg, epoch)          list of example-index lists (epoch=None: in order)
    task.make_batch(split, indices, device)        one batch object the model's forward accepts
    task.loss(model, batch, cfg)                   (loss tensor, stats) with stats["loss"] summed
                                                   over stats["tokens"], stats["correct"]; numpy
                                                   arrays are summed too (e.g. ACT step histograms)
    task.evaluate(model, split, cfg, decode=True)  dict of metrics (token_accuracy, ... later bleu, f1)
    task.plot(model, cfg, out_dir, history)        task-specific PNGs (list of paths)
    task.state_dict() / load_state_dict()          what must travel in a checkpoint (vocabularies)
A translation task overrides setup (read files, BPE, vocab) and evaluate (add BLEU), as
`multi30k` does in translation_task.py; a tagging
task implements make_batch/loss/evaluate for its own batch type (e.g. token F1).
"""
from __future__ import annotations

import string
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.nn import functional as F

from ..metrics import sequence_accuracy, token_accuracy
from .batching import GraphPool, bucket_batches

TASKS: Dict[str, Callable[[], "Task"]] = {}


def register_task(name: str):
    """Class decorator: `sparseattn train --task name` uses this Task class."""
    def deco(cls):
        cls.name = name
        TASKS[name] = cls
        return cls
    return deco


def get_task(name: str) -> "Task":
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]()


class Vocab:
    """Token <-> id. Ids 0, 1, 2 are <unk>, <s> (BOS), </s> (EOS); no padding token is needed."""

    SPECIALS = ("<unk>", "<s>", "</s>")

    def __init__(self, tokens: Sequence[str]) -> None:
        self.itos: List[str] = list(self.SPECIALS) + [t for t in tokens if t not in self.SPECIALS]
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.unk, self.bos, self.eos = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> List[int]:
        return [self.stoi.get(t, self.unk) for t in tokens]

    def decode(self, ids: Sequence[int]) -> List[str]:
        return [self.itos[i] for i in ids]


class Task:
    """Base class: the hooks train.py calls (see the module docstring)."""

    name = ""
    default_model = "transformer"

    def setup(self, cfg) -> None:
        raise NotImplementedError

    def model_kwargs(self) -> dict:
        raise NotImplementedError

    def num_examples(self, split: str) -> int:
        raise NotImplementedError

    def batch_indices(self, split: str, cfg, epoch: Optional[int]) -> List[List[int]]:
        raise NotImplementedError

    def make_batch(self, split: str, indices: Sequence[int], device=None):
        raise NotImplementedError

    def loss(self, model, batch, cfg) -> Tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def evaluate(self, model, split: str, cfg, decode: bool = True) -> dict:
        raise NotImplementedError

    @torch.no_grad()
    def loss_summary(self, model, split: str, cfg) -> dict:
        """`Meter.summary()` of this task's loss stats over every batch of `split` (the model's mode
        is left to the caller: evaluate() puts it in eval mode first)."""
        from ..metrics import Meter
        device = next(model.parameters()).device
        meter = Meter()
        for idx in self.batch_indices(split, cfg, None):
            meter.add(self.loss(model, self.make_batch(split, idx, device), cfg)[1])
        return meter.summary()

    def plot(self, model, cfg, out_dir, history: list) -> list:
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Seq2SeqTask(Task):
    """Pairs of token-id lists in self.splits[split] = (sources, targets), scored by decoding.
    Subclasses fill self.splits and self.src_vocab / self.tgt_vocab in setup()."""

    def __init__(self) -> None:
        self.splits: Dict[str, Tuple[List[List[int]], List[List[int]]]] = {}
        self.src_vocab: Optional[Vocab] = None
        self.tgt_vocab: Optional[Vocab] = None
        self.pool = GraphPool()

    def model_kwargs(self) -> dict:
        return dict(src_vocab_size=len(self.src_vocab), tgt_vocab_size=len(self.tgt_vocab),
                    shared_vocab=self.src_vocab.itos == self.tgt_vocab.itos)

    def num_examples(self, split: str) -> int:
        return len(self.splits[split][0])

    def batch_indices(self, split: str, cfg, epoch: Optional[int]) -> List[List[int]]:
        src, tgt = self.splits[split]
        lengths = [len(s) + len(t) for s, t in zip(src, tgt)]
        seed = None if epoch is None else cfg.seed * 1_000_003 + epoch  # a new order each epoch
        return bucket_batches(lengths, cfg.batch_size, seed)

    def make_batch(self, split: str, indices: Sequence[int], device=None):
        src, tgt = self.splits[split]
        batch = self.pool.batch([src[i] for i in indices], [tgt[i] for i in indices],
                                bos=self.tgt_vocab.bos, eos=self.tgt_vocab.eos)
        return batch if device is None else batch.to(device)

    def loss(self, model, batch, cfg) -> Tuple[torch.Tensor, dict]:
        out = model(batch)
        loss_sum = F.cross_entropy(out.logits, batch.tgt_out, label_smoothing=cfg.label_smoothing, reduction="sum")
        tokens = batch.num_tokens
        stats = {"loss": loss_sum.item(), "tokens": tokens,
                 "correct": (out.logits.argmax(-1) == batch.tgt_out).sum().item()}
        if "act_steps_enc" in out.stats:  # ACT: histogram of steps per node, index = steps
            steps = torch.cat([out.stats["act_steps_enc"], out.stats["act_steps_dec"]])
            stats["act_steps_hist"] = np.bincount(steps.cpu().numpy(), minlength=model.max_steps + 1)
            stats["act_loss"] = out.aux_loss.item() * tokens  # summed like loss
        return loss_sum / tokens + out.aux_loss, stats

    @torch.no_grad()
    def evaluate(self, model, split: str, cfg, decode: bool = True) -> dict:
        """Teacher-forced loss/accuracy, and (decode=True) token and sequence accuracy of decoded outputs."""
        from ..models.decoding import decode as decode_all
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        summary = self.loss_summary(model, split, cfg)
        metrics = {"loss": summary["loss"], "tf_accuracy": summary["accuracy"]}
        if "act_steps_hist" in summary:
            hist = np.asarray(summary["act_steps_hist"], dtype=float)
            metrics["act_steps_mean"] = float((hist * np.arange(len(hist))).sum() / hist.sum())
            metrics["act_steps_hist"] = summary["act_steps_hist"]
        if decode:
            src, tgt = self.splits[split]
            preds = decode_all(model, src, self.tgt_vocab.bos, self.tgt_vocab.eos, beam=cfg.beam, alpha=cfg.alpha,
                               max_len_a=cfg.max_len_a, max_len_b=cfg.max_len_b, batch_size=cfg.eval_batch_size,
                               device=device, pool=self.pool)
            metrics["token_accuracy"] = token_accuracy(preds, tgt)
            metrics["sequence_accuracy"] = sequence_accuracy(preds, tgt)
        model.train(was_training)
        return metrics

    def plot(self, model, cfg, out_dir, history: list) -> list:
        from ..plots import seq2seq_plots
        return seq2seq_plots(self, model, cfg, out_dir, history)

    def state_dict(self) -> dict:
        return {"src_vocab": self.src_vocab.itos, "tgt_vocab": self.tgt_vocab.itos}


def letter_sequences(num: int, seed: int, mean: float = 15.0, std: float = 3.0) -> List[List[str]]:
    """`num` sequences of letters a-z with lengths max(1, floor(Normal(mean, std)))."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, np.floor(rng.normal(mean, std, size=num))).astype(int)
    letters = np.array(list(string.ascii_lowercase))
    return [letters[rng.integers(0, 26, size=n)].tolist() for n in lengths]


class LetterTask(Seq2SeqTask):
    """A seeded letter task; subclasses define transform(source letters) -> target letters.
    Sources are the letters then EOS; targets the transformed letters (the decoder adds BOS/EOS)."""

    SPLITS = ("train", "valid", "test")

    def transform(self, letters: List[str]) -> List[str]:
        raise NotImplementedError

    def setup(self, cfg) -> None:
        self.src_vocab = self.tgt_vocab = Vocab(list(string.ascii_lowercase))
        sizes = {"train": cfg.num_train, "valid": cfg.num_valid, "test": cfg.num_test}
        for i, split in enumerate(self.SPLITS):
            seqs = letter_sequences(sizes[split], seed=cfg.data_seed * 10 + i, mean=cfg.seq_mean, std=cfg.seq_std)
            # sources end with EOS, so the decoder can see where the input stops (copying it is how
            # the copy model learns to stop; without it most remaining errors were early stops)
            end = [self.src_vocab.eos] if cfg.src_eos else []
            self.splits[split] = ([self.src_vocab.encode(s) + end for s in seqs],
                                  [self.tgt_vocab.encode(self.transform(s)) for s in seqs])


@register_task("copy")
class CopyTask(LetterTask):
    def transform(self, letters: List[str]) -> List[str]:
        return list(letters)


@register_task("sort")
class SortTask(LetterTask):
    default_model = "ut"

    def transform(self, letters: List[str]) -> List[str]:
        return sorted(letters)


@register_task("reverse")
class ReverseTask(LetterTask):
    def transform(self, letters: List[str]) -> List[str]:
        return letters[::-1]
