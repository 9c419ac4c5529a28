"""The csr kernels as `torch.library` custom ops, for `torch.compile` and `torch.export`.

Dynamo cannot trace torch's sparse CSR tensors, so under compilation `csr_attention` calls these
ops instead of `CSRAttention`: the graph sees two opaque ops with fake (shape-only) kernels and
an autograd rule, and no graph break. They take the graph's cached index tensors as arguments,
so the graph's structure must be built before compiling (one eager call, or `prepare`).
Both paths run the same `_csr_forward`/`_csr_backward`.

Shapes: q2 (N_dst * H, D), k2 (N_src * H, D), v2 (N_src * H, Dv); bias, mask and every per-edge
value in slot order (H * E,) (see csr.py); out (N_dst * H, Dv); z (N_dst * H,). The head-major
ops (csr_head_major.py) take q (N_dst, H, D), k, v (N_src, H, D) and per-edge values (H, E) in
destination-sorted order; z is (H, N_dst).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..graphs import Graph
from .csr import _csr_backward, _csr_forward, _pattern
from .csr_head_major import (
    head_major_backward,
    head_major_forward,
    head_major_pattern,
    head_major_rule,
    source_spread,
)
from .sparse_calls import take


class _Index(NamedTuple):
    """The _Pattern fields the kernels read, rebuilt from op arguments."""

    crow: Tensor
    col: Tensor
    offsets: Tensor
    row: Tensor
    ccrow: Tensor
    ccol: Tensor
    to_csc: Tensor
    shape: Tuple[int, int]


def index_args(pat) -> Tuple[Tensor, ...]:
    """The index tensors the ops take, in their order, from a csr _Pattern or a HeadMajorPattern."""
    return pat.crow, pat.col, pat.offsets, pat.row, pat.ccrow, pat.ccol, pat.to_csc


def _clamp(lo_hi: Optional[List[float]]) -> Optional[Tuple[float, float]]:
    return None if lo_hi is None else (lo_hi[0], lo_hi[1])


@torch.library.custom_op("sparseattn::csr_forward", mutates_args=())
def csr_forward(
    q2: Tensor,
    k2: Tensor,
    v2: Tensor,
    crow: Tensor,
    col: Tensor,
    offsets: Tensor,
    row: Tensor,
    ccrow: Tensor,
    ccol: Tensor,
    to_csc: Tensor,
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    scale: float,
    clamp: Optional[List[float]],
    return_weights: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns out, p = w / z if return_weights (else empty), w, score (empty in exact mode), z.
    The transposed index (ccrow, ccol, to_csc) is only kept for the backward."""
    idx = _Index(crow, col, offsets, row, ccrow, ccol, to_csc, (q2.shape[0], k2.shape[0]))
    out, w, score, z = _csr_forward(q2, k2, v2, idx, scale, _clamp(clamp), bias, mask)
    p = w / take(z, row) if return_weights else w.new_empty(0)
    return out, p, w, w.new_empty(0) if score is None else score, z


@csr_forward.register_fake
def _(q2, k2, v2, crow, col, offsets, row, ccrow, ccol, to_csc, bias, mask, scale, clamp, return_weights):
    nnz = col.shape[0]
    return (
        q2.new_empty(q2.shape[0], v2.shape[1]),
        q2.new_empty(nnz if return_weights else 0),
        q2.new_empty(nnz),
        q2.new_empty(0 if clamp is None else nnz),
        q2.new_empty(q2.shape[0]),
    )


