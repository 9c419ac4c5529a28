"""The csr kernels as two `torch.library` custom ops with an autograd rule: the one path of eager,
compiled and exported code (the flash-attention pattern: op -> autograd rule -> thin function).

    sparseattn::csr_attention_fwd(q, k, v, edge_index, <index>, bias, mask, edge_key, edge_value,
                                  edge_scale, eps, scale, clamp, return_weights, head_major)
                                  -> out, weights, w, score, z
    sparseattn::csr_attention_bwd(grad_out, grad_weights, q, k, v, w, score, z, mask, edge_index,
                                  edge_key, edge_value, edge_scale, <index>, scale, clamp,
                                  head_major, needs) -> dq, dk, dv, dbias, dedge_key, dedge_value,
                                  dedge_scale

<index> is crow, col, offsets, row, ccrow, ccol, to_csc, from_caller, to_caller of one layout
(index.py; optional parts None when not needed: row in a clamp-mode inference of the interleaved
layout, the transposed half when no gradient of k or v is wanted, the caller maps when nothing
arrives or leaves in the caller's edge order). Shapes: q (N_dst, H, D), k (N_src, H, D),
v (N_src, H, Dv), edge_index (2, E), bias and mask (E, H), edge_key and edge_scale (E, H, D),
edge_value (E, H, Dv) in the caller's edge order (edge terms: interleaved layout only); out
(N_dst, H, Dv), weights (E, H) (empty unless return_weights); w and score (H * E,) in the layout's
edge order (score empty in exact mode) and z (N_dst * H,) are saved for the backward. Under
create_graph=True (double backward) the backward recomputes through the reference instead
(`reference_backward`), whose gradients torch can differentiate again; edge_index is an input
for that and for the edge terms' nodes.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..op_autograd import with_autograd
from ..reference import differentiable_grads, op_grads
from . import head_major, interleaved
from .index import HeadMajorIndex
from .interleaved import EdgeTerms
from .primitives import take


def _clamp(lo_hi: Optional[List[float]]) -> Optional[Tuple[float, float]]:
    return None if lo_hi is None else (lo_hi[0], lo_hi[1])


def _to_layout(x: Optional[Tensor], from_caller: Optional[Tensor], heads: int, head_major_layout: bool):
    """(E, H) in caller order -> the layout's edge order: (H, E) sorted (head-major) or (H * E,) slots."""
    if x is None:
        return None
    if head_major_layout:
        return (x if from_caller is None else x.index_select(0, from_caller)).t().contiguous()
    assert from_caller is not None
    return take(x.reshape(-1), from_caller)


def _edge_terms(
    edge_index: Tensor,
    terms: Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]],
    from_caller: Optional[Tensor],
    to_caller: Optional[Tensor],
) -> Optional[EdgeTerms]:
    """The interleaved kernels' view of the edge terms ((E, H, .) -> (E * H, .) rows; (E, 1, .),
    shared by the heads, -> (E, .) rows), or None without any."""
    if all(t is None for t in terms):
        return None
    assert from_caller is not None and to_caller is not None, "edge terms need both caller maps"
    heads = from_caller.shape[0] // max(edge_index.shape[1], 1)
    is_shared = [t is not None and t.shape[1] == 1 and heads > 1 for t in terms]
    shared = (is_shared[0], is_shared[1], is_shared[2])
    rows = [None if t is None else t.contiguous().view(-1, t.shape[2]) for t in terms]
    edge_of_slot = torch.div(from_caller, heads, rounding_mode="floor") if any(shared[:2]) else None
    key, value, scale = rows
    return EdgeTerms(
        key,
        value,
        scale,
        shared,
        from_caller,
        edge_of_slot,
        to_caller.reshape(-1),
        edge_index[0],
        edge_index[1],
    )


def _to_caller(x: Tensor, to_caller: Optional[Tensor], heads: int, head_major_layout: bool) -> Tensor:
    """The layout's edge order ((H, E) or (H * E,)) -> (E, H) in caller order."""
    if head_major_layout:
        x = x.view(heads, -1)
        return x.t().contiguous() if to_caller is None else x.t().index_select(0, to_caller)
    assert to_caller is not None
    return take(x, to_caller.reshape(-1)).view(-1, heads)


