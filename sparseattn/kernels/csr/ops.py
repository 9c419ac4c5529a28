"""The csr kernels as one forward and one backward `torch.library` custom op with an autograd rule,
derived from one description (`attention_op.define_attention_op`): the one path of eager, compiled
and exported code (the flash-attention pattern: op -> autograd rule -> thin function).

    sparseattn::csr_attention_fwd(<ATTENTION_ARGS>, <index>, head_major_layout)
                                  -> out, weights, w, score, z
    sparseattn::csr_attention_bwd(grad_out, grad_weights, <saved>, w, score, z, <options>, needs)
                                  -> dq, dk, dv, dbias, dedge_key, dedge_value, dedge_scale

<index> is crow, col, offsets, row, ccrow, ccol, to_csc, from_caller, to_caller of one layout
(index.py; optional parts None when not needed: row in a clamp-mode inference of the interleaved
layout, the transposed half when no gradient of k or v is wanted, the caller maps when nothing
arrives or leaves in the caller's edge order). Shapes: q (N_dst, H, D), k (N_src, H_kv, D),
v (N_src, H_kv, Dv) (H_kv divides H: grouped-query heads, see the package docstring),
edge_index (2, E), bias and mask (E, H), edge_key and edge_scale (E, H, D), edge_value
(E, H, Dv) in the caller's edge order (edge terms: interleaved layout only); out (N_dst, H, Dv),
weights (E, H) (empty unless return_weights); w and score (H * E,) in the layout's edge order
(score empty in exact mode and in a clamp-mode forward without `row`, which no backward reads)
and z (N_dst * H,) are saved for the backward. Under create_graph=True (double backward) the
backward recomputes through the reference instead.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..attention_op import define_attention_op
from ..op_spec import Arg, Saved
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
    groups: int = 1,
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
        groups,
    )


def _to_caller(x: Tensor, to_caller: Optional[Tensor], heads: int, head_major_layout: bool) -> Tensor:
    """The layout's edge order ((H, E) or (H * E,)) -> (E, H) in caller order."""
    if head_major_layout:
        x = x.view(heads, -1)
        return x.t().contiguous() if to_caller is None else x.t().index_select(0, to_caller)
    assert to_caller is not None
    return take(x, to_caller.reshape(-1)).view(-1, heads)


INDEX_ARGS = (
    Arg("crow", "Tensor", saved=True),
    Arg("col", "Tensor", saved=True),
    Arg("offsets", "Tensor", saved=True),
    Arg("row", "Tensor?", saved=True),
    Arg("ccrow", "Tensor?", saved=True),
    Arg("ccol", "Tensor?", saved=True),
    Arg("to_csc", "Tensor?", saved=True),
    Arg("from_caller", "Tensor?", saved=True),
    Arg("to_caller", "Tensor?", saved=True),
    Arg("head_major_layout", "bool"),
)


def _index(a: Saved) -> HeadMajorIndex:
    return HeadMajorIndex(a.crow, a.col, a.offsets, a.row, a.ccrow, a.ccol, a.to_csc, a.from_caller, a.to_caller)


def _slots(a: Saved) -> interleaved.Slots:
    shape = (a.q.shape[0] * a.q.shape[1], a.k.shape[0] * a.k.shape[1])  # (k: H_kv heads, grouped-query)
    return interleaved.Slots(a.crow, a.col, a.offsets, a.row, a.ccrow, a.ccol, a.to_csc, shape)


def _forward(a: Saved) -> Tuple[Tensor, ...]:
    q, k, v, heads, head_major_layout = a.q, a.k, a.v, a.q.shape[1], a.head_major_layout
    lo_hi = _clamp(a.clamp)
    bias_l, mask_l = (_to_layout(x, a.from_caller, heads, head_major_layout) for x in (a.bias, a.mask))
    groups = heads // a.k.shape[1]
    given = tuple(a[name] for name in interleaved.TERM_ORDER)
    terms = _edge_terms(a.edge_index, given, a.from_caller, a.to_caller, groups)
    if head_major_layout:
        assert a.row is not None and terms is None, "edge terms run in the interleaved layout"
        out, w, score, z = head_major.forward(q, k, v, _index(a), a.scale, lo_hi, bias_l, mask_l, a.eps)
        p = w / z.index_select(1, a.row) if a.return_weights else None
    else:
        q2, k2, v2 = (t.contiguous().view(-1, t.shape[2]) for t in (q, k, v))  # (N * H, D): views
        out, w, score, z = interleaved.forward(q2, k2, v2, _slots(a), a.scale, lo_hi, bias_l, mask_l, terms, a.eps)
        out = out.view(q.shape[0], heads, -1)
        p = w / take(z, a.row) if a.return_weights and a.row is not None else None
    weights = _to_caller(p, a.to_caller, heads, head_major_layout) if p is not None else w.new_empty(0)
    return out, weights, w.reshape(-1), w.new_empty(0) if score is None else score.reshape(-1), z.reshape(-1)


