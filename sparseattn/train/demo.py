"""`sparseattn demo`: EdgeAttention on a batched graph of sequences against padded, masked
nn.MultiheadAttention with the same weights: the time of one forward and the largest difference."""

from __future__ import annotations

import argparse
import time
from typing import List

import torch


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
