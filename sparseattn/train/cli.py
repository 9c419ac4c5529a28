"""The command line: `sparseattn <command>` (also `python -m sparseattn <command>`).

    sparseattn demo                                                           # EdgeAttention vs padded MHA
    sparseattn train --task copy --out runs/copy                              # preset configs/copy-transformer.toml
    sparseattn train --task sort --model ut --out runs/sort --epochs=30       # preset + overrides
    sparseattn train --config configs/sort-ut.toml --out runs/s2 --d_ff=512   # any preset file
    sparseattn train --task chunking --model bilstm --data-dir ../shared/data --out runs/b --time_budget_min=14
    sparseattn train --out runs/copy --resume [--epochs=8]                    # continue exactly
    sparseattn evaluate --checkpoint runs/copy/checkpoint.pt [--beam 4] [--json]
    sparseattn plot --checkpoint runs/copy/checkpoint.pt [--out DIR]
    sparseattn compare --run BiLSTM=runs/b --run Tagger=runs/t --metric f1 --output f1.png
    sparseattn translate --checkpoint runs/m30k/checkpoint.pt "A dog runs."
    sparseattn configs                                                        # the preset files
    torchrun --nproc_per_node=N -m sparseattn train ...                       # DDP (distributed.py)

`sparseattn train --help [--task T --model M]` lists every config key with its type, default and
help. trainer.py says what a run directory holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from . import checkpoint as ckpt_io
from .config import (
    DEFAULT_MODELS,
    MAX_BEAM,
    MAX_LEN_A,
    MAX_LEN_B,
    Config,
    check_run_values,
    config_from_dict,
    describe,
    list_presets,
    make_config,
    parse_flags,
    read_toml,
    with_overrides,
)
from .metrics import read_metrics
from .runlock import make_run_dir, run_dir_lock
from .tasks import get_task
from .trainer import Trainer, resolve_device


def train_main(argv: List[str]) -> int:
    resume = "--resume" in argv
    argv = [a for a in argv if a != "--resume"]
    config_file = None
    # --config=FILE, the --key=value form every other flag takes, as --config FILE
    argv = [part for a in argv for part in (a.split("=", 1) if a.startswith("--config=") else [a])]
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 == len(argv) or not argv[i + 1]:
            raise ValueError("--config needs a FILE")
        config_file = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if "-h" in argv or "--help" in argv:
        flags = parse_flags([a for a in argv if a not in ("-h", "--help")])
        task = flags.get("task", "copy")
        lines = describe(task, flags.get("model", DEFAULT_MODELS.get(task, "transformer")))
        print(__doc__)
        print("config keys (defaults, before presets):\n" + "\n".join(lines))
        return 0
    overwrite = "--overwrite" in argv
    argv = [a for a in argv if a != "--overwrite"]
    flags = parse_flags(argv)
    if resume and overwrite:
        raise ValueError("--resume continues a run and --overwrite replaces it: pass one of them")
    if resume:
        if "out" not in flags:
            raise ValueError("--resume needs --out RUN_DIR")
        out = Path(flags["out"])
        if not (out / "checkpoint.pt").is_file():
            raise FileNotFoundError(f"no checkpoint at {out / 'checkpoint.pt'}: --resume continues a run saved there")
    else:
        cfg = make_config(flags, config_file)  # every check before anything touches the disk
        if not cfg.run.out:
            raise ValueError("--out RUN_DIR is required (where the run's checkpoints, logs and plots go)")
        out = Path(cfg.run.out)
    from . import distributed

    # one run per folder: rank 0 holds the folder's lock (the other ranks of a torchrun job share it)
    with run_dir_lock(out) if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        if resume:
            cfg = resumed_config(out / "checkpoint.pt", flags, config_file)
        elif int(os.environ.get("RANK", "0")) == 0:
            prepare_run_dir(out, overwrite)
        try:
            if distributed.launched_by_torchrun():
                distributed.init_from_env(cfg)
                trainer: Trainer = distributed.DistributedTrainer(cfg, resume=resume)
            else:
                trainer = Trainer(cfg, resume=resume)
            return _run(trainer)
        finally:
            distributed.cleanup()


def resumed_config(ckpt_path: Path, flags: Dict[str, str], config_file: Optional[str]) -> Config:
    """The config a resumed run continues with: the checkpoint's, with the flags' (and --config's)
    run keys applied; a changed task or model is refused."""
    saved = config_from_dict(ckpt_io.load(ckpt_path)["config"], ckpt_path)
    if config_file:  # its keys count as flags: run keys apply, changed task or model keys are refused
        flags = {**read_toml(Path(config_file)), **flags}
    for key in ("task", "model"):  # the original command with --resume appended repeats them
        given = flags.pop(key, None)
        if given is not None and given != getattr(saved, key):
            raise ValueError(
                f"--resume cannot change --{key} of {ckpt_path} ({getattr(saved, key)!r} -> {given!r}); "
                "start a new run with another --out"
            )
    cfg = with_overrides(saved, flags)
    refuse_changed_keys(saved, cfg, ckpt_path)
    return cfg


RUN_FILES = ("checkpoint.pt", "best.pt", "metrics.jsonl", "config.json", "results.json", "tokenizer.json")


def prepare_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse to train into a folder that holds a run unless `overwrite`, which deletes that run:
    its files, and only the temporary and output files a run writes (`*.tmp` of its own files,
    hypotheses, plots), never other files of the user's."""
    make_run_dir(out)
    found = [name for name in RUN_FILES if (out / name).exists()]
    if not found:
        return
    if not overwrite:
        raise ValueError(
            f"--out {out} already holds a run ({', '.join(found)}): continue it with --resume, or "
            "replace it with --overwrite"
        )
    for name in found:
        (out / name).unlink(missing_ok=True)
    temps = [path for name in RUN_FILES for path in out.glob(f"{name}.*tmp")]  # save_atomic's and the tokenizer's
    for stale in [*temps, *out.glob("hyp.*.de"), *(out / "plots").glob("*.png")]:
        stale.unlink(missing_ok=True)


def refuse_changed_keys(saved, cfg, path: Path) -> None:
    """--resume may change run keys (epochs, time budget, batch size, ...), not the task or model."""
    changed = [
        f"--{k} ({old!r} -> {new!r})"
        for section in ("task_cfg", "model_cfg")
        for k, old in dataclasses.asdict(getattr(saved, section)).items()
        if (new := getattr(getattr(cfg, section), k)) != old
    ]
    if changed:
        raise ValueError(
            f"--resume cannot change the task or model of {path}: {', '.join(changed)}; start a new run "
            "with another --out to train a different one"
        )


def _run(trainer: Trainer) -> int:
    cfg, run = trainer.cfg, trainer.cfg.run
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if trainer.main_process:
        world = getattr(trainer, "world_size", 1)
        print(
            f"task {cfg.task}, model {cfg.model} ({n_params:,} parameters), {trainer.device}"
            f"{f' x {world} processes' if world > 1 else ''}, out {run.out}",
            file=sys.stderr,
        )
    status = trainer.fit()
    if status == "interrupted":
        return 130
    if status == "time_budget" and trainer.main_process:
        print(
            f"time budget of {run.time_budget_min:g} min reached at step {trainer.position['step']} "
            f"(epoch {trainer.position['epoch']}, cut short); testing",
            file=sys.stderr,
        )
    if status == "max_steps":
        if trainer.main_process:
            print(f"stopped at max_steps={run.max_steps}; checkpoint {trainer.ckpt_path}", file=sys.stderr)
        return 0
    if not trainer.main_process:
        return 0
    results = trainer.finish()
    if "f1" in results:
        print(
            f"test: chunk F1 {100 * results['f1']:.2f} (precision {100 * results['precision']:.2f}, recall "
            f"{100 * results['recall']:.2f}); trained {results['train_seconds']:.0f} s"
        )
    elif "bleu" in results:
        print(
            f"test: BLEU {results['bleu']:.2f} (beam {run.beam}, alpha {run.alpha}); "
            f"trained {results['train_seconds']:.0f} s"
        )
    else:
        print(
            f"test: token accuracy {results['token_accuracy']:.4f}, sequence accuracy "
            f"{results['sequence_accuracy']:.4f} (decoded, beam {run.beam}); trained {results['train_seconds']:.0f} s"
        )
    if "best_epoch" in results:
        print(f"(weights of epoch {results['best_epoch']}, the best on the validation split: {trainer.best_path})")
    if results.get("plots"):
        print(f"plots: {run.out}/plots/ ({', '.join(Path(p).name for p in results['plots'])})")
    return 0


def load_for_eval(path: str, device: str = "auto", need_data: bool = True, need: Optional[str] = None):
    """(cfg, task, model, checkpoint dict) of a checkpoint file, the model in eval mode. With
    ema weights (checkpoint.pt of an --ema_decay run) the model holds the averages, as training
    evaluated them. need_data=False skips reading the task's data (decoding new input needs only
    the vocabulary, which the checkpoint holds). need: a method the task must have (translate),
    checked before the model is built. Anything wrong with the file is one ValueError naming it."""
    target = resolve_device(device)
    state = ckpt_io.load(path)
    cfg = config_from_dict(state["config"], Path(path))
    cfg.run.out = str(Path(path).parent)  # run files (tokenizer.json, hypotheses) live next to the checkpoint
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task = get_task(cfg.task)
    if need is not None and not hasattr(task, need):
        raise ValueError(f"{path} is a {cfg.task!r} checkpoint: that task does not {need} text")
    if need_data:
        task.setup(cfg)
    task.load_state_dict(state.get("task_state", {}))
    model = cfg.model_cfg.build(task.model_info())
    weights = [state["model"], *([state["ema"]["average"]] if "ema" in state else [])]
    if ckpt_io.non_finite(weights):
        raise ValueError(f"{path} holds NaN or infinite weights; they would only produce NaN")
    ckpt_io.load_weights(model, state["model"], path)
    if "ema" in state:
        ckpt_io.load_weights(model, state["ema"]["average"], path, strict=False)
    model.to(target).eval()
    return cfg, task, model, state


def decoding_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the options of commands that decode with a checkpoint (see load_for_decoding)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--beam", type=int, default=None, help=f"beam size (default: the run's, 1 = greedy; <= {MAX_BEAM})")
    p.add_argument("--alpha", type=float, default=None, help="length penalty exponent")
    p.add_argument(
        "--max_len_a",
        type=float,
        default=None,
        help=f"decode at most a * source length + b tokens (a <= {MAX_LEN_A:g})",
    )
    p.add_argument("--max_len_b", type=int, default=None, help=f"see --max_len_a (b <= {MAX_LEN_B})")
    p.add_argument("--device", default="auto")
    return p


def load_for_decoding(args: argparse.Namespace, need_data: bool = True, need: Optional[str] = None):
    """(cfg, task, model) of args.checkpoint on args.device, with --beam/--alpha/--max_len_* applied
    to cfg and checked as config keys are (range and finiteness)."""
    given = {name: getattr(args, name) for name in ("beam", "alpha", "max_len_a", "max_len_b")}
    given = {name: value for name, value in given.items() if value is not None}
    check_run_values(given)
    cfg, task, model, _ = load_for_eval(args.checkpoint, args.device, need_data, need)
    for name, value in given.items():
        setattr(cfg.run, name, value)
    return cfg, task, model


def evaluate_main(argv: List[str]) -> int:
    p = decoding_parser("sparseattn evaluate", "decoded metrics of a checkpoint")
    p.add_argument("--split", default="test")
    p.add_argument("--json", action="store_true", help="print one JSON object of metrics")
    args = p.parse_args(argv)
    cfg, task, model = load_for_decoding(args)
    if args.split not in task.split_names():
        raise ValueError(f"--split {args.split!r}: task {cfg.task} has the splits {', '.join(task.split_names())}")
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
    p = argparse.ArgumentParser(
        prog="sparseattn compare",
        description="a validation metric of several runs per epoch and per minute of training",
    )
    p.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR", help="repeatable")
    p.add_argument("--metric", default="f1", help="a key of the runs' validation records (default: f1)")
    p.add_argument("--output", required=True, help="PNG path")
    p.add_argument("--title", default=None)
    p.add_argument(
        "--error", action="store_true", help="plot 100 - metric (%%) on a log scale (for accuracies near 100%%)"
    )
    args = p.parse_args(argv)
    from .plots import compare_runs

    runs = {}
    for spec in args.run:
        label, eq, run_dir = spec.partition("=")
        if not eq or not label or not run_dir:
            raise ValueError(f"--run expects LABEL=RUN_DIR, got {spec!r}")
        path = Path(run_dir) / "metrics.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"--run {spec!r}: no metrics.jsonl in {run_dir}")
        runs[label] = [r for r in read_metrics(path) if r.get("kind") == "valid"]
    try:
        print(compare_runs(runs, args.metric, Path(args.output), args.title, error=args.error))
    except (KeyError, ValueError) as e:
        raise ValueError(f"--metric {args.metric!r}: {e.args[0]}") from None
    return 0


def translate_main(argv: List[str]) -> int:
    """Print one translation per sentence given (or per line of stdin when none is; a blank line
    gives a blank line), decoded with the run's beam and length penalty unless --beam/--alpha say
    otherwise."""
    p = decoding_parser("sparseattn translate", "translate sentences with a checkpoint")
    p.add_argument("sentences", nargs="*", help="source sentences (default: read lines from stdin)")
    args = p.parse_args(argv)
    cfg, task, model = load_for_decoding(args, need_data=False, need="translate")
    if args.sentences:
        sentences = args.sentences
    else:
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"standard input is not UTF-8 text (byte {e.object[e.start]:#x} at offset {e.start})"
            ) from None
        sentences = text.splitlines()
    # one output line per input line: a blank line stays blank, so outputs line up with inputs
    todo = [i for i, line in enumerate(sentences) if line.strip()]
    translated = dict(zip(todo, task.translate(model, [sentences[i] for i in todo], cfg)))
    for i in range(len(sentences)):
        print(translated.get(i, ""))
    return 0


def configs_main(argv: List[str]) -> int:
    argparse.ArgumentParser(prog="sparseattn configs", description="list the preset files").parse_args(argv)
    for name, about in list_presets():
        print(f"{name:<28} {about}")
    return 0


def demo_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sparseattn demo", description="EdgeAttention on a batched graph vs padded, masked nn.MultiheadAttention"
    )
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("sequences", "dim", "heads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.dim % args.heads:
        raise ValueError(f"--heads={args.heads} must divide --dim={args.dim}")
    from .. import EdgeAttention, graphs

    torch.manual_seed(args.seed)
    lengths = torch.randint(5, 51, (args.sequences,)).tolist()
    g = graphs.batch([graphs.complete(n) for n in lengths])  # block-diagonal, no padding
    attn = EdgeAttention(args.dim, args.heads, clamp=None)
    x = torch.randn(g.num_dst, args.dim)
    attn(x, g)  # the first call pays one-off costs (backend probe, graph caches)
    start = time.perf_counter()
    out = attn(x, g)
    elapsed = time.perf_counter() - start
    mha = torch.nn.MultiheadAttention(args.dim, args.heads, batch_first=True)
    mha.load_state_dict(attn.state_dict())
    padded = torch.nn.utils.rnn.pad_sequence(list(g.split_dst(x)), batch_first=True)
    pad_mask = torch.arange(padded.shape[1])[None] >= torch.tensor(lengths)[:, None]
    ref, _ = mha(padded, padded, padded, key_padding_mask=pad_mask)
    ref = torch.cat([r[:n] for r, n in zip(ref, lengths)])
    print(f"{len(lengths)} sequences, {g.num_dst} tokens, {g.num_edges} edges, backend {attn.backend!r}")
    print(
        f"EdgeAttention forward: {elapsed * 1e3:.1f} ms; max |diff| vs padded nn.MultiheadAttention: "
        f"{(out - ref).abs().max().item():.2e}"
    )
    return 0


COMMANDS: Dict[str, Callable[[List[str]], int]] = {
    "train": train_main,
    "evaluate": evaluate_main,
    "plot": plot_main,
    "compare": compare_main,
    "translate": translate_main,
    "configs": configs_main,
    "demo": demo_main,
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"sparseattn: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    name = argv[0]
    try:
        return COMMANDS[name](argv[1:])
    except (OSError, ValueError) as e:  # a bad flag, a missing or unreadable file, a full disk: one line
        print(f"sparseattn {name}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before training's own handler is installed (start-up, decoding)
        print(f"sparseattn {name}: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, MemoryError) as e:
        if not _out_of_memory(e):
            raise
        print(
            f"sparseattn {name}: out of memory ({ckpt_io.first_line(e)[:200]}); lower --batch_size or --max_tokens, "
            "--eval_batch_size or --beam, or the model's size (--d_model, --d_ff, --num_layers)",
            file=sys.stderr,
        )
        return 2


def _out_of_memory(e: BaseException) -> bool:
    """An allocation failure (CPU or CUDA), as opposed to a bug that should show its traceback."""
    text = str(e)
    return (
        isinstance(e, MemoryError)
        or isinstance(e, getattr(torch, "OutOfMemoryError", ()))
        or "can't allocate memory" in text
        or "out of memory" in text.lower()
    )
