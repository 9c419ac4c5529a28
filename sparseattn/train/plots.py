"""Plots (matplotlib, PNG): attention maps of one example and, for the UT, ACT steps.

attention_maps     one figure per attention kind (encoder self, decoder self, cross): rows are
                   layers (ACT steps for the UT, where halted rows are blank), columns heads, and
                   a colour bar of the weights (one scale, 0 to 1, for every panel).
                   Weights come from `sparseattn.record_attention` and are scattered into a
                   dense (N_dst, N_src) map from the graph's own edge index, so subgraphs work.
act_steps_map      steps per position for a few test examples, encoder and decoder.
act_steps_epochs   the distribution of steps over nodes, per training epoch.
compare_runs       one validation metric of several runs, per epoch and per minute of training.
loss_curve         a run's training loss (per logged interval) and validation loss (per epoch) by step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .. import AttentionRecord, record_attention


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def dense_weights(graph, weights: torch.Tensor) -> np.ndarray:
    """(E, H) edge weights -> (H, N_dst, N_src) dense maps (0 where there is no edge)."""
    h = weights.shape[1]
    dense = torch.zeros(h, graph.num_dst, graph.num_src)
    dense[:, graph.dst.cpu(), graph.src.cpu()] = weights.detach().float().cpu().t()
    return dense.numpy()


def attention_kind(name: str) -> str:
    """ "encoder", "decoder" or "cross" for a seq2seq model's EdgeAttention module name."""
    if name.endswith("cross_attn"):
        return "cross"
    return "encoder" if name.startswith("enc") else "decoder"


def layer_of(record: AttentionRecord) -> int:
    """The layer of a stack ("decoder.2.self_attn" -> 2), or the ACT step of a shared layer."""
    parts = record.name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else record.call


