"""The interleaved layout of the csr backend: all heads in one sparse call.

Rows of q (N_dst, H, D) viewed as (N_dst * H, D) are "head rows" t * H + h, so the H per-head
patterns interleave into one (N_dst * H, N_src * H) CSR matrix whose head row t * H + h holds
columns s * H + h for the edges s -> t (index.py builds it); q, k, v and every output are then
plain views, with no transposes. Edge values live in that matrix's "slot" order (H * E,):
destination, then head, then source. The formulas are in the package docstring (__init__.py).

Edge terms (`EdgeTerms`: edge_key, edge_value, edge_scale, (E, H, .) in the caller's order) are read
as (E * H, .) row matrices through a second pattern with the same row pointers whose column for a
slot is its caller row e * H + h (`from_caller`): sddmm and spmm then add q[t] . edge_key[e] to
the scores and sum_e p_e edge_value[e] into the outputs without gathering anything per edge.
edge_scale multiplies inside the dot product, so with it the keys (k[s] + edge_key[e]) *
edge_scale[e] are gathered once, (E, H, D), and scored through that second pattern. Their
gradients are per edge: d edge_value = p * mask * grad_out[t] and, with G_e = scale * ds_e * q[t],
d edge_key = G * edge_scale, d edge_scale = G * (k[s] + edge_key), and dk = sum over each source's
edges of G * edge_scale when edge_scale is given.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .. import memory
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


# the edge terms these kernels compute, in the order of EdgeTerms' key, value and scale (`csr.TERMS`)
TERM_ORDER: Tuple[str, ...] = ("edge_key", "edge_value", "edge_scale")


class EdgeTerms(NamedTuple):
    """Edge terms as row matrices in the caller's order: (E * H, width), row e * H + h, or (E, width)
    when one row serves every head (`shared`); None when absent. What reading them takes:
    from_caller (H * E,) the caller row of each slot, edge_of_slot (H * E,) its caller edge (for
    shared terms, else None), to_caller (E * H,) the slot of each caller row, src and dst (E,)."""

    key: Optional[Tensor]
    value: Optional[Tensor]
    scale: Optional[Tensor]
    shared: Tuple[bool, bool, bool]
    from_caller: Tensor
    edge_of_slot: Optional[Tensor]
    to_caller: Tensor
    src: Tensor
    dst: Tensor
    groups: int = 1  # query heads per kv head (grouped-query attention): k2 has heads / groups heads

    @property
    def heads(self) -> int:
        return self.from_caller.shape[0] // max(self.src.shape[0], 1)

    @property
    def kv_heads(self) -> int:
        return self.heads // self.groups

    def cols(self, i: int) -> Tensor:
        """The column of each slot in term i's rows (0 key, 1 value, 2 scale)."""
        if self.shared[i]:
            assert self.edge_of_slot is not None
            return self.edge_of_slot
        return self.from_caller


def _edge_keys(k2: Tensor, terms: EdgeTerms) -> Tensor:
    """(E, H, D) keys k[s] + edge_key[e] of the caller's edges (a new tensor; each kv head's row
    repeated for its query heads)."""
    keys = k2.view(-1, terms.kv_heads, k2.shape[1]).index_select(0, terms.src)
    if terms.groups > 1:
        keys = keys.repeat_interleave(terms.groups, dim=1)
    if terms.key is not None:
        keys += terms.key.view(keys.shape[0], -1, keys.shape[2])  # (a shared row broadcasts over the heads)
    return keys


def _scaled_keys(k2: Tensor, terms: EdgeTerms) -> Tensor:
    """(E * H, D) rows (k[s] + edge_key[e]) * edge_scale[e] of the caller's edges."""
    assert terms.scale is not None
    keys = _edge_keys(k2, terms)
    return keys.mul_(terms.scale.view(keys.shape[0], -1, keys.shape[2])).view(-1, keys.shape[2])


