"""Command-line entry: `sparseattn <command>` (also `python -m sparseattn <command>`).

Commands:
    demo    run EdgeAttention on a batch of variable-length sequences and check it against
            dense masked attention (no training; a quick look at the API)
    train-tagger     train a CoNLL-2000 chunking tagger (TransformerTagger or BiLSTM baseline);
                     temporary, to be folded into the shared `train` command
    evaluate-tagger  chunk precision/recall/F1 (seqeval, conlleval-compatible) of a tagger checkpoint
    plot-tagger      dev F1 per epoch of tagger runs, as a PNG
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional


def _demo(args: argparse.Namespace) -> int:
    import torch

    from . import EdgeAttention, graphs

    torch.manual_seed(args.seed)
    lengths = torch.randint(5, 51, (args.sequences,)).tolist()
    g = graphs.batch([graphs.complete(n) for n in lengths])  # block-diagonal, no padding
    attn = EdgeAttention(args.dim, args.heads, clamp=None)
    x = torch.randn(g.num_dst, args.dim)
    start = time.perf_counter()
    out = attn(x, g)
    elapsed = time.perf_counter() - start
    # the same computation as padded, masked nn.MultiheadAttention
    mha = torch.nn.MultiheadAttention(args.dim, args.heads, batch_first=True)
    mha.load_state_dict(attn.state_dict())
    padded = torch.nn.utils.rnn.pad_sequence(list(g.split_dst(x)), batch_first=True)
    pad_mask = torch.arange(padded.shape[1])[None] >= torch.tensor(lengths)[:, None]
    ref, _ = mha(padded, padded, padded, key_padding_mask=pad_mask)
    ref = torch.cat([r[:n] for r, n in zip(ref, lengths)])
    print(f"{len(lengths)} sequences, {g.num_dst} tokens, {g.num_edges} edges, backend {attn.backend!r}")
    print(f"EdgeAttention forward: {elapsed * 1e3:.1f} ms; max |diff| vs padded nn.MultiheadAttention: "
          f"{(out - ref).abs().max().item():.2e}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparseattn", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="EdgeAttention on a batched graph vs dense masked attention")
    demo.add_argument("--sequences", type=int, default=64)
    demo.add_argument("--dim", type=int, default=128)
    demo.add_argument("--heads", type=int, default=8)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    tt = sub.add_parser("train-tagger", help="train a chunking tagger: --model tagger|bilstm --data-dir D --out O "
                        "[--resume] [--<config key> value ...] (see sparseattn/tagging_train.py)")
    tt.set_defaults(func=_train_tagger)
    ev = sub.add_parser("evaluate-tagger", help="chunk P/R/F1 of a tagger checkpoint")
    ev.add_argument("--checkpoint", required=True)
    ev.add_argument("--data-dir", default="")
    ev.add_argument("--split", choices=["test", "dev"], default="test")
    ev.add_argument("--output", default=None, help="also write the scores as JSON here")
    ev.add_argument("--threads", type=int, default=0, help="torch threads (default: the run's setting)")
    ev.set_defaults(func=_evaluate_tagger)
    pt = sub.add_parser("plot-tagger", help="dev F1 per epoch of tagger runs to a PNG")
    pt.add_argument("--run", action="append", required=True, help="label=<run dir or metrics.jsonl>; repeatable")
    pt.add_argument("--output", required=True)
    pt.set_defaults(func=_plot_tagger)
    return parser


def _train_tagger(args: argparse.Namespace) -> int:
    from .tagging_train import train_main

    return train_main(args.extra)


def _evaluate_tagger(args: argparse.Namespace) -> int:
    from .tagging_train import evaluate_main

    return evaluate_main(args.checkpoint, args.data_dir, args.split, args.output, args.threads)


def _plot_tagger(args: argparse.Namespace) -> int:
    from .tagging_train import plot_main

    return plot_main(args.run, args.output)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "train-tagger":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
