"""The chunking taggers' own training loop, which produced docs/RESULTS.md.

The shared path is `sparseattn train --task chunking --model tagger|bilstm` (data/chunking.py, same
models and features). This loop adds what the shared one lacks so far: a wall-clock budget
(`--time_budget_min`, stopping mid-epoch) and a per-epoch lr decay; fold these into train.py and
retire this module.

    python -m sparseattn train-tagger --model bilstm --data-dir ../shared/data --out runs/bilstm
    python -m sparseattn train-tagger --model tagger --data-dir ../shared/data --out runs/tagger --window 3
    python -m sparseattn train-tagger --out runs/tagger --resume          # continue from runs/tagger/last.pt
    python -m sparseattn evaluate-tagger --checkpoint runs/tagger/best.pt --data-dir ../shared/data

Config: `TaggingConfig` defaults <- the checkpoint's config on --resume <- `--key value` flags (one
per field; unknown keys are rejected). Each epoch appends a JSON line to `<out>/metrics.jsonl`
and saves `<out>/last.pt` atomically (temp file + os.replace); the best dev F1 also goes to
`<out>/best.pt`. Dev is a seeded `dev_fraction` of train.txt; test.txt is only read by evaluate.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import config
from .checkpoint import save_atomic
from .chunk_metrics import chunk_scores, format_scores
from .data.chunking import default_data_dir, load_split
from .data.conll import Sentence, TaggingVocab, batches, split_dev
from .models import BiLSTMTagger, Tagger, TransformerTagger

MODELS = ("tagger", "bilstm")


@dataclass
class TaggingConfig:
    model: str = "tagger"            # "tagger" (TransformerTagger) or "bilstm" (BiLSTMTagger)
    data_dir: str = ""               # holds conll2000/{train,test}.txt; default ../shared/data if present
    out: str = "runs/tagging"
    epochs: int = 30
    time_budget_min: float = 0.0     # > 0: stop training (mid-epoch) after this many minutes, then evaluate
    max_tokens: int = 800            # tokens per batch (whole sentences, no padding)
    lr: float = 1e-3
    warmup_steps: int = 0            # linear warmup over the first steps
    lr_decay: float = 1.0            # then lr * lr_decay ** epoch
    weight_decay: float = 0.0
    clip: float = 5.0                # gradient-norm clip (0: off)
    dev_fraction: float = 0.1
    min_freq: int = 2                # rarer training words map to <unk>
    seed: int = 0
    threads: int = 0                 # torch.set_num_threads (0: leave torch's default)
    # token features (both models)
    word_dim: int = 100
    pos_dim: int = 25
    caps_dim: int = 5
    use_chars: bool = True
    char_out: int = 50
    input_dropout: float = 0.3
    word_dropout: float = 0.05
    # TransformerTagger
    dim: int = 128
    heads: int = 4
    layers: int = 2
    ffn_dim: int = 256
    ffn: str = "conv"                # "linear" or "conv" (width 3 along each sentence)
    window: int = 0                  # 0: complete graph per sentence; r > 0: |i - j| <= r
    rel_pos: int = 8                 # relative-position bias clip distance (0: none)
    dropout: float = 0.1
    # BiLSTMTagger
    hidden: int = 200
    lstm_layers: int = 1
    lstm_dropout: float = 0.5

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.ffn not in ("linear", "conv"):
            raise ValueError(f"ffn must be 'linear' or 'conv', got {self.ffn!r}")


def build_model(cfg: TaggingConfig, vocab: TaggingVocab) -> Tagger:
    sizes = (len(vocab.words), len(vocab.pos), len(vocab.chars), len(vocab.tags))
    features = dict(word_dim=cfg.word_dim, pos_dim=cfg.pos_dim, caps_dim=cfg.caps_dim, use_chars=cfg.use_chars,
                    char_out=cfg.char_out, dropout=cfg.input_dropout, word_dropout=cfg.word_dropout)
    if cfg.model == "tagger":
        return TransformerTagger(*sizes, dim=cfg.dim, heads=cfg.heads, layers=cfg.layers, ffn_dim=cfg.ffn_dim,
                                 ffn=cfg.ffn, window=cfg.window or None, rel_pos=cfg.rel_pos,
                                 dropout=cfg.dropout, features=features)
    return BiLSTMTagger(*sizes, hidden=cfg.hidden, layers=cfg.lstm_layers, dropout=cfg.lstm_dropout,
                        features=features)


def predict_tags(model: Tagger, sentences: Sequence[Sentence], vocab: TaggingVocab,
                 max_tokens: int = 2000) -> List[List[str]]:
    model.eval()
    pred: List[List[str]] = [[] for _ in sentences]
    for ids, batch in batches(sentences, vocab, max_tokens):
        for i, tag_ids in zip(ids, model.predict(batch)):
            pred[i] = [vocab.tags.itos[t] for t in tag_ids]
    return pred


def evaluate(model: Tagger, sentences: Sequence[Sentence], vocab: TaggingVocab) -> Dict[str, Dict[str, float]]:
    return chunk_scores([list(s.tags) for s in sentences], predict_tags(model, sentences, vocab))


def load_checkpoint(path: str) -> Tuple[TaggingConfig, TaggingVocab, Tagger, Dict[str, Any]]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = TaggingConfig(**state["config"])
    vocab = TaggingVocab.from_state_dict(state["vocab"])
    model = build_model(cfg, vocab)
    model.load_state_dict(state["model"])
    return cfg, vocab, model, state


def train(cfg: TaggingConfig, resume: bool = False) -> Dict[str, Any]:
    """Train per `cfg`; returns the final checkpoint's summary (best dev F1, epochs, time)."""
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    train_set, dev_set = split_dev(load_split(cfg.data_dir, "train"), cfg.dev_fraction, cfg.seed)
    state: Optional[Dict[str, Any]] = None
    if resume:
        _, vocab, model, state = load_checkpoint(str(out / "last.pt"))
    else:
        torch.manual_seed(cfg.seed)
        vocab = TaggingVocab.build(train_set, cfg.min_freq)
        model = build_model(cfg, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    epoch, step, best, elapsed = 0, 0, -1.0, 0.0
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        epoch, step, best, elapsed = state["epoch"], state["step"], state["best_dev_f1"], state["elapsed_s"]
    print(f"{cfg.model}: {model.num_parameters():,} parameters; train {len(train_set)} / dev {len(dev_set)} "
          f"sentences; vocab {len(vocab.words)} words; threads {torch.get_num_threads()}")
    budget_s = 60 * cfg.time_budget_min
    out_of_time = bool(budget_s) and elapsed >= budget_s
    while epoch < cfg.epochs and not out_of_time:
        start = time.perf_counter()
        model.train()
        total, tokens = 0.0, 0
        bar = tqdm(batches(train_set, vocab, cfg.max_tokens, shuffle=True, seed=cfg.seed * 1000 + epoch),
                   desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch", leave=False, mininterval=5)
        for _, batch in bar:
            if budget_s and elapsed + time.perf_counter() - start >= budget_s:
                out_of_time = True  # end this epoch early: evaluate, checkpoint, stop
                break
            lr = cfg.lr * cfg.lr_decay ** epoch * (min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0)
            for group in opt.param_groups:
                group["lr"] = lr
            loss = model.loss(batch)
            opt.zero_grad()
            loss.backward()
            if cfg.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            step += 1
            total += loss.item() * batch.num_tokens
            tokens += batch.num_tokens
            bar.set_postfix(loss=f"{total / tokens:.4f}", refresh=False)
        train_time = time.perf_counter() - start
        dev = evaluate(model, dev_set, vocab)["overall"]
        epoch += 1
        elapsed += time.perf_counter() - start
        record = {"epoch": epoch, "step": step, "train_loss": total / max(tokens, 1), "dev_precision": dev["precision"],
                  "dev_recall": dev["recall"], "dev_f1": dev["f1"], "epoch_train_s": round(train_time, 1),
                  "elapsed_s": round(elapsed, 1), "time_budget_hit": out_of_time}
        print(json.dumps(record), flush=True)
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        improved = dev["f1"] > best
        best = max(best, dev["f1"])
        ckpt = {"config": asdict(cfg), "vocab": vocab.state_dict(), "model": model.state_dict(),
                "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
                "epoch": epoch, "step": step, "best_dev_f1": best, "elapsed_s": elapsed,
                "num_parameters": model.num_parameters()}
        save_atomic(ckpt, out / "last.pt")
        if improved:
            save_atomic(ckpt, out / "best.pt")
    return {"best_dev_f1": best, "epochs": epoch, "elapsed_s": elapsed, "num_parameters": model.num_parameters()}


def parse_overrides(pairs: Sequence[str]) -> Dict[str, Any]:
    """`--key value` / `--key=value` / `--flag` pairs -> typed TaggingConfig overrides (exits on bad keys)."""
    try:
        return config.parse_overrides(pairs, TaggingConfig)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def train_main(argv: Sequence[str]) -> int:
    args = list(argv)
    resume = "--resume" in args
    if resume:
        args.remove("--resume")
    overrides = parse_overrides(args)
    if resume:
        out = overrides.get("out", TaggingConfig.out)
        base = torch.load(Path(out) / "last.pt", map_location="cpu", weights_only=False)["config"]
        cfg = TaggingConfig(**{**base, **overrides})
    else:
        overrides.setdefault("data_dir", default_data_dir())
        cfg = TaggingConfig(**overrides)
    summary = train(cfg, resume=resume)
    print(json.dumps(summary))
    return 0


def evaluate_main(checkpoint: str, data_dir: str, split: str, output: Optional[str], threads: int = 0) -> int:
    cfg, vocab, model, state = load_checkpoint(checkpoint)
    if threads or cfg.threads:
        torch.set_num_threads(threads or cfg.threads)  # one thread is much faster on a busy 2-core box
    data_dir = data_dir or cfg.data_dir or default_data_dir()
    sentences = load_split(data_dir, "train") if split == "dev" else load_split(data_dir, "test")
    if split == "dev":
        sentences = split_dev(sentences, cfg.dev_fraction, cfg.seed)[1]
    start = time.perf_counter()
    scores = evaluate(model, sentences, vocab)
    print(f"{checkpoint} ({cfg.model}, {state['num_parameters']:,} parameters, epoch {state['epoch']}) "
          f"on {split}: {len(sentences)} sentences in {time.perf_counter() - start:.1f} s")
    print(format_scores(scores))
    if output:
        Path(output).write_text(json.dumps(scores, indent=1) + "\n")
    return 0


def plot_main(runs: Sequence[str], output: str, title: str = "CoNLL-2000 chunking: dev F1") -> int:
    """Dev F1 of several runs (`label=<out dir or metrics.jsonl>`) per epoch and against training
    wall-clock minutes, side by side in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for spec in runs:
        label, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--run expects label=path, got {spec!r}")
        metrics = Path(path) / "metrics.jsonl" if Path(path).is_dir() else Path(path)
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        f1 = [100 * r["dev_f1"] for r in records]
        by_epoch.plot([r["epoch"] for r in records], f1, marker="o", label=label)
        by_time.plot([r["elapsed_s"] / 60 for r in records], f1, marker="o", label=label)
    by_epoch.set_xlabel("epoch (the last one may be cut short by the time budget)")
    by_epoch.set_ylabel("dev chunk F1 (%)")
    by_time.set_xlabel("training wall-clock (min, incl. dev evaluation)")
    for ax in (by_epoch, by_time):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    print(f"wrote {output}")
    return 0