def _per_edge(x2: Tensor, weights: Tensor, terms: EdgeTerms, shared: bool) -> Tensor:
    """weights[e, h] * x2[dst[e] * H + h] for x2: (N_dst * H, width) and weights (E * H,) in caller
    order: (E * H, width) rows, or their sum over the heads, (E, width), when shared (a CSR product
    whose row e holds the H head rows of e's destination: no (E, H, width) tensor)."""
    heads, num_edges = terms.heads, terms.dst.shape[0]
    head_rows = (terms.dst[:, None] * heads + torch.arange(heads, device=x2.device)).view(-1)
    if not shared:
        return x2.index_select(0, head_rows).mul_(weights[:, None])
    crow = torch.arange(0, heads * num_edges + 1, heads, device=x2.device)
    return spmm(crow, head_rows, weights, x2, (num_edges, x2.shape[0]))


def _head_sum(x: Tensor, terms: EdgeTerms, shared: bool) -> Tensor:
    """(E * H, width) rows -> their sum over heads (E, width) when the term is shared, else themselves."""
    return x.view(terms.src.shape[0], terms.heads, -1).sum(1) if shared else x


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
    terms: Optional[EdgeTerms] = None,
    eps: float = 0.0,
):
    """q2: (N_dst * H, D), k2: (N_src * H_kv, D), v2: (N_src * H_kv, Dv) (idx's columns read kv rows);
    bias, mask: slot order or None;
    terms: edge terms or None; eps: added to the normalizer. Returns out (N_dst * H, Dv), w and
    score (slot order; None in exact mode and when idx.row is None), z_safe (N_dst * H,)."""
    if terms is not None and terms.scale is not None:  # keys differ per edge: one (E, H, D) gather
        scores = sddmm(idx.crow, terms.from_caller, q2, _scaled_keys(k2, terms), alpha=scale)  # (per head)
    else:
        scores = sddmm(idx.crow, idx.col, q2, k2, alpha=scale)  # (H * E,)
        if terms is not None and terms.key is not None:
            scores += sddmm(idx.crow, terms.cols(0), q2, terms.key, alpha=scale)
    if bias is not None:
        scores += bias
    score: Optional[Tensor] = scores  # kept for the clamp's gradient mask
    if clamp is not None and idx.row is None:
        # no backward reads this forward (csr_attention leaves out `row` only then): in place, which
        # spares a fresh H * E buffer (above 32 MiB, 9% of the forward on a 65K-token window)
        w, score = scores.clamp_(clamp[0], clamp[1]).exp_(), None
    elif clamp is not None:
        w = torch.clamp(scores, clamp[0], clamp[1], out=memory.empty(scores.shape, scores)).exp_()
    else:
        assert idx.row is not None, "exact softmax needs the head row of each slot"
        w, score = exp_shifted_(scores, idx.offsets, idx.row), None
    z = _segment(w, idx, "sum")
    z_safe = z.add_(eps) if eps else z.masked_fill_(z == 0, 1.0)  # no in-edges: wv = 0, so out = 0
    wm = w if mask is None else w * mask
    out = spmm(idx.crow, idx.col, wm, v2, idx.shape)
    if terms is not None and terms.value is not None:
        out += spmm(idx.crow, terms.cols(1), wm, terms.value, (idx.shape[0], terms.value.shape[0]))
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
    need: Tuple[bool, ...],
    terms: Optional[EdgeTerms] = None,
):
    """grad_out: (N_dst * H, Dv); grad_weights: slot order or None; need: which of q, k, v, bias
    (and edge_key, edge_value, edge_scale, when terms are given) want a gradient. Returns dq
    (N_dst * H, D), dk (N_src * H, D), dv (N_src * H, Dv), ds (slot order) and d edge_key,
    d edge_value, d edge_scale ((E * H, .) caller order), None where not needed."""
    assert idx.row is not None
    need = (*need, False, False, False)[:7]
    dterms: Tuple[Optional[Tensor], ...] = (None, None, None)
    scaled = terms is not None and terms.scale is not None
    transposed = (idx.shape[1], idx.shape[0])
    # buffers of H * E values are reused where they can be, and fresh ones come from `memory`: above
    # 32 MiB a fresh buffer page-faults
    p = memory.take(z_safe, idx.row)
    p = torch.div(w, p, out=p)  # (H * E,) normalized weights
    dq = dk = dv = ds = None
    t_values = None  # values in the transposed order, for dv and then dk
    if need[2]:
        assert idx.ccrow is not None and idx.ccol is not None and idx.to_csc is not None
        t_values = memory.take(p if mask is None else p * mask, idx.to_csc)
        dv = spmm(idx.ccrow, idx.ccol, t_values, grad_out, transposed)
    if terms is not None and need[5]:  # d edge_value = p * mask * grad_out[t]
        pm = take(p if mask is None else p * mask, terms.to_caller)
        dterms = (None, _per_edge(grad_out, pm, terms, terms.shared[1]), None)
    if need[0] or need[1] or need[3] or need[4] or need[6]:
        a = sddmm(idx.crow, idx.col, grad_out, v2)  # <grad_out[t], v[s]>
        if terms is not None and terms.value is not None:
            a += sddmm(idx.crow, terms.cols(1), grad_out, terms.value)
        if mask is not None:
            a *= mask
        if grad_weights is not None:
            a += grad_weights
        ap = torch.mul(a, p, out=memory.empty(a.shape, a) if t_values is None else t_values)  # dv is done with it
        delta = _segment(ap, idx, "sum")  # (N_dst * H,)
        ds = a.sub_(torch.index_select(delta, 0, idx.row, out=ap)).mul_(p)
        if score is not None:  # clamp mode: no gradient where the clamp is active
            ds.masked_fill_((score < clamp[0]) | (score > clamp[1]), 0.0)
        if need[0]:
            if terms is not None and scaled:
                keys = _scaled_keys(k2, terms)
                dq = spmm(idx.crow, terms.from_caller, ds, keys, (idx.shape[0], keys.shape[0]), alpha=scale)
                del keys
            else:
                dq = spmm(idx.crow, idx.col, ds, k2, idx.shape, alpha=scale)
                if terms is not None and terms.key is not None:
                    dq += spmm(idx.crow, terms.cols(0), ds, terms.key, (idx.shape[0], terms.key.shape[0]), scale)
        if need[1] and not scaled:
            assert idx.ccrow is not None and idx.ccol is not None and idx.to_csc is not None
            t_ds = (
                memory.take(ds, idx.to_csc) if t_values is None else torch.index_select(ds, 0, idx.to_csc, out=t_values)
            )
            dk = spmm(idx.ccrow, idx.ccol, t_ds, q2, transposed, alpha=scale)
        if terms is not None and (need[4] or need[6] or (need[1] and scaled)):
            dk, dterms = _edge_key_grads(ds, q2, k2, terms, scale, need, dk, dterms[1])
    return dq, dk, dv, ds, *dterms


