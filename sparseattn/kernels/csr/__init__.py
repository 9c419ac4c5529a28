"""The "csr" backend: SDDMM scores and CSR SpMM aggregation over the destination-sorted pattern.

Forward, per head, with the graph's edges in destination order:
    score = scale * SDDMM(q, k) (+ bias)        torch.sparse.sampled_addmm
    w     = exp(clamp(score)) or exp(score - per-destination max)
    z     = segment sum of w                      (N_dst, H)
    out   = SpMM(w * dropout_mask, v) / z         (N_dst, H, Dv)   addmm, or embedding_bag (CPU float32)
The backward is written by hand from the same primitives (sampled_addmm's own backward builds a
dense N x N gradient): with p_e = w_e / z[t] the normalized weight of edge e = (s, t),
    a_e  = mask_e <grad_out[t], v[s]>  (+ the returned weights' own gradient, if any)
    ds_e = p_e (a_e - sum_{e' -> t} p_e' a_e') (* [lo <= score_e <= hi] in clamp mode);  dbias = ds
    dq = scale * SpMM(ds, k),  dk = scale * SpMM(ds^T, q),  dv = SpMM((p * mask)^T, grad_out)
(the segment sum equals <grad_out[t], out[t]>, at (E * H) rather than (N * H * Dv) cost), where
^T is the transposed (source-sorted) pattern. Nothing of shape (E, H, D) is allocated: extra
memory is O(E * H + N * H * D). float32 and float64 (edge_attention runs half types in float32).

Two layouts compute it (`LAYOUTS`): "interleaved" (interleaved.py: all heads in one sparse call
over a head-interleaved pattern of H * E slots) and "head-major" (head_major.py: one head at a time
over the graph's own CSR, for graphs whose edges read sources from far apart, and for training on
a raw edge_index from a size on). Eager code picks per graph (`prefers_head_major`); traced code
(torch.compile, torch.export) decides with no look at the data and no guard on sizes: head-major
when gradients are wanted (its index is E entries, built from the graph's CSR by plain tensor ops;
the interleaved backward would build an H * E transposed index), interleaved otherwise (measured
1.5-1.7x faster forward on window graphs of 8K and 65K tokens, level on a 50K-node random graph).
Both run through the same custom ops (ops.py), whose index arguments index.py builds.

Grouped-query heads (k, v: (N_src, H_kv, .) with G = H / H_kv query heads per kv head) run
natively in both layouts, with no (N_src, H, .) copy of k or v: the interleaved pattern keeps its
H * E slots and its columns point at kv rows s * H_kv + h // G (`InterleavedIndex.kv_col`); its
transposed pattern, whose rows s * H + h of one group are consecutive, becomes the kv rows' by
taking every G-th row pointer, so dk and dv come out summed over each group. The head-major
layout reads kv head h // G for query head h and adds each group's dk and dv.

Edge terms (edge_key, edge_value, edge_scale: the formulas in interleaved.py) run in the
interleaved layout, whose caller map (`from_caller`) lets sddmm and spmm read them in the
caller's order where they lie; eps (added to the normalizer) runs in both.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..._tracing import tracing
from ...graphs import Graph
from ..contract import EPS, AttentionInputs
from ..options import CSR_LAYOUTS
from .head_major import HEAD_MAJOR_MIN_TRAINING_SLOTS, head_major_rule, prefers_head_major, source_spread
from .index import head_major_index, interleaved_index
from .interleaved import TERM_ORDER
from .ops import CSR_OP

# what csr computes beside q, k, v and bias (its `Backend.edge_terms`): the interleaved kernels' terms and eps
TERMS = frozenset(TERM_ORDER) | {EPS}

LAYOUTS = (None, *CSR_LAYOUTS)


def csr_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The "csr" backend (the contract in contract.py). Its layout is the call's
    `inputs.options.csr_layout`: "interleaved", "head-major", or None to let `prefers_head_major`
    choose (inside a trace: head-major when gradients are wanted, else interleaved); with edge terms
    always interleaved. Builds (or reads from the graph's cache) the parts of the index this call
    needs, then calls the forward op."""
    layout = inputs.options.csr_layout
    q, k, v, graph, clamp = inputs.q, inputs.k, inputs.v, inputs.graph, inputs.clamp
    bias, mask, return_weights = inputs.bias, inputs.dropout_mask, inputs.return_weights
    has_terms = any(t is not None for t in inputs.terms.values())
    grad = torch.is_grad_enabled()
    wants_grad = inputs.wants_grad()
    kv_grad = grad and (k.requires_grad or v.requires_grad)
    groups = q.shape[1] // k.shape[1]  # query heads per kv head (grouped-query attention; 1 without)
    if has_terms:
        if layout == "head-major":
            raise ValueError(f"edge terms ({', '.join(TERM_ORDER)}) run in the interleaved layout only")
        head_major_layout = False
    elif layout is None:  # traced code decides without looking at the data: head-major to train, else interleaved
        head_major_layout = wants_grad if tracing() else prefers_head_major(graph, k, wants_grad)
    else:
        head_major_layout = layout == "head-major"
    if head_major_layout:
        hm = head_major_index(graph)
        transposed = (hm.ccrow, hm.ccol, hm.to_csc) if kv_grad else (None, None, None)
        index = (hm.crow, hm.col, hm.offsets, hm.row, *transposed, hm.from_caller, hm.to_caller)
    else:
        ix = interleaved_index(graph, q.shape[1])
        row = ix.row if clamp is None or return_weights or wants_grad else None  # a clamp-mode forward needs none
        transposed = ix.transposed() if kv_grad else (None, None, None)
        # grouped kv heads: the columns read kv rows; a kv row's transposed row is its G head rows'
        col = ix.col if groups == 1 else ix.kv_col(k.shape[1])
        if groups > 1 and transposed[0] is not None:
            transposed = (transposed[0][::groups].contiguous(), *transposed[1:])
        # (E, H) arriving in the caller's order; edge terms are read through the caller map both ways
        caller_in = bias is not None or mask is not None or (return_weights and wants_grad) or has_terms
        from_caller = ix.from_caller if caller_in else None
        bias_grad = bias is not None and bias.requires_grad and grad
        to_caller = ix.to_caller if return_weights or bias_grad or has_terms else None
        index = (ix.crow, col, ix.offsets, row, *transposed, from_caller, to_caller)
        q, k, v = (t.contiguous() for t in (q, k, v))
    index_names = ("crow", "col", "offsets", "row", "ccrow", "ccol", "to_csc", "from_caller", "to_caller")
    args = CSR_OP.forward.bind(
        **inputs.op_args(q=q, k=k, v=v), **dict(zip(index_names, index)), head_major_layout=head_major_layout
    )
    out, weights, *_ = CSR_OP.call(*args)
    return out, weights if return_weights else None


