"""The command line: `sparseattn <command>` (also `python -m sparseattn <command>`).

    sparseattn demo                                                      # EdgeAttention vs padded MHA
    sparseattn train --task copy --out runs/copy                         # the preset copy-transformer
    sparseattn train --task sort --model ut --out runs/sort --epochs=30  # a preset + overrides
    sparseattn train --config my.toml --out runs/s2 --d_ff=512           # a preset file of yours
    sparseattn train --out runs/copy --resume [--epochs=8]               # continue a run exactly
    sparseattn evaluate runs/copy [--beam 4] [--json]                    # decoded test metrics
    sparseattn plot runs/copy [--out DIR]                                # attention maps, loss curve
    sparseattn translate runs/m30k "A dog runs."                         # a multi30k run
    sparseattn compare --run A=runs/a --run B=runs/b --output f1.png     # runs side by side
    sparseattn configs                                                   # the presets
    torchrun --nproc_per_node=N -m sparseattn train ...                  # several processes (DDP)

evaluate, plot and translate take a run folder (its best.pt, else its checkpoint.pt) or a .pt
file, first or as --checkpoint PATH. `sparseattn train --help [--task T --model M] [--key=value
...]` lists every config key with the value that run would use, its type and help; `sparseattn
COMMAND --help` the other commands'.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import textwrap
import typing
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from . import checkpoint as ckpt_io
from . import translate_io
from .config import (
    Clamp,
    Config,
    config_from_dict,
    list_presets,
    make_config,
    parse_flags,
    read_toml,
    with_overrides,
)
from .demo import demo_main
from .loading import checkpoint_from, checkpoint_parser, decoding_parser, load_for_decoding, load_for_eval
from .metrics import read_metrics
from .run_folder import check_one_run, check_run_dir, remove_staging, settle, staging_dir
from .runlock import run_dir_lock
from .trainer import Trainer

RUN_FOLDER = """\
A run folder (--out RUN_DIR) holds:
  config.json     the run's whole config (task, model, run, task_config, model_config)
  checkpoint.pt   the last saved state (weights, optimizer, RNG, data position), written at each
                  epoch end, every checkpoint_every steps, at max_steps, when the time budget runs
                  out and on Ctrl-C; `sparseattn train --out RUN_DIR --resume` continues from it
  best.pt         the weights of the best validation epoch (keep_best): the final test and plots
                  use them, and so do evaluate, plot and translate when given the folder
  metrics.jsonl   one JSON object per line: kind "train" every log_every steps, "valid" each
                  epoch, "test" at the end
  results.json    the decoded test metrics (and best_epoch)
  plots/          attention maps (ACT steps for the UT, F1 per epoch for chunking), loss.png
  tokenizer.json  multi30k: the subword vocabulary; hyp.test.de (hyp.SPLIT.de of evaluate): the
                  decoded translations
  .lock           held while a run writes there: one run per folder
  .new-run/       an --overwrite run until its first epoch ends; then it replaces the old run, in one
                  step (an interrupt before that discards it and keeps the old run)
With ema_decay > 0 the evaluated weights (best.pt, the test) are the moving average."""

TRAIN_USAGE = """\
usage: sparseattn train [--task T] [--model M] [--config FILE|PRESET] --out RUN_DIR
                        [--key=value ...] [--overwrite]
       sparseattn train --out RUN_DIR --resume [--key=value ...]
       torchrun --nproc_per_node=N -m sparseattn train ...

