"""The CoNLL-2000 chunking task: `sparseattn train --task chunking --data-dir ../shared/data`.

Reads `<data_dir>/conll2000/{train,test}.txt`; "valid" is a seeded `dev_fraction` of train.txt
(seed `data_seed`), "test" is test.txt. Batches hold whole sentences, about `max_tokens` tokens
each, concatenated with no padding (`TaggingBatch`); models: `tagger` (TransformerTagger) and
`bilstm` (BiLSTMTagger). Scores are seqeval's chunk precision/recall/F1: a chunk is a maximal run
B-X I-X ... (an I-X that does not continue an X chunk starts one), as conlleval counts them,
overall and per chunk type.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch.nn import functional as F

from ...models import IGNORE, token_batches
from ..config import at_least, cfg_field, in_range, seed_value
from .base import Task, epoch_seed, register_task
from .conll_reader import Sentence, TaggingVocab, encode, read_conll, split_dev


@dataclass
class ChunkingConfig:
    """Where the CoNLL-2000 files are, the dev split and the vocabulary."""

    data_dir: str = cfg_field("", "folder holding conll2000/{train,test}.txt")
    data_seed: int = cfg_field(0, "seed of the dev split", check=seed_value)
    dev_fraction: float = cfg_field(
        0.1, "share of train.txt held out as the valid split", check=in_range(0, 1, hi_open=True)
    )
    min_freq: int = cfg_field(2, "rarer training words map to <unk>", check=at_least(1))


def load_split(data_dir: str, name: str) -> List[Sentence]:
    if not data_dir:
        raise ValueError(
            "task chunking needs --data-dir DIR holding conll2000/{train,test}.txt (for example ../shared/data)"
        )
    path = Path(data_dir) / "conll2000" / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the --data-dir folder should hold conll2000/{{train,test}}.txt)")
    sentences = read_conll(path)
    if not sentences:
        raise ValueError(f"{path} holds no sentences")
    return sentences


def _seqeval():
    try:
        from seqeval import metrics
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("chunk metrics need seqeval: pip install 'sparseattn[tagging]'") from e
    return metrics


def _check(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} sentences but pred has {len(pred)}")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: gold has {len(g)} tags but pred has {len(p)}")


def chunk_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Overall chunk F1 in [0, 1] (micro average over chunk types)."""
    _check(gold, pred)
    return float(_seqeval().f1_score([list(s) for s in gold], [list(s) for s in pred]))


def chunk_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Dict[str, Dict[str, float]]:
    """{"overall" | chunk type: {"precision", "recall", "f1", "support"}}; scores in [0, 1]."""
    _check(gold, pred)
    gold_l: List[List[str]] = [list(s) for s in gold]
    pred_l: List[List[str]] = [list(s) for s in pred]
    report = _seqeval().classification_report(gold_l, pred_l, output_dict=True, zero_division=0)
    scores = {
        name: {
            "precision": float(r["precision"]),
            "recall": float(r["recall"]),
            "f1": float(r["f1-score"]),
            "support": int(r["support"]),
        }
        for name, r in report.items()
        if not name.endswith(" avg")
    }
    micro = report["micro avg"]
    scores["overall"] = {
        "precision": float(micro["precision"]),
        "recall": float(micro["recall"]),
        "f1": float(micro["f1-score"]),
        "support": int(micro["support"]),
    }
    return scores


@register_task("chunking", config=ChunkingConfig, default_model="tagger")
class ChunkingTask(Task):
    def __init__(self) -> None:
        self.splits: Dict[str, List[Sentence]] = {}
        self.vocab: Optional[TaggingVocab] = None

    def setup(self, cfg) -> None:
        data = cfg.task_cfg
        train, valid = split_dev(load_split(data.data_dir, "train"), data.dev_fraction, data.data_seed)
        self.splits = {"train": train, "valid": valid, "test": load_split(data.data_dir, "test")}
        self.vocab = TaggingVocab.build(train, data.min_freq)

    def model_info(self) -> dict:
        v = self.vocab
        return dict(num_words=len(v.words), num_pos=len(v.pos), num_chars=len(v.chars), num_tags=len(v.tags))

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch_indices(self, split: str, cfg, epoch: Optional[int]) -> List[List[int]]:
        if cfg.run.max_tokens <= 0:
            raise ValueError(f"task chunking batches by tokens: --max_tokens must be > 0, got {cfg.run.max_tokens}")
        return token_batches(
            [len(s) for s in self.splits[split]], cfg.run.max_tokens, epoch_seed(cfg, epoch), by_length=False
        )

    def make_batch(self, split: str, indices: Sequence[int], device=None):
        batch = encode([self.splits[split][i] for i in indices], self.vocab)
        return batch if device is None else batch.to(device)

    def loss(self, model, batch, cfg) -> Tuple[torch.Tensor, dict]:
        logits = model(batch)  # (L, num_tags)
        loss_sum = F.cross_entropy(
            logits, batch.tags, ignore_index=IGNORE, label_smoothing=cfg.run.label_smoothing, reduction="sum"
        )
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
        metrics = {
            "loss": summary["loss"],
            "token_accuracy": summary["accuracy"],
            "sequence_accuracy": sum(p == g for p, g in zip(pred, gold)) / max(len(gold), 1),
        }
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
