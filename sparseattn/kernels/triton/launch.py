"""The launches of the triton backend's three kernels, every argument passed by keyword (a
kernel's pointers, strides and flags are named where they are bound, so no two can swap).

`forward` runs the forward kernel; `backward` the two backward kernels. Both take the
destination-sorted CSR (ptr, idx, perm: each sorted edge's caller position), the backward also the
source-sorted one, and launch settings from `policy`."""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import triton
from torch import Tensor

from ..reference import accumulation_dtype
from ..triton_common import TL_DTYPE, strides
from .backward_kernels import dkdv_kernel, dq_kernel
from .forward_kernel import forward_kernel

# the edge terms the kernels compute, in the order of their EK, EV and ES parameters (with eps: the
# registry's TRITON_TERMS)
TERM_ORDER: Tuple[str, ...] = ("edge_key", "edge_value", "edge_scale")
EdgeTerms = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]  # in TERM_ORDER
NO_TERMS: EdgeTerms = (None, None, None)
Index = Tuple[Tensor, Tensor, Tensor]  # ptr, idx, perm


@functools.lru_cache(maxsize=64)
def _scalars(values: Tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """[scale, lo, hi] (and eps, where the forward adds one) as a tensor on the device, made once
    per setting and then only read. A tensor, not float arguments: Triton passes Python floats to
    compiled kernels as float32, which cost float64 inputs 1e-8 relative error on a GPU (the
    interpreter keeps them exact). Made once: a new one per call was a host-to-device copy that
    CUDA's sync debug mode flagged as synchronizing, 18 per Multi30k training step (H100, two per
    attention call)."""
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.tensor(values, dtype=dtype, device=device)


def _named_strides(t: Optional[Tensor], first: str, second: str) -> Dict[str, int]:
    s0, s1 = strides(t)
    return {first: s0, second: s1}


def shared_args(
    q: Tensor, v: Tensor, scale: float, clamp: Optional[Tuple[float, float]], bias, mask, eps: float = 0.0
) -> Dict[str, Any]:
    """What every kernel takes, by parameter name: BIAS and MASK (a never-read stand-in when absent)
    with their strides, the dims H, D, DV, SCALARS ([scale, lo, hi], then eps if it is not 0, in the
    accumulation dtype) and the compile-time flags."""
    dummy = q.new_empty(1)
    lo, hi = clamp if clamp is not None else (0.0, 0.0)
    values = (float(scale), float(lo), float(hi)) + ((float(eps),) if eps else ())
    acc = accumulation_dtype(q.dtype)
    return dict(
        BIAS=bias if bias is not None else dummy,
        MASK=mask if mask is not None else dummy,
        **_named_strides(bias, "sb_e", "sb_h"),
        **_named_strides(mask, "sm_e", "sm_h"),
        H=q.shape[1],
        D=q.shape[2],
        DV=v.shape[2],
        SCALARS=_scalars(values, acc, q.device),
        CLAMP=clamp is not None,
        HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None,
        ACC=TL_DTYPE[acc],
    )


def edge_args(q: Tensor, terms: EdgeTerms) -> Dict[str, Any]:
    """The edge terms by parameter name: EK, EV, ES (a never-read stand-in when absent), their
    (edge, head) strides (head stride 0 for an (E, 1, .) term shared by the heads) and the
    HAS_EDGE_* flags. Each term's last dim is contiguous (`triton_attention`)."""
    dummy = q.new_empty(1)
    named: Dict[str, Any] = {}
    for t, ptr, s, flag in zip(terms, ("EK", "EV", "ES"), ("sek", "sev", "ses"), ("KEY", "VALUE", "SCALE")):
        named[ptr] = t if t is not None else dummy
        shared = t is not None and t.shape[1] == 1
        named[f"{s}_e"], named[f"{s}_h"] = (t.stride(0), 0 if shared else t.stride(1)) if t is not None else (0, 0)
        named[f"HAS_EDGE_{flag}"] = t is not None
    return named


def _index(index: Index) -> Dict[str, Tensor]:
    """The kernels read index tensors as dense arrays: a strided view (a transposed edge_index's
    row) would be read wrongly, so one is copied (a no-op for the contiguous ones Graph keeps)."""
    return dict(zip(("PTR", "IDX", "PERM"), (t.contiguous() for t in index)))


# False: float32 calls sum every score in float64 in all three kernels instead of keeping the forward's
# (the previous way, 3x bfloat16's forward time on an H100); benchmarks/gpu_check.sh compares the two
SAVE_FLOAT32_SCORES = True


def saves_scores(q: Tensor, backward: bool) -> bool:
    """Whether the forward keeps each edge's score for the backward: float32 calls that will be
    differentiated (`common.score`)."""
    return backward and q.dtype == torch.float32 and SAVE_FLOAT32_SCORES


def wide_scores(q: Tensor, backward: bool) -> bool:
    """Whether the kernels sum float32 scores in float64 (each rounded once, so that every kernel
    finds the same score whatever its order): float32 calls to be differentiated that keep no scores."""
    return backward and q.dtype == torch.float32 and not SAVE_FLOAT32_SCORES


def forward(
    q, k, v, csr: Index, scale, clamp, bias, mask, return_weights: bool, terms=NO_TERMS, eps=0.0, *, cfg,
    backward: bool = False,
):  # fmt: skip
    """q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv) contiguous; csr: the destination-sorted
    (ptr, idx, perm); bias, mask (E, H) or None; terms: edge_key (E, H or 1, D), edge_value
    (E, H or 1, Dv), edge_scale (E, H or 1, D), each or None; eps added to each normalizer; cfg:
    `policy.forward_settings`. Returns out (N_dst, H, Dv), stats (N_dst, H, 2) (m and z:
    `common.weight`) in the accumulation dtype, weights (E, H) or None, and scores: (E, H) float32
    in caller order where `saves_scores(q, backward)`, else an empty tensor."""
    (n_dst, h), num_edges = q.shape[:2], csr[1].shape[0]
    save = saves_scores(q, backward)
    scores = torch.empty(num_edges if save else 0, h, dtype=torch.float32, device=q.device)
    out = torch.empty(n_dst, h, v.shape[2], dtype=q.dtype, device=q.device)
    stats = torch.empty(n_dst, h, 2, dtype=accumulation_dtype(q.dtype), device=q.device)  # m, z
    weights = torch.empty(num_edges, h, dtype=q.dtype, device=q.device) if return_weights else stats
    forward_kernel[(n_dst, triton.cdiv(h, cfg["BLOCK_H"]))](
        Q=q,
        K=k,
        V=v,
        OUT=out,
        STATS=stats,
        W=weights,
        S=scores if save else stats,
        **_index(csr),
        **_named_strides(q, "sq_n", "sq_h"),
        **_named_strides(k, "sk_n", "sk_h"),
        **_named_strides(v, "sv_n", "sv_h"),
        **_named_strides(out, "so_n", "so_h"),
        **shared_args(q, v, scale, clamp, bias, mask, eps),
        **edge_args(q, terms),
        RETURN_WEIGHTS=return_weights,
        HAS_EPS=bool(eps),
        SAVE_SCORES=save,
        WIDE=wide_scores(q, backward),
        **cfg,
    )
    return out, stats, (weights if return_weights else None), scores


def _term_grad(t: Optional[Tensor], needed: bool, heads: int, acc: torch.dtype) -> Tuple[Optional[Tensor], bool]:
    """The buffer an edge term's gradient is written into, (E, H, .) contiguous (in the accumulation
    dtype for a term shared by the heads, whose rows are summed afterwards), or None; and whether
    the term is shared."""
    if t is None or not needed:
        return None, False
    shared = t.shape[1] == 1 and heads > 1
    return torch.empty(t.shape[0], heads, t.shape[2], dtype=acc if shared else t.dtype, device=t.device), shared


def backward(
    q, k, v, csr: Index, csc: Index, scale, clamp, bias, mask, stats, scores, d_out, d_weights,
    terms: EdgeTerms, needs_terms: Sequence[bool], *, tiles: Dict[str, Any],
):  # fmt: skip
    """Gradients (dq, dk, dv, dscore, d edge_key, d edge_value, d edge_scale) of out (and of weights,
    if d_weights is given); dscore is (E, H) in caller order and the accumulation dtype: it is
    dbias. The edge terms' gradients are shaped as the terms, None where absent or where
    needs_terms (3 bools) says no. csr, csc: the destination- and source-sorted (ptr, idx, perm);
    tiles: both kernels' launch settings (`policy.backward_settings`); scores: the forward's (an
    empty tensor where it kept none)."""
    (n_dst, h), n_src, num_edges = q.shape[:2], k.shape[0], csr[1].shape[0]
    acc = accumulation_dtype(q.dtype)
    saved = scores.numel() > 0
    common = dict(shared_args(q, v, scale, clamp, bias, mask), **edge_args(q, terms), **tiles, STATS=stats)
    common.update(S=scores if saved else stats, SAVE_SCORES=saved, WIDE=wide_scores(q, True))
    common.update(Q=q, K=k, DO=d_out.contiguous())
    common.update(**_named_strides(q, "sq_n", "sq_h"), **_named_strides(k, "sk_n", "sk_h"))
    common.update(**_named_strides(v, "sv_n", "sv_h"), **_named_strides(common["DO"], "sdo_n", "sdo_h"))
    delta = torch.empty(n_dst, h, dtype=acc, device=q.device)  # sum_e p_e dp_e = <do, out> (+ p . dweights)
    ds = torch.empty(num_edges, h, dtype=acc, device=q.device)  # dp, then dscore; caller order
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    d_terms, shared = zip(*(_term_grad(t, need, h, acc) for t, need in zip(terms, needs_terms)))
    heads_grid = triton.cdiv(h, tiles["BLOCK_H"])
    dq_kernel[(n_dst, heads_grid)](
        V=v,
        DW=d_weights if d_weights is not None else ds,
        **_named_strides(d_weights, "sw_e", "sw_h"),
        HAS_DW=d_weights is not None,
        DQ=dq,
        DELTA=delta,
        DP=ds,
        **_index(csr),
        **common,
    )
    dkdv_kernel[(n_src, heads_grid)](
        DELTA=delta,
        DS=ds,
        DK=dk,
        DV_OUT=dv,
        DEK=d_terms[0] if d_terms[0] is not None else ds,
        DEV=d_terms[1] if d_terms[1] is not None else ds,
        DES=d_terms[2] if d_terms[2] is not None else ds,
        GRAD_EDGE_KEY=d_terms[0] is not None,
        GRAD_EDGE_VALUE=d_terms[1] is not None,
        GRAD_EDGE_SCALE=d_terms[2] is not None,
        **_index(csc),
        **common,
    )
    d_terms = tuple(
        d.sum(1, keepdim=True).to(t.dtype) if sh and t is not None else d for d, t, sh in zip(d_terms, terms, shared)
    )
    return (dq, dk, dv, ds, *d_terms)


__all__ = ["shared_args", "edge_args", "saves_scores", "forward", "backward", "EdgeTerms", "NO_TERMS", "TERM_ORDER"]
