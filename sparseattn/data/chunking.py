"""The CoNLL-2000 chunking task of the shared training CLI: `sparseattn train --task chunking`.

Reads `<data_dir>/conll2000/{train,test}.txt` (data_dir: the config's, else ../shared/data when it
exists); "valid" is a seeded `dev_fraction` of train.txt (seed `data_seed`), "test" is test.txt.
Batches hold whole sentences, about `max_tokens` tokens each, concatenated with no padding
(`TaggingBatch`); models: `tagger` (TransformerTagger) and `bilstm` (BiLSTMTagger). Scores are
seqeval chunk precision/recall/F1 (conlleval-compatible IOB2), overall and per chunk type.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch.nn import functional as F

from ..chunk_metrics import chunk_scores
from .conll import IGNORE, Sentence, TaggingVocab, encode, read_conll, split_dev
from .tasks import Task, register_task


def default_data_dir() -> str:
    return "../shared/data" if Path("../shared/data/conll2000").is_dir() else ""


def load_split(data_dir: str, name: str) -> List[Sentence]:
    if not data_dir:
        raise SystemExit("chunking needs a data folder holding conll2000/ (--data_dir, or --data-dir for "
                         "train-tagger); ../shared/data does not exist")
    path = Path(data_dir) / "conll2000" / f"{name}.txt"
    if not path.is_file():
        raise SystemExit(f"{path} not found (the data folder should hold conll2000/{{train,test}}.txt)")
    return read_conll(path)


def token_batches(lengths: Sequence[int], max_tokens: int, seed: Optional[int]) -> List[List[int]]:
    """Index lists of at most `max_tokens` tokens (a longer sentence alone); seeded shuffle, or in order."""
    order = list(range(len(lengths)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    out: List[List[int]] = []
    count = 0
    for i in order:
        if out and out[-1] and count + lengths[i] <= max_tokens:
            out[-1].append(i)
            count += lengths[i]
        else:
            out.append([i])
            count = lengths[i]
    return out


@register_task("chunking")
class ChunkingTask(Task):
    default_model = "tagger"

    def __init__(self) -> None:
        self.splits: Dict[str, List[Sentence]] = {}
        self.vocab: Optional[TaggingVocab] = None

    def setup(self, cfg) -> None:
        data_dir = cfg.data_dir or default_data_dir()
        train, valid = split_dev(load_split(data_dir, "train"), cfg.dev_fraction, cfg.data_seed)
        self.splits = {"train": train, "valid": valid, "test": load_split(data_dir, "test")}
        self.vocab = TaggingVocab.build(train, cfg.min_freq)

    def model_kwargs(self) -> dict:
        v = self.vocab
        return dict(num_words=len(v.words), num_pos=len(v.pos), num_chars=len(v.chars), num_tags=len(v.tags))

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch_indices(self, split: str, cfg, epoch: Optional[int]) -> List[List[int]]:
        if cfg.max_tokens <= 0:
            raise ValueError(f"task chunking batches by tokens: --max_tokens must be > 0, got {cfg.max_tokens}")
        seed = None if epoch is None else cfg.seed * 1_000_003 + epoch
        return token_batches([len(s) for s in self.splits[split]], cfg.max_tokens, seed)

    def make_batch(self, split: str, indices: Sequence[int], device=None):
        batch = encode([self.splits[split][i] for i in indices], self.vocab)
        return batch if device is None else batch.to(device)

    def loss(self, model, batch, cfg) -> Tuple[torch.Tensor, dict]:
        logits = model(batch)  # (L, num_tags)
        loss_sum = F.cross_entropy(logits, batch.tags, ignore_index=IGNORE, label_smoothing=cfg.label_smoothing,
                                   reduction="sum")
        tokens = int((batch.tags != IGNORE).sum())
        stats = {"loss": loss_sum.item(), "tokens": tokens, "correct": (logits.argmax(-1) == batch.tags).sum().item()}
        return loss_sum / max(tokens, 1), stats

    @torch.no_grad()
    def predict(self, model, split: str, cfg) -> List[List[str]]:
        device = next(model.parameters()).device
        sentences = self.splits[split]
        pred: List[List[str]] = [[] for _ in sentences]
        for idx in self.batch_indices(split, cfg, None):
            for i, ids in zip(idx, model.predict(self.make_batch(split, idx, device))):
                pred[i] = [self.vocab.tags.itos[t] for t in ids]
        return pred

    @torch.no_grad()
    def evaluate(self, model, split: str, cfg, decode: bool = True) -> dict:
        """loss, token and sentence accuracy, chunk precision/recall/f1 overall and `<TYPE>_f1` etc. per type."""
        was_training = model.training
        model.eval()
        summary = self.loss_summary(model, split, cfg)
        gold = [list(s.tags) for s in self.splits[split]]
        pred = self.predict(model, split, cfg)
        scores = chunk_scores(gold, pred)
        metrics = {"loss": summary["loss"], "token_accuracy": summary["accuracy"],
                   "sequence_accuracy": sum(p == g for p, g in zip(pred, gold)) / max(len(gold), 1)}
        metrics.update({k: scores["overall"][k] for k in ("precision", "recall", "f1")})
        for name in sorted((n for n in scores if n != "overall"), key=lambda n: -scores[n]["support"]):
            metrics.update({f"{name}_{k}": scores[name][k] for k in ("precision", "recall", "f1")})
        model.train(was_training)
        return metrics

    def plot(self, model, cfg, out_dir, history: list) -> list:
        """Valid chunk F1 per epoch."""
        if not history:
            return []
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        ax.plot([r["epoch"] for r in history], [100 * r["valid"]["f1"] for r in history], marker="o", label=cfg.model)
        ax.set_xlabel("epoch")
        ax.set_ylabel("valid chunk F1 (%)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / "valid_f1.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return [path]

    def state_dict(self) -> dict:
        return {"vocab": self.vocab.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "vocab" in state:
            self.vocab = TaggingVocab.from_state_dict(state["vocab"])