def prepare(graph: Graph, heads: int, head_dim: Optional[int] = None, dtype: torch.dtype = torch.float32) -> None:
    """Build and cache the index csr will read for this graph and head count: the layout eager code
    picks for keys (N_src, heads, head_dim) of dtype (both layouts when head_dim is None), with
    every part a forward, a backward and returned weights read; head-major too from
    HEAD_MAJOR_MIN_TRAINING_SLOTS (edge, head) slots up, which traced code takes for training."""
    row_bytes = None if head_dim is None else heads * head_dim * torch.empty(0, dtype=dtype).element_size()
    head_major = None if row_bytes is None else head_major_rule(graph, heads, row_bytes)
    if graph.device.type != "cpu":  # prefers_head_major: the head-major layout serves CPU tensors only
        head_major = False
    source_spread(graph)
    if head_major is not False or (heads > 1 and graph.num_edges * heads >= HEAD_MAJOR_MIN_TRAINING_SLOTS):
        head_major_index(graph)
    if head_major is not True:
        ix = interleaved_index(graph, heads)
        ix.row, ix.from_caller, ix.to_caller, ix.transposed()  # noqa: B018 (touching them builds them)


__all__ = ["csr_attention", "prepare", "LAYOUTS", "TERMS", "prefers_head_major"]