@torch.library.custom_op("sparseattn::csr_backward", mutates_args=())
def csr_backward(
    grad_out: Tensor,
    grad_p: Optional[Tensor],
    q2: Tensor,
    k2: Tensor,
    v2: Tensor,
    w: Tensor,
    score: Tensor,
    z: Tensor,
    mask: Optional[Tensor],
    crow: Tensor,
    col: Tensor,
    offsets: Tensor,
    row: Tensor,
    ccrow: Tensor,
    ccol: Tensor,
    to_csc: Tensor,
    scale: float,
    clamp: Optional[List[float]],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns dq2, dk2, dv2 and ds (slot order, the gradient of bias)."""
    idx = _Index(crow, col, offsets, row, ccrow, ccol, to_csc, (q2.shape[0], k2.shape[0]))
    return _csr_backward(
        grad_out.contiguous(),
        grad_p,
        q2,
        k2,
        v2,
        w,
        score if clamp is not None else None,
        z,
        mask,
        idx,
        scale,
        _clamp(clamp),
        (True, True, True, True),
    )


@csr_backward.register_fake
def _(grad_out, grad_p, q2, k2, v2, w, score, z, mask, crow, col, offsets, row, ccrow, ccol, to_csc, scale, clamp):
    return torch.empty_like(q2), torch.empty_like(k2), torch.empty_like(v2), torch.empty_like(w)


def _setup(ctx, inputs, output):
    q2, k2, v2, crow, col, offsets, row, ccrow, ccol, to_csc, bias, mask, scale, clamp, _ = inputs
    _, _, w, score, z = output
    ctx.save_for_backward(q2, k2, v2, w, score, z, mask, crow, col, offsets, row, ccrow, ccol, to_csc)
    ctx.scale, ctx.clamp, ctx.has_bias = scale, clamp, bias is not None


def _autograd_rule(backward_op):
    """The autograd rule of a forward op whose backward is the custom op backward_op (same
    arguments in both layouts): the gradients of q, k, v and bias, None for the rest."""

    def backward(ctx, grad_out, grad_p, _w, _score, _z):
        # w, score and z are outputs only to be saved for this backward: csr_attention never uses them
        q, k, v, w, score, z, mask, *index = ctx.saved_tensors
        gp = grad_p if grad_p is not None and grad_p.numel() else None
        dq, dk, dv, ds = backward_op(grad_out, gp, q, k, v, w, score, z, mask, *index, ctx.scale, ctx.clamp)
        return (dq, dk, dv) + (None,) * 7 + ((ds if ctx.has_bias else None), None, None, None, None)

    return backward


csr_forward.register_autograd(_autograd_rule(csr_backward), setup_context=_setup)


@torch.library.custom_op("sparseattn::csr_head_major_forward", mutates_args=())
def head_major_forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    crow: Tensor,
    col: Tensor,
    offsets: Tensor,
    row: Tensor,
    ccrow: Tensor,
    ccol: Tensor,
    to_csc: Tensor,
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    scale: float,
    clamp: Optional[List[float]],
    return_weights: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns out, p = w / z if return_weights (else empty), w, score (empty in exact mode), z."""
    idx = _Index(crow, col, offsets, row, ccrow, ccol, to_csc, (q.shape[0], k.shape[0]))
    out, w, score, z = head_major_forward(q, k, v, idx, scale, _clamp(clamp), bias, mask)
    p = w / z.index_select(1, row) if return_weights else w.new_empty(0)
    return out, p, w, w.new_empty(0) if score is None else score, z


@head_major_forward_op.register_fake
def _(q, k, v, crow, col, offsets, row, ccrow, ccol, to_csc, bias, mask, scale, clamp, return_weights):
    heads, nnz = q.shape[1], col.shape[0]
    return (
        q.new_empty(q.shape[0], heads, v.shape[2]),
        q.new_empty(heads, nnz) if return_weights else q.new_empty(0),
        q.new_empty(heads, nnz),
        q.new_empty(0) if clamp is None else q.new_empty(heads, nnz),
        q.new_empty(heads, q.shape[0]),
    )


@torch.library.custom_op("sparseattn::csr_head_major_backward", mutates_args=())
def head_major_backward_op(
    grad_out: Tensor,
    grad_p: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    score: Tensor,
    z: Tensor,
    mask: Optional[Tensor],
    crow: Tensor,
    col: Tensor,
    offsets: Tensor,
    row: Tensor,
    ccrow: Tensor,
    ccol: Tensor,
    to_csc: Tensor,
    scale: float,
    clamp: Optional[List[float]],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns dq, dk, dv (shaped and strided as q, k, v) and ds ((H, E), the gradient of bias)."""
    idx = _Index(crow, col, offsets, row, ccrow, ccol, to_csc, (q.shape[0], k.shape[0]))
    sc = score if clamp is not None else None
    return head_major_backward(grad_out, grad_p, q, k, v, w, sc, z, mask, idx, scale, _clamp(clamp), (True,) * 4)


@head_major_backward_op.register_fake
def _(grad_out, grad_p, q, k, v, w, score, z, mask, crow, col, offsets, row, ccrow, ccol, to_csc, scale, clamp):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(w)


head_major_forward_op.register_autograd(_autograd_rule(head_major_backward_op), setup_context=_setup)


def prepare(graph: Graph, heads: int, head_dim: Optional[int] = None, dtype: torch.dtype = torch.float32) -> None:
    """Build and cache everything csr needs for this graph and head count (forward, backward and
    returned weights), so that compiled code only reads cached tensors: the layout csr will pick
    for keys (N_src, heads, head_dim) of dtype, or both layouts when head_dim is None."""
    row_bytes = None if head_dim is None else heads * head_dim * torch.empty(0, dtype=dtype).element_size()
    head_major = None if row_bytes is None else head_major_rule(graph, heads, row_bytes)
    if graph.device.type != "cpu":  # prefers_head_major: the head-major layout serves CPU tensors only
        head_major = False
    source_spread(graph)
    if head_major is not False:
        head_major_pattern(graph)
    if head_major is not True:
        pat = _pattern(graph, heads)
        pat.row, pat.from_caller, pat.ccrow, pat.to_caller  # noqa: B018 (touching them builds them)


def csr_op_head_major_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: Graph,
    scale: float,
    clamp,
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    return_weights: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """`csr_op_attention` in the head-major layout (same arguments and results)."""
    hm = head_major_pattern(graph)
    out, p, _, _, _ = head_major_forward_op(
        q,
        k,
        v,
        *index_args(hm),
        hm.to_sorted(bias),
        hm.to_sorted(mask),
        scale,
        None if clamp is None else list(clamp),
        return_weights,
    )
    return out, hm.to_caller(p) if return_weights else None


def csr_op_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: Graph,
    scale: float,
    clamp,
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    return_weights: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """csr_attention's core through the custom ops: q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv)
    in float32/float64, bias and mask (E, H) in caller order or None. Returns out (N_dst, H, Dv)
    and the weights (E, H) in caller order or None."""
    heads = q.shape[1]
    pat = _pattern(graph, heads)
    q2, k2, v2 = (t.reshape(-1, t.shape[2]) for t in (q, k, v))  # (N * H, D)
    bias, mask = (None if x is None else take(x.reshape(-1), pat.from_caller) for x in (bias, mask))
    out, p, _, _, _ = csr_forward(
        q2,
        k2,
        v2,
        *index_args(pat),
        bias,
        mask,
        scale,
        None if clamp is None else list(clamp),
        return_weights,
    )
    weights = take(p, pat.to_caller.view(-1)).view(-1, heads) if return_weights else None
    return out.view(q.shape[0], heads, -1), weights
