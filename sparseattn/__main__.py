"""Command-line entry: `sparseattn <command>` (also `python -m sparseattn <command>`).

Commands:
    demo      run EdgeAttention on a batch of variable-length sequences and check it against
              dense masked attention (no training; a quick look at the API)
    train     train a model on a task: sparseattn train --task copy --out runs/copy
    evaluate  decoded token/sequence accuracy of a checkpoint on the test split
    plot      attention heatmaps (and ACT step plots for the UT) of a checkpoint
    train-tagger, evaluate-tagger, plot-tagger
              the chunking taggers' own loop (time budget, per-epoch lr decay) that produced
              docs/RESULTS.md; `train --task chunking --model tagger|bilstm` is the shared path
    translate translate sentences with a multi30k checkpoint (arguments or stdin)

Run `sparseattn train --help` for the config keys. Extension point: a new subcommand is a
function taking the remaining argv, added to build_parser and _forward below.
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
    for name, help_text in (("train", "train a model on a task (sparseattn train --help)"),
                            ("evaluate", "decoded metrics of a checkpoint"),
                            ("plot", "attention and ACT plots of a checkpoint"),
                            ("translate", "translate sentences with a checkpoint")):
        cmd = sub.add_parser(name, help=help_text, add_help=False)
        cmd.add_argument("argv", nargs=argparse.REMAINDER)
        cmd.set_defaults(func=_forward(name))
    tt = sub.add_parser("train-tagger", help="chunking tagger loop with a time budget: --model tagger|bilstm "
                        "--data-dir D --out O [--resume] [--<key> value ...] (sparseattn/tagging_train.py)",
                        add_help=False)
    tt.add_argument("argv", nargs=argparse.REMAINDER)
    tt.set_defaults(func=_forward("train-tagger"))
    ev = sub.add_parser("evaluate-tagger", help="chunk P/R/F1 of a train-tagger checkpoint")
    ev.add_argument("--checkpoint", required=True)
    ev.add_argument("--data-dir", default="")
    ev.add_argument("--split", choices=["test", "dev"], default="test")
    ev.add_argument("--output", default=None, help="also write the scores as JSON here")
    ev.add_argument("--threads", type=int, default=0, help="torch threads (default: the run's setting)")
    ev.set_defaults(func=_evaluate_tagger)
    pt = sub.add_parser("plot-tagger", help="dev F1 of train-tagger runs per epoch and per minute, to a PNG")
    pt.add_argument("--run", action="append", required=True, help="label=<run dir or metrics.jsonl>; repeatable")
    pt.add_argument("--output", required=True)
    pt.set_defaults(func=_plot_tagger)
    return parser


def _evaluate_tagger(args: argparse.Namespace) -> int:
    from .tagging_train import evaluate_main
    return evaluate_main(args.checkpoint, args.data_dir, args.split, args.output, args.threads)


def _plot_tagger(args: argparse.Namespace) -> int:
    from .tagging_train import plot_main
    return plot_main(args.run, args.output)


def _forward(name: str):
    def run(args: argparse.Namespace) -> int:
        if name == "train-tagger":
            from .tagging_train import train_main as train_tagger
            return train_tagger(args.argv)
        from . import train, translate
        commands = {"train": train.train_main, "evaluate": train.evaluate_main, "plot": train.plot_main,
                    "translate": translate.translate_main}
        return commands[name](args.argv)
    return run


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("train", "evaluate", "plot", "train-tagger", "translate"):  # these parse their own flags
        return _forward(argv[0])(argparse.Namespace(argv=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
