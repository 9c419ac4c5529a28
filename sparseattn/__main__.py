"""Command-line entry: `sparseattn <command>` (also `python -m sparseattn <command>`).

Commands:
    demo      run EdgeAttention on a batch of variable-length sequences and check it against
              dense masked attention (no training; a quick look at the API)
    train     train a model on a task: sparseattn train --task copy --out runs/copy
    evaluate  a checkpoint's decoded metrics on the test split (accuracy, BLEU or chunk F1)
    plot      attention heatmaps (and ACT step plots for the UT) of a checkpoint
    compare   one validation metric of several runs per epoch and per minute, as a PNG
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
    attn(x, g)  # the first call pays one-off costs (backend probe, graph caches)
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
                            ("translate", "translate sentences with a checkpoint"),
                            ("compare", "a validation metric of several runs, per epoch and per minute")):
        cmd = sub.add_parser(name, help=help_text, add_help=False)
        cmd.add_argument("argv", nargs=argparse.REMAINDER)
        cmd.set_defaults(func=_forward(name))
    return parser


def _forward(name: str):
    def run(args: argparse.Namespace) -> int:
        from . import commands, translate
        table = {"train": commands.train_main, "evaluate": commands.evaluate_main, "plot": commands.plot_main,
                 "compare": commands.compare_main, "translate": translate.translate_main}
        try:
            return table[name](args.argv)
        except FileNotFoundError as e:  # a missing checkpoint, run directory or data file: one line, no traceback
            raise SystemExit(f"sparseattn {name}: {e}") from None
    return run


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("train", "evaluate", "plot", "compare", "translate"):  # these parse their own flags
        return _forward(argv[0])(argparse.Namespace(argv=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