def _saved_fake(a: Saved) -> Tuple[Tensor, ...]:
    q, heads, num_edges = a.q, a.q.shape[1], a.edge_index.shape[1]
    kept = a.clamp is not None and (a.head_major_layout or a.row is not None)  # interleaved.forward's rule
    score = q.new_empty(heads * num_edges) if kept else q.new_empty(0)
    return q.new_empty(heads * num_edges), score, q.new_empty(q.shape[0] * heads)


def _backward(a: Saved) -> Dict[str, Optional[Tensor]]:
    """dq, dk, dv (shaped as q, k, v), dbias ((E, H), caller order) and the edge terms' gradients
    (shaped as they are), by argument name; None where `a.wanted` says no gradient is wanted."""
    q, k, v, heads, head_major_layout = a.q, a.k, a.v, a.q.shape[1], a.head_major_layout
    lo_hi = _clamp(a.clamp)
    sc = a.score if a.clamp is not None else None
    mask_l = _to_layout(a.mask, a.from_caller, heads, head_major_layout)
    gw = _to_layout(a.grad_weights, a.from_caller, heads, head_major_layout)
    need = tuple(a.wanted[n] for n in ("q", "k", "v", "bias", *interleaved.TERM_ORDER))
    d_terms: Tuple[Optional[Tensor], ...] = (None, None, None)
    if head_major_layout:
        w_l, z_l, sc = a.w.view(heads, -1), a.z.view(heads, -1), None if sc is None else sc.view(heads, -1)
        dq, dk, dv, ds = head_major.backward(
            a.grad_out,
            gw,
            q,
            k,
            v,
            w_l,
            sc,
            z_l,
            mask_l,
            _index(a),
            a.scale,
            lo_hi,
            (need[0], need[1], need[2], need[3]),
        )
    else:
        q2, k2, v2 = (t.contiguous().view(-1, t.shape[2]) for t in (q, k, v))
        g2 = a.grad_out.reshape(q2.shape[0], v.shape[2])  # (N_dst * H, Dv)
        given = tuple(a[name] for name in interleaved.TERM_ORDER)
        terms = _edge_terms(a.edge_index, given, a.from_caller, a.to_caller, heads // k.shape[1])
        dq, dk, dv, ds, *d_terms = interleaved.backward(
            g2, gw, q2, k2, v2, a.w, sc, a.z, mask_l, _slots(a), a.scale, lo_hi, need, terms
        )
        dq, dk, dv = (None if t is None else t.view(x.shape) for t, x in zip((dq, dk, dv), (q, k, v)))
        d_terms = tuple(None if d is None else d.view(t.shape) for d, t in zip(d_terms, given))
    dbias = _to_caller(ds, a.to_caller, heads, head_major_layout) if need[3] and ds is not None else None
    return dict(q=dq, k=dk, v=dv, bias=dbias, **dict(zip(interleaved.TERM_ORDER, d_terms)))


# what csr_attention calls (`CSR_OP.call(*CSR_OP.forward.bind(...))`): the op with its rule (an
# autograd.Function around it in eager code)
CSR_OP = define_attention_op("csr_attention", INDEX_ARGS, ("w", "score", "z"), _forward, _saved_fake, _backward)
csr_attention_fwd, csr_attention_bwd = CSR_OP.forward_op.op, CSR_OP.backward_op.op  # the custom ops

__all__ = ["CSR_OP", "INDEX_ARGS", "csr_attention_fwd", "csr_attention_bwd"]
