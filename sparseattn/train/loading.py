"""What evaluate, plot and translate decode with: a checkpoint, named by a run folder or a .pt file,
given as the first positional argument (`sparseattn evaluate runs/copy`) or with --checkpoint PATH,
loaded with its config, task and model, and the decoding flags they share (--beam, --alpha,
--max_len_a, --max_len_b, --device).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from . import checkpoint as ckpt_io
from .config import MAX_BEAM, MAX_LEN_A, MAX_LEN_B, check_run_values, config_from_dict
from .run_folder import SWAPPING, check_one_run, settle
from .runlock import run_dir_lock
from .tasks import get_task
from .trainer import resolve_device


def resolve_checkpoint(path: str) -> Tuple[Path, Optional[Path]]:
    """(checkpoint file, run folder or None) of what --checkpoint names: a file as it is; a run
    folder's best.pt (the best validation epoch's weights), else its checkpoint.pt (the last saved
    ones). A folder with neither is a FileNotFoundError saying so; one whose files belong to
    different runs a ValueError (run_folder.py), after a swap a killed --overwrite run left half
    done has been finished."""
    given = Path(path)
    if not given.is_dir():
        return given, None
    if (given / SWAPPING).is_dir():
        with run_dir_lock(given):  # refused while a live run holds it (it is swapping right now)
            settle(given)
    check_one_run(given)
    for name in ("best.pt", "checkpoint.pt"):
        if (given / name).is_file():
            return given / name, given
    raise FileNotFoundError(
        f"{given} holds no checkpoint (neither best.pt nor checkpoint.pt): give a run folder that "
        "`sparseattn train --out` has saved to, or a .pt file"
    )


def checkpoint_note(folder: Path, ckpt: Path, state: dict, averaged: bool) -> str:
    """The line saying which checkpoint of a run folder evaluate, plot and translate use
    (averaged: the weights are an --ema_decay moving average)."""
    kind = "averaged weights" if averaged else "weights"
    if ckpt.name == "best.pt":
        epoch = state.get("epoch")
        which = f"epoch {epoch}, the best on the validation split" if epoch else "the best validation epoch"
        return f"{folder}: using best.pt, the {kind} of {which}"
    position = state.get("position") or {}
    epoch, batch, step = (position.get(k) for k in ("epoch", "batch", "step"))
    if batch:
        when = f" at step {step} (epoch {epoch + 1} unfinished)"
    elif epoch is not None:
        when = f" after epoch {epoch}"
    else:
        when = ""
    return f"{folder}: no best.pt (keep_best off, or no epoch finished); using checkpoint.pt, the {kind}{when}"


def load_for_eval(path: str, device: str = "auto", need_data: bool = True, need: Optional[str] = None):
    """(cfg, task, model, checkpoint dict) of a checkpoint file or run folder (see
    resolve_checkpoint; a folder's checkpoint is named in one line on stderr), the model in eval
    mode. With ema weights (checkpoint.pt of an --ema_decay run) the model holds the averages, as
    training evaluated them. need_data=False skips reading the task's data (decoding new input
    needs only the vocabulary, which the checkpoint holds). need: a method the task must have
    (translate), checked before the model is built. Anything wrong with the file is one ValueError
    naming it."""
    target = resolve_device(device)
    ckpt, folder = resolve_checkpoint(path)
    path = str(ckpt)
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
    if folder is not None:  # after every check: a failure stays one line
        print(checkpoint_note(folder, ckpt, state, cfg.run.ema_decay > 0), file=sys.stderr)
    return cfg, task, model, state


CHECKPOINT_HELP = "a run folder (its best.pt, else its checkpoint.pt: the line on stderr says which) or a .pt file"


def checkpoint_parser(prog: str, description: str, positional: bool = True) -> argparse.ArgumentParser:
    """A parser taking the checkpoint as RUN_DIR (positional; positional=False: the command's own
    positional arguments come first, see `checkpoint_from`) or as --checkpoint PATH."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    if positional:
        p.add_argument("run", nargs="?", metavar="RUN_DIR", help=f"{CHECKPOINT_HELP} (or --checkpoint PATH)")
    p.add_argument("--checkpoint", metavar="PATH", help=f"{CHECKPOINT_HELP}; the same as RUN_DIR")
    return p


def checkpoint_from(args: argparse.Namespace, command: str, rest: Optional[List[str]] = None) -> List[str]:
    """Set args.checkpoint from RUN_DIR (args.run) or --checkpoint, whichever was given. `rest`: the
    positional arguments of a command that takes more (translate's sentences), whose first is the
    checkpoint when --checkpoint is absent; returns what is left of them."""
    rest = list(rest or [])
    run = getattr(args, "run", None)
    if run is None and args.checkpoint is None and rest:
        run, rest = rest[0], rest[1:]
    if run is not None and args.checkpoint is not None:
        raise ValueError(f"give the checkpoint once, as RUN_DIR ({run}) or --checkpoint ({args.checkpoint})")
    if run is None and args.checkpoint is None:
        raise ValueError(f"no checkpoint given: sparseattn {command} RUN_DIR (or --checkpoint PATH)")
    args.checkpoint = args.checkpoint if run is None else run
    return rest


def decoding_parser(prog: str, description: str, usage: Optional[str] = None) -> argparse.ArgumentParser:
    """A parser with the options of commands that decode with a checkpoint (see load_for_decoding).
    usage: a command with positional arguments of its own (translate) says so; its first positional
    argument is then RUN_DIR (`checkpoint_from`)."""
    p = checkpoint_parser(prog, description, positional=usage is None)
    if usage is not None:
        p.usage = usage
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