def _edge_key_grads(ds, q2, k2, terms: EdgeTerms, scale: float, need, dk, d_value):
    """The gradients that go through each edge's key, from ds (slot order): G = scale * ds * q[t] per
    caller row; d edge_key = G * edge_scale (G without it), d edge_scale = G * (k[s] + edge_key),
    each summed over the heads for a shared term, and dk = sum over each source's edges of
    G * edge_scale when edge_scale is given."""
    ds_caller = take(ds, terms.to_caller).mul_(scale)  # (E * H,)
    if terms.scale is None:
        return dk, (_per_edge(q2, ds_caller, terms, terms.shared[0]), d_value, None)
    g = _per_edge(q2, ds_caller, terms, False)  # (E * H, D)
    num_edges, heads, d = terms.src.shape[0], terms.heads, k2.shape[1]
    d_key = None
    if need[4] or need[1]:
        d_key = (g.view(num_edges, heads, d) * terms.scale.view(num_edges, -1, d)).view(-1, d)
    if need[1]:
        assert d_key is not None
        kv_heads = terms.kv_heads
        d_kv = d_key.view(num_edges, kv_heads, terms.groups, d).sum(2)  # summed over each kv head's query heads
        dk = k2.new_zeros(k2.shape[0] // kv_heads, kv_heads, d).index_add_(0, terms.src, d_kv).view(k2.shape)
    d_scale = None
    if need[6]:
        d_scale = _head_sum(g.mul_(_edge_keys(k2, terms).view(-1, d)), terms, terms.shared[2])
    if d_key is not None:
        d_key = _head_sum(d_key, terms, terms.shared[0]) if need[4] else None
    return dk, (d_key, d_value, d_scale)


__all__ = ["Slots", "EdgeTerms", "TERM_ORDER", "forward", "backward"]
