"""`sparseattn translate --checkpoint RUN/checkpoint.pt "A dog runs on the beach." ...`

Prints one translation per line for each sentence given (or each line of stdin when none is),
decoded with the run's beam and length penalty unless --beam/--alpha say otherwise. The task
must provide `translate(model, sentences, cfg)` (multi30k does).
"""
from __future__ import annotations

import argparse
import sys
from typing import List


def translate_main(argv: List[str]) -> int:
    from .commands import load_for_eval
    p = argparse.ArgumentParser(prog="sparseattn translate", description="translate sentences with a checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the run's)")
    p.add_argument("--alpha", type=float, default=None, help="length penalty exponent")
    p.add_argument("--device", default="auto")
    p.add_argument("sentences", nargs="*", help="source sentences (default: read lines from stdin)")
    args = p.parse_args(argv)
    cfg, task, model, _ = load_for_eval(args.checkpoint, args.device)
    if not hasattr(task, "translate"):
        raise SystemExit(f"sparseattn translate: task {cfg.task!r} does not translate text")
    if args.beam is not None:
        cfg.beam = args.beam
    if args.alpha is not None:
        cfg.alpha = args.alpha
    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for line in task.translate(model, sentences, cfg):
        print(line)
    return 0
