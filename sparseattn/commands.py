"""The commands that drive training: train, evaluate, plot and compare.

    sparseattn train --task copy --model transformer --out runs/copy            # the seed's demo
    sparseattn train --task sort --model ut --out runs/sort --epochs=30         # presets + overrides
    sparseattn train --task chunking --model bilstm --out runs/b --time_budget_min=14
    sparseattn train --out runs/copy --resume [--epochs=8]                     # continue exactly
    sparseattn evaluate --checkpoint runs/copy/checkpoint.pt [--beam 4] [--json]
    sparseattn plot --checkpoint runs/copy/checkpoint.pt [--out DIR]
    sparseattn compare --run BiLSTM=runs/b --run Tagger=runs/t --metric f1 --output f1.png
    torchrun --nproc_per_node=N -m sparseattn train ...                        # DDP (distributed.py)

See train.py for what a run directory holds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

import torch

from . import checkpoint as ckpt_io
from .config import config_from_checkpoint, describe, make_config, parse_overrides
from .data.tasks import get_task
from .models import model_from_checkpoint
from .train import Trainer, resolve_device


def train_main(argv: List[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("config keys (defaults before presets):\n" + "\n".join(describe()))
        return 0
    resume = "--resume" in argv
    try:
        overrides = parse_overrides([a for a in argv if a != "--resume"])
    except ValueError as e:
        raise SystemExit(f"sparseattn train: {e}") from None
    if resume:
        if "out" not in overrides:
            raise SystemExit("--resume needs --out RUN_DIR")
        saved = ckpt_io.load(Path(str(overrides["out"])) / "checkpoint.pt")["config"]
        cfg = config_from_checkpoint(saved, overrides)
    else:
        cfg = make_config(overrides)
    from . import distributed
    try:
        if distributed.launched_by_torchrun():
            distributed.init_from_env(cfg)
            trainer: Trainer = distributed.DistributedTrainer(cfg, resume=resume)
        else:
            trainer = Trainer(cfg, resume=resume)
    except ValueError as e:  # a setting the model, the EMA or the checkpoint rejects
        distributed.cleanup()
        raise SystemExit(f"sparseattn train: {e}") from None
    try:
        return _run(trainer)
    finally:
        distributed.cleanup()


def _run(trainer: Trainer) -> int:
    cfg = trainer.cfg
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if trainer.main_process:
        world = getattr(trainer, "world_size", 1)
        print(f"task {cfg.task}, model {cfg.model} ({n_params:,} parameters), {trainer.device}"
              f"{f' x {world} processes' if world > 1 else ''}, out {cfg.out}", file=sys.stderr)
    status = trainer.fit()
    if status == "interrupted":
        return 130
    if status == "time_budget" and trainer.main_process:
        print(f"time budget of {cfg.time_budget_min:g} min reached at step {trainer.position['step']} "
              f"(epoch {trainer.position['epoch']}, cut short); testing", file=sys.stderr)
    if status == "max_steps":
        if trainer.main_process:
            print(f"stopped at max_steps={cfg.max_steps}; checkpoint {trainer.ckpt_path}", file=sys.stderr)
        return 0
    if not trainer.main_process:
        return 0
    results = trainer.finish()
    if "f1" in results:
        print(f"test: chunk F1 {100 * results['f1']:.2f} (precision {100 * results['precision']:.2f}, recall "
              f"{100 * results['recall']:.2f}); trained {results['train_seconds']:.0f} s")
    elif "bleu" in results:
        print(f"test: BLEU {results['bleu']:.2f} (beam {cfg.beam}, alpha {cfg.alpha}); "
              f"trained {results['train_seconds']:.0f} s")
    else:
        print(f"test: token accuracy {results['token_accuracy']:.4f}, sequence accuracy "
              f"{results['sequence_accuracy']:.4f} (decoded, beam {cfg.beam}); trained {results['train_seconds']:.0f} s")
    if "best_epoch" in results:
        print(f"(weights of epoch {results['best_epoch']}, the best on the validation split: {trainer.best_path})")
    if results.get("plots"):
        print(f"plots: {cfg.out}/plots/ ({', '.join(Path(p).name for p in results['plots'])})")
    return 0


def load_for_eval(path: str, device: str = "auto"):
    """(cfg, task, model) from a checkpoint file, model in eval mode."""
    state = ckpt_io.load(path)
    cfg = config_from_checkpoint(state["config"])
    cfg.out = str(Path(path).parent)  # run files (tokenizer.json, hypotheses) live next to the checkpoint
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task)
    task.setup(cfg)
    task.load_state_dict(state.get("task_state", {}))
    model = model_from_checkpoint(state["model_name"], state["model_kwargs"])
    model.load_state_dict(state["model"])
    if "ema" in state:  # checkpoint.pt of an --ema_decay run: evaluate the averaged weights, as training did
        model.load_state_dict(state["ema"]["average"], strict=False)
    model.to(resolve_device(device)).eval()
    return cfg, task, model, state


def decoding_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the options of commands that decode with a checkpoint (see load_for_decoding)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the run's, 1 = greedy)")
    p.add_argument("--alpha", type=float, default=None, help="length penalty exponent")
    p.add_argument("--device", default="auto")
    return p


def load_for_decoding(args: argparse.Namespace):
    """(cfg, task, model) of args.checkpoint on args.device, with --beam/--alpha applied to cfg."""
    cfg, task, model, _ = load_for_eval(args.checkpoint, args.device)
    if args.beam is not None:
        cfg.beam = args.beam
    if args.alpha is not None:
        cfg.alpha = args.alpha
    return cfg, task, model


def evaluate_main(argv: List[str]) -> int:
    p = decoding_parser("sparseattn evaluate", "decoded metrics of a checkpoint")
    p.add_argument("--split", default="test")
    p.add_argument("--json", action="store_true", help="print one JSON object of metrics")
    args = p.parse_args(argv)
    cfg, task, model = load_for_decoding(args)
    metrics = task.evaluate(model, args.split, cfg, decode=True)
    if args.json:
        print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, list)}))
    else:
        for k, v in metrics.items():
            if not isinstance(v, list):
                print(f"{k:>18}: {v:.4f}")
    return 0


def plot_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="sparseattn plot", description="attention and ACT plots of a checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", default=None, help="folder for the PNGs (default: RUN_DIR/plots)")
    args = p.parse_args(argv)
    cfg, task, model, state = load_for_eval(args.checkpoint, "cpu")
    out = Path(args.out) if args.out else Path(args.checkpoint).parent / "plots"
    for path in task.plot(model, cfg, out, state.get("history", [])):
        print(path)
    return 0


def compare_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="sparseattn compare",
                                description="a validation metric of several runs per epoch and per minute of training")
    p.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR", help="repeatable")
    p.add_argument("--metric", default="f1", help="a key of the runs' validation records (default: f1)")
    p.add_argument("--output", required=True, help="PNG path")
    p.add_argument("--title", default=None)
    p.add_argument("--error", action="store_true", help="plot 100 - metric (%%) on a log scale (for accuracies near 100%%)")
    args = p.parse_args(argv)
    from .plots import compare_runs
    runs = {}
    for spec in args.run:
        label, eq, run_dir = spec.partition("=")
        if not eq or not label or not run_dir:
            raise SystemExit(f"sparseattn compare: --run expects LABEL=RUN_DIR, got {spec!r}")
        path = Path(run_dir) / "metrics.jsonl"
        if not path.is_file():
            raise SystemExit(f"sparseattn compare: --run {spec!r}: no metrics.jsonl in {run_dir}")
        runs[label] = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "valid"]
    try:
        print(compare_runs(runs, args.metric, Path(args.output), args.title, error=args.error))
    except (KeyError, ValueError) as e:
        raise SystemExit(f"sparseattn compare: --metric {args.metric!r}: {e.args[0]}") from None
    return 0
