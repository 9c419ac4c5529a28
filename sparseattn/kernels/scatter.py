"""The "scatter" backend: the reference math on torch_scatter's segment reductions.

Edges are taken in the graph's destination-sorted CSR order, so every per-destination sum or
max is a `segment_csr` over contiguous runs (no atomics, no sort at call time):
    score_e = scale * <k[s] (+ edge_key), q[t]> (* edge_scale per channel) (+ bias)   per edge, (E, H)
    w_e     = exp(clamp(score_e)) or exp(score_e - segment_csr(score, "max"))
    out[t]  = segment_csr(w * mask * (v[s] (+ edge_value))) / (segment_csr(w) (+ eps))
torch_scatter's own backwards are not differentiable (double backward would silently drop the
second-order terms), so the summing ops are wrapped in `_SegmentSum` and `_Gather`, each the
other's backward: autograd then works to any order. Like the reference (and PyG), it gathers
(E, H, D) tensors, so it needs O(E * H * D) memory; it exists for parity with torch_scatter/PyG
users and as a second independent implementation. Needs `pip install torch-scatter` (extra `sparseattn[scatter]`).

Shapes: q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), bias/dropout_mask (E, H).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .contract import EPS, AttentionInputs

TERM_ORDER = ("edge_key", "edge_value", "edge_scale")  # the edge terms computed here, in this order
TERMS = frozenset(TERM_ORDER) | {EPS}  # its `Backend.edge_terms`


def probe() -> Optional[str]:
    """None if torch_scatter imports, else why not."""
    try:
        import torch_scatter  # noqa: F401
    except Exception as exc:  # ImportError, or an ABI mismatch with this torch (OSError/RuntimeError)
        return f"torch_scatter is not importable ({type(exc).__name__}: {exc}); pip install torch-scatter"
    return None


class _SegmentSum(torch.autograd.Function):
    """segment_csr(x, ptr, "sum"): x (E, ...) -> (N, ...); its backward is `_Gather`."""

    @staticmethod
    def forward(ctx, x: Tensor, ptr: Tensor) -> Tensor:
        from torch_scatter import segment_csr

        ctx.save_for_backward(ptr)
        return segment_csr(x, ptr, reduce="sum")

    @staticmethod
    def backward(ctx, grad):
        (ptr,) = ctx.saved_tensors
        return _Gather.apply(grad, ptr), None


class _Gather(torch.autograd.Function):
    """gather_csr(x, ptr): x (N, ...) -> (E, ...), row t repeated over its segment; its backward is `_SegmentSum`."""

    @staticmethod
    def forward(ctx, x: Tensor, ptr: Tensor) -> Tensor:
        from torch_scatter import gather_csr

        ctx.save_for_backward(ptr)
        return gather_csr(x, ptr)

    @staticmethod
    def backward(ctx, grad):
        (ptr,) = ctx.saved_tensors
        return _SegmentSum.apply(grad, ptr), None


def scatter_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "scatter" backend (the contract in contract.py): float32/float64 inputs."""
    q, k, v, graph, scale, clamp = inputs.q, inputs.k, inputs.v, inputs.graph, inputs.scale, inputs.clamp
    bias, dropout_mask, return_weights = inputs.bias, inputs.dropout_mask, inputs.return_weights
    from torch_scatter import segment_csr

    csr = graph.csr()
    ptr, src, perm = csr.ptr, csr.idx, None if graph.is_sorted_by_dst else csr.perm

    def sorted_(x: Optional[Tensor]) -> Optional[Tensor]:  # a per-edge tensor in caller order -> sorted
        return x if x is None or perm is None else x[perm]

    edge_key, edge_value, edge_scale = (sorted_(inputs.terms[name]) for name in TERM_ORDER)
    q_e = _Gather.apply(q, ptr)  # (E, H, D): q of each sorted edge's destination
    keys = k[src] if edge_key is None else k[src] + edge_key
    score = (keys * q_e if edge_scale is None else keys * edge_scale * q_e).sum(-1) * scale  # (E, H)
    if bias is not None:
        score = score + sorted_(bias)
    if clamp is not None:
        w = torch.exp(score.clamp(clamp[0], clamp[1]))
    else:
        m = segment_csr(score.detach(), ptr, reduce="max")  # (N_dst, H); empty segments give 0
        w = torch.exp(score - _Gather.apply(m.masked_fill(torch.isneginf(m), 0.0), ptr))
    z = _SegmentSum.apply(w, ptr)  # (N_dst, H)
    w_v = w if dropout_mask is None else w * (dropout_mask if perm is None else dropout_mask[perm])
    values = v[src] if edge_value is None else v[src] + edge_value
    wv = _SegmentSum.apply(w_v[..., None] * values, ptr)  # (N_dst, H, Dv)
    z_safe = z + inputs.eps if inputs.eps else torch.where(z == 0, torch.ones_like(z), z)
    out = wv / z_safe[..., None]
    weights = None
    if return_weights:
        weights = w / _Gather.apply(z_safe, ptr)
        if perm is not None:
            weights = torch.empty_like(weights).index_put((perm,), weights)
    return out, weights


__all__ = ["scatter_attention", "probe", "TERMS"]
