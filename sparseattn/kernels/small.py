"""The "small" backend: attention over small graphs (a mini-batch of molecules, a short sequence) in
few ops, where per-op and per-new-graph overhead, not arithmetic, decides the time.

One autograd Function over the caller's edge order, with the reference's formula:
    score = scale * <q[dst], k[src] + edge_key> + bias          (E, H)
    w     = exp(clamp(score)) or exp(score - max over the destination's in-edges)
    p     = w / z[dst],  z = index_add(dst, w)                  (a destination without edges: z = 1)
    out   = index_add(dst, (p * dropout_mask) (v[src] + edge_value))
Forward: gathers, one scatter max (exact mode), two index_add sums; backward by hand from the saved
(E, H, D) gathers, with g = grad_out[dst] and a = mask <g, v[src] + edge_value> (+ the weights' own
gradient):
    ds = p (a - sum_{e -> t} p_e a_e) [* lo <= score <= hi]      (= d bias)
    dq = index_add(dst, scale ds (k[src] + edge_key)),  dk = index_add(src, scale ds q[dst])
    dv = index_add(src, p mask g)                                 (edge_key, edge_value: the per-edge terms)
No CSR, no sort, nothing cached on the graph, so a graph seen once costs nothing to prepare; the
saved gathers are O(E * H * D), which bounds it to small graphs (`SMALL_MAX_VALUES`). Calls with
another edge term (edge_scale, eps) run the reference. A second derivative (create_graph=True) comes from the reference.
The op is an autograd.Function: eager and torch.compile (traced, dynamic sizes), not torch.export
(whose programs keep the library's custom ops).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .._checks import check_edge_ids
from .._tracing import tracing
from .contract import AttentionInputs
from .reference import differentiable_grads, reference_attention

# "auto" (kernels/auto.py, `small_pays`) picks this backend on CPU for at most this many gathered
# values (E * H * D): SMALL_MAX_VALUES on a Graph that is reused (csr's index, built once, pays off),
# SMALL_MAX_VALUES_ONE_CALL on a graph seen once (a raw edge_index, `Graph.one_call`: csr would build
# its index for this call alone) or a call with per-edge key or value terms (csr reads them through a
# second pattern in the interleaved layout; here they are one more gather). Measured fwd+bwd against
# csr, 1 thread (the other core busy), random graphs of 16 in-edges, medians of 30 interleaved:
# E * H * D = 2^15 (H=4, D=16) 1.5x faster on a reused Graph, 2.0x on a new Graph per call; 2^17
# 0.62x / 1.78x; 2^18 (H=8, D=64) 0.78x / 1.26x; 2^19 0.32x / 0.54x. With edge_key and edge_value
# (E, H, D), on a reused Graph, H=4, D=16, 2 / 4 / 16 in-edges (medians of 15 interleaved): 2^17 1.12x
# / 1.63x / 1.72x, 2^18 0.93x / 0.99x / 1.33x. Without them at 2 / 4 / 16 in-edges, 2^17: 0.66x /
# 0.90x / 0.90x. One bound of 2^17 for both sent a batch of 32 molecules of 5-60 atoms (2,300 edges,
# H=4, D=16: 2^17.2 values, a raw edge_index) to csr: TransformerConv's fwd+bwd 2.3x slower than here;
# the 2^16 bound sent the same batch as a `from_pyg` Graph shared by three layers to csr and the
# factored edge projection: 1.5x slower than "small" on it.
SMALL_MAX_VALUES = 1 << 16
SMALL_MAX_VALUES_ONE_CALL = 1 << 18


def small_pays(values: int, one_call: bool, edge_kv: bool = False) -> bool:
    """Whether "small" is the faster side for a call gathering `values` (E * H * max(D, Dv)) on a graph
    seen once (one_call) or reused, with or without per-edge key or value terms (edge_kv)."""
    return values <= (SMALL_MAX_VALUES_ONE_CALL if one_call or edge_kv else SMALL_MAX_VALUES)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """(M, H, C), (M, H, C) -> (M, H) channel dot products, summed by a matrix-vector product with
    ones (measured ~1.4x faster than .sum(-1) over C = 16 on CPU). Traced code sums with .sum(-1),
    which inductor fuses with the product and the gathers before it (a matrix-vector product is a
    call of its own there): compiled TransformerConv fwd+bwd on batches of 32 molecules 1.07-1.09x
    faster (GATConv 1.02x, GATv2Conv level; 1 thread, interleaved)."""
    if tracing():
        return (a * b).sum(-1)
    m, h, c = a.shape
    return torch.mv((a * b).reshape(m * h, c), a.new_ones(c)).view(m, h)


def _per_edge_grad(grad: Tensor, term: Tensor) -> Tensor:
    """grad (E, H, C) summed over the heads where the edge term is one row shared by them (E, 1, C)."""
    return grad.sum(1, keepdim=True) if term.shape[1] == 1 and grad.shape[1] != 1 else grad


ROLES = ("q", "k", "v", "bias", "edge_key", "edge_value", "dropout_mask")
COMPUTED_TERMS = frozenset({"edge_key", "edge_value"})  # computed here; calls with others run the reference


class SmallAttention(torch.autograd.Function):
    """forward(slots, edge_index, scale, clamp, return_weights, *tensors) -> (out (N_dst, H, Dv), weights
    (E, H) or None), as the module docstring: ROLES[i] is tensors[slots[i]] (None for -1), so a tensor
    playing two roles (q = k = v in self-attention, edge_key = edge_value) is passed once, as
    torch.compile's tracing of autograd.Function needs; edge_index (2, E), its ids checked against q's
    and k's rows. Saves the gathers for its hand-written backward; under create_graph=True the backward
    is the reference's, which differentiates again."""

    @staticmethod
    def forward(ctx, slots, edge_index, scale, clamp, return_weights, *tensors):
        q, k, v = (tensors[s] for s in slots[:3])  # always given
        bias, edge_key, edge_value, mask = (tensors[s] if s >= 0 else None for s in slots[3:])
        ctx.slots = slots
        src, dst = edge_index[0], edge_index[1]
        num_dst, heads = q.shape[0], q.shape[1]
        q_e = q.index_select(0, dst)  # (E, H, D)
        k_e = k.index_select(0, src)
        v_e = v.index_select(0, src)  # (E, H, Dv)
        if (
            edge_key is not None
        ):  # in place: the gathers are this call's own (a fresh (E, H, D) sum faulted its pages in)
            k_e.add_(edge_key)
        if edge_value is not None:
            v_e.add_(edge_value)
        score = _dot(q_e, k_e).mul_(scale)  # (E, H)
        if bias is not None:
            score.add_(bias)
        if clamp is not None:
            w = score.clamp(clamp[0], clamp[1]).exp_()
        else:
            index = dst.unsqueeze(1).expand(-1, heads)
            top = score.new_full((num_dst, heads), float("-inf")).scatter_reduce_(0, index, score, "amax")
            # all -inf (every score of the destination): a finite shift, so w = exp(-inf) = 0, not NaN
            top.clamp_(min=torch.finfo(top.dtype).min)  # (NaN stays NaN)
            w = (score - top.index_select(0, dst)).exp_()  # (E, H), <= 1
        z = w.new_zeros(num_dst, heads).index_add_(0, dst, w)
        # z is 0 only where every weight is (all scores -inf): p = 0 there. Elsewhere z >= 1 (exact) or
        # z >= exp(lo) (clamp; bounds within `max_clamp_bound`), far above tiny; a NaN sum stays NaN
        z.clamp_(min=torch.finfo(z.dtype).tiny)
        p = w.div_(z.index_select(0, dst))  # normalized weights (E, H)
        pm = p if mask is None else p * mask
        out = v_e.new_zeros(num_dst, heads, v.shape[2]).index_add_(0, dst, v_e * pm.unsqueeze(-1))
        clamped = score if clamp is not None else None  # the clamp's gradient mask reads it
        ctx.save_for_backward(q_e, k_e, v_e, p, mask, out, clamped, edge_index, q, k, v, bias, edge_key, edge_value)
        ctx.scale, ctx.clamp = scale, clamp
        ctx.set_materialize_grads(False)  # grad_p is None unless the weights were used
        return out, (p if return_weights else None)

    @staticmethod
    def backward(ctx, grad_out, grad_p):
        q_e, k_e, v_e, p, mask, out, score, edge_index, q, k, v, bias, edge_key, edge_value = ctx.saved_tensors
        wants = ctx.needs_input_grad[5:]
        needs = tuple(s >= 0 and wants[s] for s in ctx.slots[:6])
        if torch.is_grad_enabled():  # create_graph=True: gradients torch can differentiate again
            grads = differentiable_grads(
                edge_index, q, k, v, bias, mask, (*needs, False), ctx.scale, ctx.clamp,
                grad_out, grad_p, edge_terms=(edge_key, edge_value, None),
            )  # fmt: skip
            return (None,) * 5 + _per_tensor(ctx.slots, grads[:6], len(wants), in_place=False)
        need_q, need_k, need_v, need_bias, need_ek, need_ev = needs
        src, dst, scale = edge_index[0], edge_index[1], ctx.scale
        grad_out = out.new_zeros(()).expand_as(out) if grad_out is None else grad_out.contiguous()
        g_e = grad_out.index_select(0, dst)  # (E, H, Dv)
        a = _dot(g_e, v_e)  # (E, H): d out / d p, through the mask
        if mask is not None:
            a.mul_(mask)
        mean = _dot(grad_out, out)  # (N_dst, H): sum over t's in-edges of p_e a_e
        if grad_p is not None:
            a.add_(grad_p)
            mean.index_add_(0, dst, p * grad_p)
        ds = a.sub_(mean.index_select(0, dst)).mul_(p)  # (E, H): d score
        if score is not None:  # clamp mode: no gradient where the clamp binds
            ds.mul_((score >= ctx.clamp[0]) & (score <= ctx.clamp[1]))
        ds_scaled = (ds * scale).unsqueeze(-1)
        pm = (p if mask is None else p * mask).unsqueeze(-1)
        dq = dk = dv = d_ek = d_ev = None
        # the saved tensors stay unmodified (a backward with retain_graph=True may run again)
        if need_q:
            dq = q_e.new_zeros(q.shape).index_add_(0, dst, k_e * ds_scaled)
        if need_k or need_ek:
            dk_e = q_e * ds_scaled  # (E, H, D): gradient of k[src] + edge_key
            dk = dk_e.new_zeros(k.shape).index_add_(0, src, dk_e) if need_k else None
            d_ek = _per_edge_grad(dk_e, edge_key) if need_ek else None
        if need_v or need_ev:
            dv_e = g_e * pm  # gradient of v[src] + edge_value
            dv = dv_e.new_zeros(v.shape).index_add_(0, src, dv_e) if need_v else None
            d_ev = _per_edge_grad(dv_e, edge_value) if need_ev else None
        return (None,) * 5 + _per_tensor(ctx.slots, (dq, dk, dv, ds if need_bias else None, d_ek, d_ev), len(wants))