--overwrite replaces the run RUN_DIR holds once the new one has finished its first epoch (a start
that fails or is interrupted before leaves it as it was); --resume continues it exactly (flags may
change run keys, not the task or model); torchrun trains on several processes (DistributedDataParallel).
A run's values: each key's default <- the preset of --task and --model (or --config: a TOML file
or a preset's name; `sparseattn configs` lists them) <- the --key=value flags (also --key value;
a bare --flag means true)."""


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
    overwrite = "--overwrite" in argv
    argv = [a for a in argv if a != "--overwrite"]
    if "-h" in argv or "--help" in argv:
        print(train_help(parse_flags([a for a in argv if a not in ("-h", "--help")]), config_file, resume))
        return 0
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

    rank0 = int(os.environ.get("RANK", "0")) == 0
    # an --overwrite run sets up and trains beside the old run until its first epoch ends (run_folder.py)
    staging = staging_dir(out) if overwrite else None
    # one run per folder: rank 0 holds the folder's lock (the other ranks of a torchrun job share it)
    with run_dir_lock(out) if rank0 else nullcontext():
        if rank0:
            settle(out)
        if resume:
            if rank0:
                check_one_run(out)  # a folder mixing two runs' files is not continued
            cfg = resumed_config(out / "checkpoint.pt", flags, config_file)
        elif rank0:
            check_run_dir(out, overwrite)
        trainer: Optional[Trainer] = None
        try:
            if distributed.launched_by_torchrun():
                distributed.init_from_env(cfg)
                trainer = distributed.DistributedTrainer(cfg, resume=resume, staging=staging)
            else:
                trainer = Trainer(cfg, resume=resume, staging=staging)
            return _run(trainer)
        finally:
            distributed.cleanup(trainer)
            if staging is not None and rank0:
                remove_staging(out)  # a start that failed or was interrupted before it started: the old run stays


def train_help(flags: Dict[str, str], config_file: Optional[str], resume: bool) -> str:
    """`sparseattn train --help`: usage, what a run folder holds, the preset applied and every key
    with the value the run given by these flags would use (the preset's where it sets one)."""
    if resume and "out" in flags:
        ckpt = Path(flags["out"]) / "checkpoint.pt"
        if not ckpt.is_file():
            raise FileNotFoundError(f"no checkpoint at {ckpt}: --resume continues a run saved there")
        cfg = resumed_config(ckpt, dict(flags), config_file)
        base = config_from_dict(ckpt_io.load(ckpt)["config"], ckpt)
        origin = f"resumes: {ckpt}, task {cfg.task}, model {cfg.model} (its config, the flags' run keys applied)"
        base_label = "saved"
    else:
        cfg = make_config(flags, config_file)  # the run's values, checked as the run checks them
        base = make_config({k: v for k, v in flags.items() if k in ("task", "model")}, config_file)
        origin = preset_line(cfg.task, cfg.model, config_file)
        base_label = "preset"
    sources: Dict[str, str] = {}
    for section, base_section in zip(cfg.sections().values(), base.sections().values()):
        for f in dataclasses.fields(section):
            if f.name in flags:
                sources[f.name] = "flag"
            elif getattr(base_section, f.name) != field_default(f):
                sources[f.name] = base_label
    return "\n\n".join(
        [
            TRAIN_USAGE,
            RUN_FOLDER,
            origin,
            "\n".join(config_table(cfg, sources)),
        ]
    )


def preset_line(task: str, model: str, config_file: Optional[str]) -> str:
    """Which preset a run of task and model without --config starts from (or the --config file)."""
    if config_file:
        return f"preset: {config_file} (--config), task {task}, model {model}"
    for name, about in list_presets():
        if Path(name).stem == f"{task}-{model}":
            line = f"preset: {Path(name).stem} ({name}, one of `sparseattn configs`), task {task}, model {model}"
            return "\n  ".join([line, *textwrap.wrap(about, terminal_width() - 2)]) if about else line
    return f"preset: none for task {task} and model {model} (`sparseattn configs` lists the presets)"


def terminal_width() -> int:
    """The width help text wraps to: the terminal's ($COLUMNS, else 100 when not a terminal), at least 80."""
    return max(80, shutil.get_terminal_size((100, 24)).columns)


def field_default(f: Any) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def flag_text(value: Any) -> str:
    """A value as a flag would give it: none, true/false, lo,hi for a clamp."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def config_table(cfg: Config, sources: Dict[str, str], width: Optional[int] = None) -> List[str]:
    """Every key of cfg by section, in aligned columns: --key=value (the run's value), type, where
    the value comes from (preset, flag, saved; blank for the key's default), help ([default: X]
    where the value differs), wrapped to `width` (the terminal's)."""
    width = width or terminal_width()
    rows: List[Tuple[str, str, str, str]] = []
    titles: Dict[int, str] = {}
    for title, section in (("run", cfg.run), (f"task {cfg.task}", cfg.task_cfg), (f"model {cfg.model}", cfg.model_cfg)):
        titles[len(rows)] = f"{title} ({type(section).__name__}):"
        hints = typing.get_type_hints(type(section))
        for f in dataclasses.fields(section):
            value, default = getattr(section, f.name), field_default(f)
            typ = "clamp" if hints[f.name] == Clamp else getattr(hints[f.name], "__name__", str(hints[f.name]))
            about = f.metadata.get("help", "")
            if value != default:
                about += f" [default: {flag_text(default) or chr(34) * 2}]"
            rows.append((f"--{f.name}={flag_text(value)}", typ, sources.get(f.name, ""), about))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    indent = 2 + sum(widths) + 2 * 3
    lines = ["config keys: the value this run uses, type, where it comes from (blank: the default), help"]
    for i, (key, typ, source, about) in enumerate(rows):
        if i in titles:
            lines.append(titles[i])
        head = f"  {key:<{widths[0]}}  {typ:<{widths[1]}}  {source:<{widths[2]}}  "
        wrapped = textwrap.wrap(about, max(30, width - indent), break_on_hyphens=False) or [""]
        lines.append(head + wrapped[0])
        lines.extend(" " * indent + more for more in wrapped[1:])
    return lines


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


def evaluate_main(argv: List[str]) -> int:
    p = decoding_parser("sparseattn evaluate", "decoded metrics of a checkpoint")
    p.add_argument("--split", default="test")
    p.add_argument("--json", action="store_true", help="print one JSON object of metrics")
    args = p.parse_args(argv)
    checkpoint_from(args, "evaluate")
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
    p = checkpoint_parser(
        "sparseattn plot",
        "a run's plots again: the task's (attention maps with a colour bar, ACT steps, F1 per epoch) from a "
        "checkpoint, and loss.png from the run's metrics.jsonl",
    )
    p.add_argument("--out", default=None, help="folder for the PNGs (default: RUN_DIR/plots)")
    args = p.parse_args(argv)
    checkpoint_from(args, "plot")
    cfg, task, model, state = load_for_eval(args.checkpoint, "cpu")
    run_dir = Path(cfg.run.out)  # the checkpoint's folder
    out = Path(args.out) if args.out else run_dir / "plots"
    paths = list(task.plot(model, cfg, out, state.get("history", [])))
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        from .plots import loss_curve

        try:
            paths.append(loss_curve(read_metrics(metrics), out / "loss.png"))
        except ValueError:  # a run stopped before it logged a loss
            print(f"no loss.png: {metrics} holds no training or validation loss yet", file=sys.stderr)
    else:
        print(f"no loss.png: no metrics.jsonl next to the checkpoint in {run_dir}", file=sys.stderr)
    for path in paths:
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
    otherwise; sources cut to --max-source-len subword tokens (translate_io.py)."""
    p = decoding_parser(
        "sparseattn translate",
        "translate sentences with a checkpoint",
        usage="sparseattn translate RUN_DIR|--checkpoint PATH [options] [SENTENCE ...]",
    )
    p.add_argument("sentences", nargs="*", metavar="SENTENCE", help="source sentences (default: lines of stdin)")
    p.add_argument(
        "--max-source-len",
        "--max_source_len",
        type=int,
        default=None,
        metavar="N",
        help="cut longer sources to their first N subword tokens, with a warning (default: the longest "
        f"source the run trained on; {translate_io.DEFAULT_MAX_SOURCE_LEN} for checkpoints without that record)",
    )
    args = p.parse_intermixed_args(argv)  # sentences before and after options
    given = checkpoint_from(args, "translate", args.sentences)
    translate_io.check_arguments(given)
    translate_io.check_max_source_len(args.max_source_len)
    cfg, task, model = load_for_decoding(args, need_data=False, need="translate")
    bound, origin = translate_io.source_bound(args.max_source_len, task.max_source_len)
    sentences = given or translate_io.read_lines(sys.stdin.buffer)
    # one output line per input line: a blank line stays blank, so outputs line up with inputs
    todo = [i for i, line in enumerate(sentences) if line.strip()]
    sources = [sentences[i] for i in todo]
    lengths = dict(zip(todo, task.source_lengths(sources)))
    translate_io.warn_long(
        [lengths.get(i, 0) for i in range(len(sentences))], bound, origin, "sentence" if given else "line"
    )
    translated = dict(zip(todo, task.translate(model, sources, cfg, max_source_len=bound)))
    for i in range(len(sentences)):
        print(translate_io.one_line(translated.get(i, "")))
    return 0


def configs_main(argv: List[str]) -> int:
    argparse.ArgumentParser(prog="sparseattn configs", description="list the preset files").parse_args(argv)
    for name, about in list_presets():
        print(f"{name:<28} {about}")
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
        print(f"{__doc__}\n{RUN_FOLDER}")
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
