"""GATv2's per-edge scores att . LeakyReLU(x_l[j] + x_r[i] (+ W_e e_ji)) in edge chunks, so that no
(E, H, C) tensor exists at once nor is kept for backward."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# GATv2's default chunk: this many (edge, head, channel) values per temporary. On a GPU each chunk costs
# launches and checkpoint bookkeeping: fwd+bwd of GATv2Conv(512, 64, heads=8, edge_dim=16), bf16, 2^18
# nodes x 16 in-edges, H100: chunks of 8,192 edges 993 ms, 65,536 193 ms, 262,144 (2^27 values) 143 ms
# at +2.3 GiB, 1M 134 ms at +5.4 GiB (benchmarks/results/, the layers page).
CHUNK_ELEMENTS = {"cpu": 1 << 22, "cuda": 1 << 27}
# Below this many (edge, head, channel) values the default skips chunks and checkpointing: a batch of
# 32 FreeSolv molecules (~550 edges, 4 heads of 16) took 5.9 ms per fwd+bwd of GATv2Conv, ~1.8 ms of
# it torch.utils.checkpoint's own bookkeeping; its (E, H, C) temporaries are a few hundred KiB.
UNCHUNKED_ELEMENTS = 1 << 18


def default_edge_chunk(heads: int, channels: int, device: torch.device) -> int:
    """Edges per GATv2 score chunk when the layer's edge_chunk is None: CHUNK_ELEMENTS of the device
    type (CPU's for any other) over the H * C values of one edge."""
    return max(1, CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cpu"]) // max(1, heads * channels))


def _scores_chunk(
    x_l: Tensor,
    x_r: Tensor,
    src: Tensor,
    dst: Tensor,
    edge_attr: Optional[Tensor],
    edge_weight: Optional[Tensor],
    att: Tensor,
    negative_slope: float,
) -> Tensor:
    """att . LeakyReLU(x_l[src] + x_r[dst] (+ W_e edge_attr)) per edge and head, (n, H), through an
    (n, H, C) intermediate (n = the chunk's edges)."""
    s = x_l.index_select(0, src) + x_r.index_select(0, dst)  # (n, H, C)
    if edge_attr is not None and edge_weight is not None:
        s = s + F.linear(edge_attr, edge_weight).view_as(s)
    return (F.leaky_relu(s, negative_slope) * att).sum(-1)


def v2_scores(
    x_l: Tensor,
    x_r: Tensor,
    index: Tensor,
    edge_attr: Optional[Tensor],
    edge_weight: Optional[Tensor],
    att: Tensor,
    negative_slope: float,
    chunk: Optional[int],
) -> Tensor:
    """GATv2's scores (E, H) in chunks of `chunk` edges, each under torch.utils.checkpoint when
    autograd records: only one chunk's (chunk, H, C) tensors live at a time, in forward and in
    backward (which recomputes them), and none is saved. chunk None: all edges at once, no
    checkpoint (for scores whose (E, H, C) temporaries are small: checkpoint's own cost per call
    is about 2 ms on a CPU, more than a small graph's whole layer)."""
    if chunk is None:
        return _scores_chunk(x_l, x_r, index[0], index[1], edge_attr, edge_weight, att, negative_slope)
    parts = []
    record = torch.is_grad_enabled()
    for start in range(0, index.shape[1], chunk):
        src, dst = index[0, start : start + chunk], index[1, start : start + chunk]
        ea = None if edge_attr is None else edge_attr[start : start + chunk]
        args = (x_l, x_r, src, dst, ea, edge_weight, att, negative_slope)
        if record:
            parts.append(checkpoint(_scores_chunk, *args, use_reentrant=False))
        else:
            parts.append(_scores_chunk(*args))
    if not parts:
        return x_l.new_zeros(0, x_l.shape[1])
    return parts[0] if len(parts) == 1 else torch.cat(parts)