def attention_maps(
    records: Sequence[AttentionRecord], labels: dict, out_dir: Path, prefix: str = "attention"
) -> List[Path]:
    """records: from `record_attention` around one forward of a seq2seq model; labels: {"src": [...],
    "tgt_in": [...]} token strings for the axes."""
    plt = _pyplot()
    axes_labels = {"encoder": ("src", "src"), "decoder": ("tgt_in", "tgt_in"), "cross": ("tgt_in", "src")}
    paths = []
    for kind in ("encoder", "decoder", "cross"):
        recs = [(kind, layer_of(r), r.graph, r.weights) for r in records if attention_kind(r.name) == kind]
        if not recs:
            continue
        heads = recs[0][3].shape[1]
        fig, axes = plt.subplots(
            len(recs),
            heads,
            figsize=(max(4.8, 2.6 * heads + 1.3), 2.6 * len(recs) + 0.5),
            squeeze=False,
            layout="constrained",  # leaves room for the colour bar shared by every panel
        )
        ylab, xlab = (labels[k] for k in axes_labels[kind])
        image = None
        for row, (_, layer, graph, w) in enumerate(recs):
            maps = dense_weights(graph, w)
            for head in range(heads):
                ax = axes[row, head]
                image = ax.imshow(maps[head], cmap="viridis", vmin=0, vmax=1, aspect="auto")
                ax.set_xticks(range(len(xlab)))
                ax.set_xticklabels(xlab, fontsize=5)
                ax.set_yticks(range(len(ylab)))
                ax.set_yticklabels(ylab, fontsize=5)
                ax.set_title(f"layer/step {layer} head {head}", fontsize=7)
        fig.suptitle(f"{kind} attention (rows: destination, columns: source)", fontsize=9)
        # every panel shares the scale [0, 1] (0 also where there is no edge): one bar for all
        fig.colorbar(image, ax=axes, label="attention weight", shrink=0.9, aspect=max(20, 15 * len(recs)))
        path = out_dir / f"{prefix}_{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def act_steps_map(
    enc_steps: Sequence[np.ndarray],
    dec_steps: Sequence[np.ndarray],
    max_steps: int,
    path: Path,
    src_labels: Sequence[str] = (),
) -> Path:
    """Heatmaps of ACT steps per position (rows: examples), encoder and decoder."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(8, 5))
    for ax, steps, name in ((axes[0], enc_steps, "encoder"), (axes[1], dec_steps, "decoder")):
        width = max(len(s) for s in steps)
        grid = np.full((len(steps), width), np.nan)
        for i, s in enumerate(steps):
            grid[i, : len(s)] = s
        im = ax.imshow(grid, cmap="magma", vmin=1, vmax=max_steps, aspect="auto")
        ax.set_ylabel("example")
        ax.set_yticks(range(len(steps)))
        ax.set_xlabel("position")
        ax.set_title(f"ACT steps per {name} position (mean {np.nanmean(grid):.2f} of max {max_steps})", fontsize=9)
        fig.colorbar(im, ax=ax)
    if len(src_labels):
        axes[0].set_xticks(range(len(src_labels)))
        axes[0].set_xticklabels(src_labels, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def act_steps_epochs(history: list, path: Path) -> Path:
    """Fraction of nodes that took k steps (columns) in each training epoch (rows)."""
    plt = _pyplot()
    hists = [
        np.asarray(r["train"]["act_steps_hist"], dtype=float)
        for r in history
        if r.get("train") and "act_steps_hist" in r["train"]
    ]
    if not hists:
        raise ValueError("no ACT step histograms in the training history")
    grid = np.stack([h[1:] / h[1:].sum() for h in hists])  # (epochs, max_steps)
    means = [(h * np.arange(len(h))).sum() / h.sum() for h in hists]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    im = axes[0].imshow(
        grid, cmap="Blues", aspect="auto", origin="lower", extent=(0.5, grid.shape[1] + 0.5, 0.5, grid.shape[0] + 0.5)
    )
    axes[0].set_xlabel("ACT steps")
    axes[0].set_ylabel("epoch")
    axes[0].set_title("share of nodes by steps taken", fontsize=9)
    fig.colorbar(im, ax=axes[0])
    axes[1].plot(range(1, len(means) + 1), means, marker="o")
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("mean ACT steps (training)")
    axes[1].set_ylim(0, grid.shape[1] + 0.5)
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_runs(
    runs: Dict[str, list], metric: str, path: Path, title: Optional[str] = None, error: bool = False
) -> Path:
    """Validation `metric` of each run (label -> its "valid" metrics records) against the epoch
    and against the training wall-clock minutes (validation included); fractions in [0, 1] are
    shown as percentages. error=True plots 100 * (1 - metric) on a log scale instead, which
    separates runs whose accuracies all sit near 100%. Raises KeyError naming a run whose records
    lack the metric, ValueError when error=True and the metric is not a fraction."""
    plt = _pyplot()
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for label, records in runs.items():
        if not records or any(metric not in r["valid"] for r in records):
            raise KeyError(f"run {label!r} has no validation records with that key")
        values = np.array([float(r["valid"][metric]) for r in records])
        fraction = values.min() >= 0 and values.max() <= 1
        if error and not fraction:
            raise ValueError(f"error=True needs a metric in [0, 1]; run {label!r} has {metric} up to {values.max():g}")
        shown = 100.0 * (1.0 - values) if error else 100.0 * values if fraction else values
        by_epoch.plot([r["epoch"] for r in records], shown, marker="o", label=label)
        by_time.plot([r["time_s"] / 60 for r in records], shown, marker="o", label=label)
    by_epoch.set_xlabel("epoch (the last one may be cut short by a time budget)")
    by_epoch.set_ylabel(
        f"validation error, 100 - {metric} (%)" if error else f"validation {metric}" + (" (%)" if fraction else "")
    )
    by_time.set_xlabel("training wall-clock (min, validation included)")
    for ax in (by_epoch, by_time):
        ax.grid(alpha=0.3)
        ax.legend()
        if error:
            ax.set_yscale("log")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def loss_curve(records: Sequence[dict], path: Path) -> Path:
    """Training loss of each "train" record and validation loss of each "valid" record of a run's
    metrics.jsonl, against the optimizer step. Raises ValueError when there are no losses."""
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train" and "loss" in r]
    valid = [
        (r["step"], r["valid"]["loss"]) for r in records if r.get("kind") == "valid" and "loss" in r.get("valid", {})
    ]
    if not train and not valid:
        raise ValueError("no training or validation losses in the records")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if train:
        ax.plot(*zip(*train), label="training (per logged interval)", lw=1)
    if valid:
        ax.plot(*zip(*valid), marker="o", label="validation (per epoch)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss per target token")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@torch.no_grad()
def seq2seq_plots(task, model, cfg, out_dir, history: list, example: int = 0, num_examples: int = 12) -> List[Path]:
    """Attention maps of test example `example` (teacher-forced on its reference) and, for an ACT
    model, the step maps of `num_examples` test examples and the step distribution per epoch."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    src, tgt = task.splits["test"]
    batch = task.make_batch("test", [example], device)
    with record_attention(model) as records:
        out = model(batch)
    labels = {"src": task.src_vocab.decode(src[example]), "tgt_in": ["<s>"] + task.tgt_vocab.decode(tgt[example])}
    paths = attention_maps(records, labels, out_dir)
    if "act_steps_enc" in out.stats:
        idx = list(range(min(num_examples, len(src))))
        many = task.make_batch("test", idx, device)
        stats = model(many).stats
        enc = [s.cpu().numpy() for s in many.enc_graph.split_dst(stats["act_steps_enc"])]
        dec = [s.cpu().numpy() for s in many.dec_graph.split_dst(stats["act_steps_dec"])]
        paths.append(act_steps_map(enc, dec, model.max_steps, out_dir / "act_steps_per_position.png"))
        if any(r.get("train") and "act_steps_hist" in r["train"] for r in history):
            paths.append(act_steps_epochs(history, out_dir / "act_steps_by_epoch.png"))
    model.train(was_training)
    return paths