@torch.library.custom_op("sparseattn::csr_attention_fwd", mutates_args=())
def csr_attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_index: Tensor,
    crow: Tensor,
    col: Tensor,
    offsets: Tensor,
    row: Optional[Tensor],
    ccrow: Optional[Tensor],
    ccol: Optional[Tensor],
    to_csc: Optional[Tensor],
    from_caller: Optional[Tensor],
    to_caller: Optional[Tensor],
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    edge_key: Optional[Tensor],
    edge_value: Optional[Tensor],
    edge_scale: Optional[Tensor],
    eps: float,
    scale: float,
    clamp: Optional[List[float]],
    return_weights: bool,
    head_major_layout: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    heads = q.shape[1]
    lo_hi = _clamp(clamp)
    bias_l, mask_l = (_to_layout(x, from_caller, heads, head_major_layout) for x in (bias, mask))
    terms = _edge_terms(edge_index, (edge_key, edge_value, edge_scale), from_caller, to_caller)
    if head_major_layout:
        assert row is not None and terms is None, "edge terms run in the interleaved layout"
        index = HeadMajorIndex(crow, col, offsets, row, ccrow, ccol, to_csc, from_caller, to_caller)  # type: ignore[arg-type]
        out, w, score, z = head_major.forward(q, k, v, index, scale, lo_hi, bias_l, mask_l, eps)
        p = w / z.index_select(1, row) if return_weights else None
    else:
        slots = interleaved.Slots(
            crow, col, offsets, row, ccrow, ccol, to_csc, (q.shape[0] * heads, k.shape[0] * heads)
        )
        q2, k2, v2 = (t.contiguous().view(-1, t.shape[2]) for t in (q, k, v))  # (N * H, D): views
        out, w, score, z = interleaved.forward(q2, k2, v2, slots, scale, lo_hi, bias_l, mask_l, terms, eps)
        out = out.view(q.shape[0], heads, -1)
        p = w / take(z, row) if return_weights and row is not None else None
    weights = _to_caller(p, to_caller, heads, head_major_layout) if p is not None else w.new_empty(0)
    return out, weights, w.reshape(-1), w.new_empty(0) if score is None else score.reshape(-1), z.reshape(-1)


@csr_attention_fwd.register_fake
def _(q, k, v, edge_index, crow, col, offsets, row, ccrow, ccol, to_csc, from_caller, to_caller, bias, mask, *rest):
    scale, clamp, return_weights, head_major_layout = rest[-4:]
    heads, num_edges = q.shape[1], edge_index.shape[1]
    return (
        q.new_empty(q.shape[0], heads, v.shape[2]),
        q.new_empty(num_edges, heads) if return_weights else q.new_empty(0),
        q.new_empty(heads * num_edges),
        q.new_empty(0) if clamp is None else q.new_empty(heads * num_edges),
        q.new_empty(q.shape[0] * heads),
    )


