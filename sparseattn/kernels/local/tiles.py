"""One head of a batch of tiles, forward and backward, on 3-D views: batched matmuls, the clamp,
an additive off-edge term, softmax.

Per tile (T destination rows over S span rows):
    s = scale * q k^T                                     (T, S)
    p = softmax(clamp(s) + bias)  or  softmax(s + bias)   (= w / sum(w) over the row's edges)
    out = p v
backward, with the weights recomputed: dp = g v^T, ds = p * (dp - sum(p * dp)) * [lo <= s <= hi],
dq = scale ds k, dk = scale ds^T q, dv = p^T g.
The tile ops write into a `Scratch` made once per call (out= ops): a fresh tensor per op costs
page faults that slowed these elementwise passes several-fold.

Shapes: q (n, T, D), k (n, S, D), v (n, S, Dv), g (n, T, Dv), any strides with unit last stride;
bias (1 or n, T, S).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


class Scratch:
    """`count` score buffers of up to n * T * S elements and one (n, max(T, S), width) result."""

    def __init__(self, like: Tensor, n: int, rows: int, span: int, width: int, count: int) -> None:
        self.buffers = [like.new_empty(n * rows * span) for _ in range(count)]
        self.results = like.new_empty(n * max(rows, span) * width)

    def scores(self, i: int, n: int, rows: int, span: int) -> Tensor:
        return self.buffers[i][: n * rows * span].view(n, rows, span)

    def result(self, n: int, rows: int, width: int) -> Tensor:
        return self.results[: n * rows * width].view(n, rows, width)


def _probs(q, k, bias, scale, clamp, scratch: Scratch) -> Tuple[Tensor, Tensor]:
    """(scores, p), each (n, T, S) in scratch buffers 0 and 1: scores = scale * q k^T, unclamped in
    clamp mode (backward's clamp mask reads them), scores + bias in exact mode."""
    n, rows, span = q.shape[0], q.shape[1], k.shape[1]
    scores, logits = scratch.scores(0, n, rows, span), scratch.scores(1, n, rows, span)
    if clamp is None:
        torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale, out=scores)  # s + bias in one pass
        logits = scores
    else:
        torch.baddbmm(scores, q, k.transpose(1, 2), beta=0.0, alpha=scale, out=scores)
        torch.clamp(scores, *clamp, out=logits).add_(bias)
    return scores, torch.ops.aten._softmax.out(logits, -1, False, out=scratch.scores(1, n, rows, span))


def forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, clamp, scratch: Scratch) -> Tensor:
    """out (n, T, Dv) of one head's tiles, in scratch's result buffer."""
    _, p = _probs(q, k, bias, scale, clamp, scratch)
    return torch.bmm(p, v, out=scratch.result(q.shape[0], q.shape[1], v.shape[2]))


def backward(g, q, k, v, bias, scale: float, clamp, bounds: Optional[Tuple[float, float]], scratch: Scratch, into):
    """One head's tiles: dq (n, T, D) into into[0] and, per tile, dk (n, S, D) and dv (n, S, Dv),
    passed to into[1] and into[2] (callables that add or copy them into their spans). bounds:
    `contract.gradient_bounds(clamp)` or None in exact mode. Needs scratch with 4 score buffers."""
    n, rows, span = q.shape[0], q.shape[1], k.shape[1]
    scores, p = _probs(q, k, bias, scale, clamp, scratch)
    dp = torch.bmm(g, v.transpose(1, 2), out=scratch.scores(2, n, rows, span))
    ds = torch.ops.aten._softmax_backward_data.out(dp, p, -1, p.dtype, grad_input=scratch.scores(3, n, rows, span))
    if bounds is not None:  # 0 where the clamp binds
        ds = torch.ops.aten.hardtanh_backward.grad_input(ds, scores, *bounds, grad_input=dp)
    dq = scratch.result(n, rows, q.shape[2])
    into[0].copy_(torch.baddbmm(dq, ds, k, beta=0.0, alpha=scale, out=dq))
    into[2](torch.bmm(p.transpose(1, 2), g, out=scratch.result(n, span, g.shape[2])))
    dk = scratch.result(n, span, q.shape[2])
    into[1](torch.baddbmm(dk, ds.transpose(1, 2), q, beta=0.0, alpha=scale, out=dk))


__all__ = ["Scratch", "forward", "backward"]
