"""Tasks: what `sparseattn train --task NAME` trains on, and how it is scored.

Extension point: subclass `Task` (or `Seq2SeqTask` for a sequence-to-sequence dataset), give it
a config dataclass and decorate it with `@register_task("name", config=MyConfig)`. The training
loop (trainer.py) only calls, with cfg the run's `Config` (cfg.run, cfg.task_cfg, cfg.model_cfg):
    task.setup(cfg)                                build data and vocabularies (deterministic)
    task.model_info()                              vocabulary sizes etc. the model is built for
    task.batch_indices(split, cfg, epoch)          list of example-index lists (epoch=None: in order)
    task.make_batch(split, indices, device)        one batch object the model's forward accepts
    task.loss(model, batch, cfg)                   (loss tensor, stats) with stats["loss"] summed
                                                   over stats["tokens"], stats["correct"]; numpy
                                                   arrays are summed too (e.g. ACT step histograms)
    task.evaluate(model, split, cfg, decode=True)  dict of metrics (token_accuracy, bleu, f1, ...)
    task.plot(model, cfg, out_dir, history)        task-specific PNGs (list of paths)
    task.state_dict() / load_state_dict()          what must travel in a checkpoint (vocabularies)
Built in: letters.py (copy, sort, reverse), multi30k.py (translation), chunking.py (CoNLL-2000).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.nn import functional as F

from ...models import GraphPool, bucket_batches, decode
from ..config import DEFAULT_MODELS, TASK_CONFIGS
from ..metrics import Meter, sequence_accuracy, token_accuracy

TASKS: Dict[str, Callable[[], "Task"]] = {}


def register_task(name: str, config: type, default_model: str = "transformer"):
    """Class decorator: `sparseattn train --task name` uses this Task class, configured by the
    dataclass `config` (its fields become `--key=value` flags) and trained with `default_model`
    unless --model says otherwise."""

    def deco(cls):
        cls.name = name
        TASKS[name] = cls
        TASK_CONFIGS[name] = config
        DEFAULT_MODELS[name] = default_model
        return cls

    return deco


def get_task(name: str) -> "Task":
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]()


class Task:
    """Base class: the hooks train.py calls (see the module docstring)."""

    name = ""

    def setup(self, cfg) -> None:
        raise NotImplementedError

    def model_info(self) -> dict:
        raise NotImplementedError

    def num_examples(self, split: str) -> int:
        raise NotImplementedError

    def split_names(self) -> List[str]:
        """The splits `evaluate` can score (after setup)."""
        return list(getattr(self, "splits", {}))

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
    Subclasses fill self.splits, self.src_vocab / self.tgt_vocab (objects with len() and
    decode(ids)) and the target's bos/eos ids in setup()."""

    bos, eos = 1, 2

    def __init__(self) -> None:
        self.splits: Dict[str, Tuple[List[List[int]], List[List[int]]]] = {}
        self.src_vocab = None
        self.tgt_vocab = None
        self.pool = GraphPool()

    def model_info(self) -> dict:
        return dict(
            src_vocab_size=len(self.src_vocab),
            tgt_vocab_size=len(self.tgt_vocab),
            shared_vocab=self.src_vocab is self.tgt_vocab,
        )

    def num_examples(self, split: str) -> int:
        return len(self.splits[split][0])

    def batch_indices(self, split: str, cfg, epoch: Optional[int]) -> List[List[int]]:
        src, tgt = self.splits[split]
        lengths = [len(s) + len(t) for s, t in zip(src, tgt)]
        return bucket_batches(lengths, cfg.run.batch_size, epoch_seed(cfg, epoch))

    def make_batch(self, split: str, indices: Sequence[int], device=None):
        src, tgt = self.splits[split]
        batch = self.pool.batch([src[i] for i in indices], [tgt[i] for i in indices], bos=self.bos, eos=self.eos)
        return batch if device is None else batch.to(device)

    def loss(self, model, batch, cfg) -> Tuple[torch.Tensor, dict]:
        out = model(batch)
        loss_sum = F.cross_entropy(out.logits, batch.tgt_out, label_smoothing=cfg.run.label_smoothing, reduction="sum")
        tokens = batch.num_tokens
        stats = {
            "loss": loss_sum.item(),
            "tokens": tokens,
            "correct": (out.logits.argmax(-1) == batch.tgt_out).sum().item(),
        }
        if "act_steps_enc" in out.stats:  # ACT: histogram of steps per node, index = steps
            steps = torch.cat([out.stats["act_steps_enc"], out.stats["act_steps_dec"]])
            stats["act_steps_hist"] = np.bincount(steps.cpu().numpy(), minlength=model.max_steps + 1)
            stats["act_loss"] = out.aux_loss.item() * tokens  # summed like loss
        return loss_sum / tokens + out.aux_loss, stats

    @torch.no_grad()
    def evaluate(self, model, split: str, cfg, decode: bool = True) -> dict:
        """Teacher-forced loss/accuracy, and (decode=True) token and sequence accuracy of decoded outputs."""
        was_training = model.training
        model.eval()
        summary = self.loss_summary(model, split, cfg)
        metrics = {"loss": summary["loss"], "tf_accuracy": summary["accuracy"]}
        if "act_steps_hist" in summary:
            hist = np.asarray(summary["act_steps_hist"], dtype=float)
            metrics["act_steps_mean"] = float((hist * np.arange(len(hist))).sum() / hist.sum())
            metrics["act_steps_hist"] = summary["act_steps_hist"]
        if decode:
            src, tgt = self.splits[split]
            preds = self.decode(model, src, cfg)
            metrics["token_accuracy"] = token_accuracy(preds, tgt)
            metrics["sequence_accuracy"] = sequence_accuracy(preds, tgt)
        model.train(was_training)
        return metrics

    def decode(self, model, sources: Sequence[Sequence[int]], cfg, beam: Optional[int] = None) -> List[List[int]]:
        """Decoded target ids of `sources` with the run's beam (or `beam`) and length limits."""
        run = cfg.run
        return decode(
            model,
            sources,
            self.bos,
            self.eos,
            beam=run.beam if beam is None else beam,
            alpha=run.alpha,
            max_len_a=run.max_len_a,
            max_len_b=run.max_len_b,
            batch_size=run.eval_batch_size,
            device=next(model.parameters()).device,
            pool=self.pool,
        )

    def plot(self, model, cfg, out_dir, history: list) -> list:
        from ..plots import seq2seq_plots

        return seq2seq_plots(self, model, cfg, out_dir, history)


def epoch_seed(cfg, epoch: Optional[int]) -> Optional[int]:
    """Seed of an epoch's batch order (a new order each epoch); None (in order) for evaluation."""
    return None if epoch is None else cfg.run.seed * 1_000_003 + epoch
