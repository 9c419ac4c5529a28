"""The reference backend: the definition of edge attention in plain torch.

For each edge e = (s, t), per head (edge terms and bias are optional: absent, they drop out):
    score_e = scale * sum_d q[t, d] * (k[s, d] + edge_key[e, d]) * edge_scale[e, d] + bias[e]
    w_e     = exp(clamp(score_e, lo, hi))             (clamp mode, DGL's scaled_exp)
            = exp(score_e - max_{e' -> t} score_e')   (clamp=None: exact softmax)
    wv[t]   = sum_{e -> t} w_e * (v[s] + edge_value[e]),   z[t] = sum_{e -> t} w_e
    out[t]  = wv[t] / (z[t] + eps)                    (eps = 0: a destination without edges gets 0)
Autograd is torch's own, so it differentiates to any order; `reference_backward` lends that to
the fast backends' hand-written backwards under create_graph=True. Every fast backend is tested
against this file.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..graphs import Graph
from .contract import EDGE_TERMS, AttentionInputs

# the differentiable inputs of an attention call, in the order `reference_backward` takes them
GRADIENT_INPUTS: Tuple[str, ...] = ("q", "k", "v", "bias", *(t.name for t in EDGE_TERMS))


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types accumulate in float32; float32/float64 in themselves."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def reference_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "reference" backend (the contract in contract.py): out (N_dst, H, Dv) in q's dtype and, if
    asked, the weights (E, H) in the graph's edge order. Any float dtype; half types accumulate in
    float32. k and v may have H_kv < H heads (grouped-query attention). Degenerate shapes (E = 0;
    H, D or Dv = 0) give their defined result."""
    q, k, v, graph, scale, clamp = inputs.q, inputs.k, inputs.v, inputs.graph, inputs.scale, inputs.clamp
    bias, dropout_mask, return_weights = inputs.bias, inputs.dropout_mask, inputs.return_weights
    src, dst = graph.src, graph.dst
    acc = accumulation_dtype(q.dtype)
    num_edges, heads, kv_heads = src.shape[0], q.shape[1], k.shape[1]
    groups = heads // kv_heads if kv_heads else 1

    def grouped(t: Tensor) -> Tensor:
        """A per-edge (E, H or 1, width) tensor as (E, H_kv or 1, G or 1, width), to broadcast against
        the kv rows (E, H_kv, 1, width) that each edge gathers once for its G query heads."""
        per_head = t.shape[1] == heads
        return t.to(acc).view(num_edges, kv_heads if per_head else 1, groups if per_head else 1, t.shape[2])

    keys = k[src].to(acc)[:, :, None]  # (E, H_kv, 1, D)
    if inputs.edge_key is not None:
        keys = keys + grouped(inputs.edge_key)
    if inputs.edge_scale is not None:
        keys = keys * grouped(inputs.edge_scale)
    score = (keys * grouped(q[dst])).sum(-1).reshape(num_edges, heads) * scale  # (E, H)
    if bias is not None:
        score = score + bias.to(acc)
    if clamp is not None:
        w = torch.exp(score.clamp(clamp[0], clamp[1]))
    else:
        # Subtracting any per-destination constant leaves out = wv / z unchanged, so the max
        # is detached; a destination whose scores are all -inf gets max 0 and then w = 0.
        m = torch.full((graph.num_dst, score.shape[1]), float("-inf"), dtype=acc, device=q.device)
        m = m.scatter_reduce(0, dst[:, None].expand_as(score), score.detach(), "amax")
        m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
        w = torch.exp(score - m[dst])
    z = torch.zeros(graph.num_dst, w.shape[1], dtype=acc, device=q.device).index_add_(0, dst, w)
    w_v = w if dropout_mask is None else w * dropout_mask.to(acc)
    wv = torch.zeros(graph.num_dst, heads, v.shape[2], dtype=acc, device=q.device)
    values = v[src].to(acc)[:, :, None]  # (E, H_kv, 1, Dv)
    if inputs.edge_value is not None:
        values = values + grouped(inputs.edge_value)
    w_values = grouped(w_v[..., None]) * values  # (E, H_kv, G, Dv)
    wv = wv.index_add_(0, dst, w_values.reshape(num_edges, heads, v.shape[2]))  # (N_dst, H, Dv)
    if inputs.eps:
        z_safe = z + inputs.eps
    else:
        z_safe = torch.where(z == 0, torch.ones_like(z), z)  # no in-edges: wv = 0, so out = 0 (NaN stays)
    out = (wv / z_safe[..., None]).to(q.dtype)
    weights = (w / z_safe[dst]).to(q.dtype) if return_weights else None
    return out, weights