@torch.library.custom_op("sparseattn::csr_attention_bwd", mutates_args=())
def csr_attention_bwd(
    grad_out: Tensor,
    grad_weights: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    score: Tensor,
    z: Tensor,
    mask: Optional[Tensor],
    edge_index: Tensor,
    edge_key: Optional[Tensor],
    edge_value: Optional[Tensor],
    edge_scale: Optional[Tensor],
    crow: Tensor,
    col: Tensor,
    offsets: Tensor,
    row: Optional[Tensor],
    ccrow: Optional[Tensor],
    ccol: Optional[Tensor],
    to_csc: Optional[Tensor],
    from_caller: Optional[Tensor],
    to_caller: Optional[Tensor],
    scale: float,
    clamp: Optional[List[float]],
    head_major_layout: bool,
    needs: List[bool],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (shaped as q, k, v), dbias ((E, H), caller order) and the edge terms' gradients
    (shaped as they are); an empty tensor where `needs` (q, k, v, bias, edge_key, edge_value,
    edge_scale) says no gradient is wanted."""
    heads = q.shape[1]
    lo_hi = _clamp(clamp)
    sc = score if clamp is not None else None
    mask_l = _to_layout(mask, from_caller, heads, head_major_layout)
    gw = _to_layout(grad_weights, from_caller, heads, head_major_layout)
    need = tuple(bool(n) for n in needs)
    d_terms: Tuple[Optional[Tensor], ...] = (None, None, None)
    if head_major_layout:
        index = HeadMajorIndex(crow, col, offsets, row, ccrow, ccol, to_csc, from_caller, to_caller)  # type: ignore[arg-type]
        w_l, z_l, sc = w.view(heads, -1), z.view(heads, -1), None if sc is None else sc.view(heads, -1)
        dq, dk, dv, ds = head_major.backward(
            grad_out, gw, q, k, v, w_l, sc, z_l, mask_l, index, scale, lo_hi, (need[0], need[1], need[2], need[3])
        )
    else:
        slots = interleaved.Slots(
            crow, col, offsets, row, ccrow, ccol, to_csc, (q.shape[0] * heads, k.shape[0] * heads)
        )
        q2, k2, v2 = (t.contiguous().view(-1, t.shape[2]) for t in (q, k, v))
        g2 = grad_out.reshape(q2.shape[0], v.shape[2])  # (N_dst * H, Dv)
        terms = _edge_terms(edge_index, (edge_key, edge_value, edge_scale), from_caller, to_caller)
        dq, dk, dv, ds, *d_terms = interleaved.backward(
            g2, gw, q2, k2, v2, w, sc, z, mask_l, slots, scale, lo_hi, need, terms
        )
        dq, dk, dv = (None if t is None else t.view(-1, heads, t.shape[1]) for t in (dq, dk, dv))
        given = (edge_key, edge_value, edge_scale)
        d_terms = tuple(None if d is None else d.view(t.shape) for d, t in zip(d_terms, given))  # type: ignore[union-attr]
    dbias = _to_caller(ds, to_caller, heads, head_major_layout) if need[3] and ds is not None else None
    grads = (dq, dk, dv, dbias, *d_terms)
    return tuple(q.new_empty(0) if t is None else t for t in grads)  # type: ignore[return-value]


@csr_attention_bwd.register_fake
def _(grad_out, grad_weights, q, k, v, w, score, z, mask, edge_index, edge_key, edge_value, edge_scale, *rest):
    needs = list(rest[-1]) + [False] * 3
    heads = q.shape[1]
    inputs = (q, k, v, None, edge_key, edge_value, edge_scale)
    grads = [torch.empty_like(t) if n and t is not None else q.new_empty(0) for t, n in zip(inputs, needs)]
    grads[3] = q.new_empty(w.shape[0] // heads, heads) if needs[3] else q.new_empty(0)
    return tuple(grads)


# inputs of the forward op, by name: the autograd rule returns a gradient for q, k, v, bias and the edge terms
_FWD_INPUTS = (
    "q k v edge_index crow col offsets row ccrow ccol to_csc from_caller to_caller bias mask "
    "edge_key edge_value edge_scale eps scale clamp return_weights head_major_layout"
).split()
_GRADIENTS = ("q", "k", "v", "bias", "edge_key", "edge_value", "edge_scale")
_GRAD_INPUTS = tuple(_FWD_INPUTS.index(n) for n in _GRADIENTS)  # the inputs with gradients


def _setup(ctx, inputs, output):
    named = dict(zip(_FWD_INPUTS, inputs))
    _, _, w, score, z = output
    # w, score and z are outputs only to reach the backward: no gradient flows into them, and none is
    # made up for an output left unused (zeros of H * E values each, 268 MB on an 8M-edge graph)
    ctx.mark_non_differentiable(w, score, z)
    ctx.set_materialize_grads(False)
    index = [named[n] for n in ("crow", "col", "offsets", "row", "ccrow", "ccol", "to_csc", "from_caller", "to_caller")]
    terms = [named[n] for n in ("edge_key", "edge_value", "edge_scale")]
    ctx.save_for_backward(
        named["q"],
        named["k"],
        named["v"],
        named["edge_index"],
        named["bias"],
        named["mask"],
        w,
        score,
        z,
        *terms,
        *index,
    )
    ctx.scale, ctx.clamp, ctx.head_major, ctx.eps = (
        named["scale"],
        named["clamp"],
        named["head_major_layout"],
        named["eps"],
    )


def _backward(ctx, grad_out, grad_weights, _w, _score, _z):
    q, k, v, edge_index, bias, mask, w, score, z, edge_key, edge_value, edge_scale, *index = ctx.saved_tensors
    terms = (edge_key, edge_value, edge_scale)
    wanted = [ctx.needs_input_grad[i] for i in _GRAD_INPUTS]
    if grad_weights is not None and grad_weights.numel() == 0:
        grad_weights = None
    if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
        again = differentiable_grads(
            edge_index, q, k, v, bias, mask, tuple(wanted), ctx.scale, ctx.clamp, grad_out, grad_weights, terms, ctx.eps
        )
        return op_grads(len(_FWD_INPUTS), _GRAD_INPUTS, again)
    if grad_out is None:  # only the weights were used
        grad_out = v.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    grads = csr_attention_bwd(
        grad_out,
        grad_weights,
        q,
        k,
        v,
        w,
        score,
        z,
        mask,
        edge_index,
        *terms,
        *index,
        ctx.scale,
        ctx.clamp,
        ctx.head_major,
        wanted,
    )
    return op_grads(len(_FWD_INPUTS), _GRAD_INPUTS, [g if want else None for g, want in zip(grads, wanted)])


# what csr_attention calls: the op with this rule (an autograd.Function around it in eager code)
csr_attention_op = with_autograd(csr_attention_fwd, _setup, _backward)

__all__ = ["csr_attention_op", "csr_attention_fwd", "csr_attention_bwd"]
