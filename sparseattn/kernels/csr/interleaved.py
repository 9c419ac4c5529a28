"""The interleaved layout of the csr backend: all heads in one sparse call.

Rows of q (N_dst, H, D) viewed as (N_dst * H, D) are "head rows" t * H + h, so the H per-head
patterns interleave into one (N_dst * H, N_src * H) CSR matrix whose head row t * H + h holds
columns s * H + h for the edges s -> t (index.py builds it); q, k, v and every output are then
plain views, with no transposes. Edge values live in that matrix's "slot" order (H * E,):
destination, then head, then source. The formulas are in the package docstring (__init__.py).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .primitives import exp_shifted_, sddmm, spmm, take


class Slots(NamedTuple):
    """What the kernels read of an interleaved index (index.py): crow, col (the pattern), offsets
    (crow as int64), row (H * E,) head row of each slot or None, and the transposed pattern ccrow,
    ccol with to_csc (the slot of each transposed slot), None when no gradient of k or v is wanted."""

    crow: Tensor
    col: Tensor
    offsets: Tensor
    row: Optional[Tensor]
    ccrow: Optional[Tensor]
    ccol: Optional[Tensor]
    to_csc: Optional[Tensor]
    shape: Tuple[int, int]


def _segment(values: Tensor, idx: Slots, reduce: str) -> Tensor:
    """Per-head-row sum or max of slot values (H * E,) -> (N_dst * H,); empty rows give 0 / -inf."""
    return torch.segment_reduce(values, reduce, offsets=idx.offsets)


def forward(
    q2: Tensor,
    k2: Tensor,
    v2: Tensor,
    idx: Slots,
    scale: float,
    clamp: Optional[Tuple[float, float]],
    bias: Optional[Tensor],
    mask: Optional[Tensor],
):
    """q2: (N_dst * H, D), k2: (N_src * H, D), v2: (N_src * H, Dv); bias, mask: slot order or None.
    Returns out (N_dst * H, Dv), w and score (slot order; score None in exact mode), z_safe (N_dst * H,)."""
    scores = sddmm(idx.crow, idx.col, q2, k2, alpha=scale)  # (H * E,)
    if bias is not None:
        scores += bias
    score: Optional[Tensor] = scores  # kept for the clamp's gradient mask
    if clamp is not None:
        w = scores.clamp(clamp[0], clamp[1]).exp_()
    else:
        assert idx.row is not None, "exact softmax needs the head row of each slot"
        w, score = exp_shifted_(scores, idx.offsets, idx.row), None
    z = _segment(w, idx, "sum")
    z_safe = z.masked_fill_(z == 0, 1.0)  # no in-edges: wv = 0, so out = 0
    out = spmm(idx.crow, idx.col, w if mask is None else w * mask, v2, idx.shape)
    return out.div_(z_safe[:, None]), w, score, z_safe


def backward(
    grad_out: Tensor,
    grad_weights: Optional[Tensor],
    q2: Tensor,
    k2: Tensor,
    v2: Tensor,
    w: Tensor,
    score: Optional[Tensor],
    z_safe: Tensor,
    mask: Optional[Tensor],
    idx: Slots,
    scale: float,
    clamp,
    need: Tuple[bool, bool, bool, bool],
):
    """grad_out: (N_dst * H, Dv); grad_weights: slot order or None. Returns dq (N_dst * H, D),
    dk (N_src * H, D), dv (N_src * H, Dv) and ds (slot order), None where not needed."""
    assert idx.row is not None
    transposed = (idx.shape[1], idx.shape[0])
    # buffers of H * E values are reused where they can be: above 32 MiB each fresh one page-faults
    p = torch.index_select(z_safe, 0, idx.row, out=w.new_empty(w.shape))
    p = torch.div(w, p, out=p)  # (H * E,) normalized weights
    dq = dk = dv = ds = None
    t_values = None  # values in the transposed order, for dv and then dk
    if need[2]:
        assert idx.ccrow is not None and idx.ccol is not None and idx.to_csc is not None
        t_values = take(p if mask is None else p * mask, idx.to_csc)
        dv = spmm(idx.ccrow, idx.ccol, t_values, grad_out, transposed)
    if need[0] or need[1] or need[3]:
        a = sddmm(idx.crow, idx.col, grad_out, v2)  # <grad_out[t], v[s]>
        if mask is not None:
            a *= mask
        if grad_weights is not None:
            a += grad_weights
        ap = torch.mul(a, p, out=torch.empty_like(a) if t_values is None else t_values)  # dv is done with it
        delta = _segment(ap, idx, "sum")  # (N_dst * H,)
        ds = a.sub_(torch.index_select(delta, 0, idx.row, out=ap)).mul_(p)
        if score is not None:  # clamp mode: no gradient where the clamp is active
            ds.masked_fill_((score < clamp[0]) | (score > clamp[1]), 0.0)
        if need[0]:
            dq = spmm(idx.crow, idx.col, ds, k2, idx.shape, alpha=scale)
        if need[1]:
            assert idx.ccrow is not None and idx.ccol is not None and idx.to_csc is not None
            t_ds = take(ds, idx.to_csc) if t_values is None else torch.index_select(ds, 0, idx.to_csc, out=t_values)
            dk = spmm(idx.ccrow, idx.ccol, t_ds, q2, transposed, alpha=scale)
    return dq, dk, dv, ds


__all__ = ["Slots", "forward", "backward"]