def reference_backward(
    inputs: Sequence[Optional[Tensor]],
    needs: Tuple[bool, ...],
    graph: Graph,
    *,
    scale: float,
    clamp: Optional[Tuple[float, float]],
    dropout_mask: Optional[Tensor],
    grad_out: Optional[Tensor],
    grad_weights: Optional[Tensor],
    eps: float = 0.0,
) -> list:
    """Gradients of <out, grad_out> + <weights, grad_weights> with respect to inputs = (q, k, v,
    bias, then the edge terms in EDGE_TERMS' order, as many as given), recomputed through
    `reference_attention` with create_graph=True, so they can be differentiated again. A fast
    backend's backward calls this when it runs under create_graph=True (torch.is_grad_enabled()
    inside backward). needs[i] says whether inputs[i] wants a gradient; the others get None.
    Shapes as `reference_attention`."""
    if len(inputs) > len(GRADIENT_INPUTS):
        raise ValueError(f"reference_backward takes at most {len(GRADIENT_INPUTS)} inputs {GRADIENT_INPUTS}")
    given = dict(zip(GRADIENT_INPUTS, inputs))  # by name: a term added to EDGE_TERMS is carried too
    q, k, v = given["q"], given["k"], given["v"]
    assert q is not None and k is not None and v is not None
    terms: Dict[str, Any] = {t.name: given.get(t.name) for t in EDGE_TERMS}
    call = AttentionInputs(q, k, v, graph, scale, clamp, given.get("bias"), dropout_mask, grad_weights is not None)
    out, weights = reference_attention(call._replace(**terms, eps=eps))
    pairs = [(o, g) for o, g in ((out, grad_out), (weights, grad_weights)) if g is not None and o is not None]
    wanted = [t for t, need in zip(inputs, needs) if need and t is not None]
    grads = iter(
        torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True, allow_unused=True)
    )
    return [next(grads) if need else None for need in needs]


def differentiable_grads(
    edge_index: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Optional[Tensor],
    dropout_mask: Optional[Tensor],
    needs: Tuple[bool, ...],
    scale: float,
    clamp: Optional[Sequence[float]],
    grad_out: Optional[Tensor],
    grad_weights: Optional[Tensor],
    edge_terms: Sequence[Optional[Tensor]] = (),
    eps: float = 0.0,
) -> list:
    """What a fast backend's backward returns for (q, k, v, bias, edge terms in EDGE_TERMS' order)
    when it runs under create_graph=True (torch.is_grad_enabled() inside the backward):
    `reference_backward`'s gradients on the graph edge_index (2, E) from k's N_src rows into q's
    N_dst rows, which torch can differentiate again. bias and dropout_mask (E, H) and edge_terms
    (shaped as `AttentionInputs` says, or None; a prefix of EDGE_TERMS' order) in edge_index's order."""
    graph = Graph.unchecked(edge_index, k.shape[0], q.shape[0])
    lo_hi = None if clamp is None else (float(clamp[0]), float(clamp[1]))
    return reference_backward(
        (q, k, v, bias, *edge_terms),
        needs,
        graph,
        scale=scale,
        clamp=lo_hi,
        dropout_mask=dropout_mask,
        grad_out=grad_out,
        grad_weights=grad_weights,
        eps=eps,
    )


def op_grads(
    num_inputs: int, positions: Sequence[int], grads: Sequence[Optional[Tensor]]
) -> Tuple[Optional[Tensor], ...]:
    """What a fast backend's custom op returns from its backward: `grads` (of q, k, v, bias, ...) at
    those inputs' positions, None for each of its other num_inputs inputs (index tensors, flags)."""
    out: List[Optional[Tensor]] = [None] * num_inputs
    for i, g in zip(positions, grads):
        out[i] = g
    return tuple(out)