def _per_tensor(slots, grads, count: int, in_place: bool = True) -> tuple:
    """The gradients of the roles (ROLES' first len(grads)) summed per distinct tensor (count of them):
    in place where each is the backward's own tensor (not under create_graph, whose sums autograd
    differentiates)."""
    out: list = [None] * count
    for s, g in zip(slots, grads):
        if g is not None:
            out[s] = g if out[s] is None else (out[s].add_(g) if in_place else out[s] + g)
    return tuple(out)


@torch.library.custom_op("sparseattn::checked_edge_index", mutates_args=())
def checked_edge_index(edge_index: Tensor, num_src: int, num_dst: int) -> Tensor:
    """edge_index (2, E) as traced code reads it: its ids checked first (eager calls check a raw index
    before any backend runs, a trace cannot read it: an IndexError naming the row, as eager raises),
    then a copy (an op may not return its input; a small graph's index is a few KB)."""
    check_edge_ids(edge_index, num_src, num_dst)
    return edge_index.clone()


@checked_edge_index.register_fake
def _(edge_index: Tensor, num_src: int, num_dst: int) -> Tensor:
    return torch.empty_like(edge_index)


def small_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "small" backend (the contract in contract.py): out (N_dst, H, Dv) and, if asked, the
    weights (E, H). Calls with an edge term it does not compute (COMPUTED_TERMS: edge_scale, eps or
    any term added since) run the reference."""
    if not inputs.extras <= COMPUTED_TERMS:
        return reference_attention(inputs)
    distinct: list = []
    slots = []
    for t in (getattr(inputs, name) for name in ROLES):
        if t is None:
            slots.append(-1)
            continue
        found = next((i for i, d in enumerate(distinct) if d is t), None)
        if found is None:
            distinct.append(t)
            found = len(distinct) - 1
        slots.append(found)
    graph = inputs.graph
    edge_index = checked_edge_index(graph.edge_index, graph.num_src, graph.num_dst) if tracing() else graph.edge_index
    return SmallAttention.apply(tuple(slots), edge_index, inputs.scale, inputs.clamp, inputs.return_weights, *distinct)


__all__ = [
    "SMALL_MAX_VALUES",
    "SMALL_MAX_VALUES_ONE_CALL",
    "small_pays",
    "SmallAttention",
    "small_attention",
    "checked_edge_index",
]
