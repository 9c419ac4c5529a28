"""`sparseattn translate --checkpoint RUN/checkpoint.pt "A dog runs on the beach." ...`

Prints one translation per line for each sentence given (or each line of stdin when none is),
decoded with the run's beam and length penalty unless --beam/--alpha say otherwise. The task
must provide `translate(model, sentences, cfg)` (multi30k does).
"""
from __future__ import annotations

import sys
from typing import List


def translate_main(argv: List[str]) -> int:
    from .commands import decoding_parser, load_for_decoding
    p = decoding_parser("sparseattn translate", "translate sentences with a checkpoint")
    p.add_argument("sentences", nargs="*", help="source sentences (default: read lines from stdin)")
    args = p.parse_args(argv)
    cfg, task, model = load_for_decoding(args)
    if not hasattr(task, "translate"):
        raise SystemExit(f"sparseattn translate: task {cfg.task!r} does not translate text")
    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for line in task.translate(model, sentences, cfg):
        print(line)
    return 0
