"""The triton backend's forward and backward ops, derived from one description
(`attention_op.define_attention_op`), and `triton_attention`, the backend's entry.

    sparseattn::triton_attention_fwd(<ATTENTION_ARGS>, ptr, idx, perm, cptr, cidx, cperm,
                                     forward_settings, backward_launch) -> out, weights, stats, scores
    sparseattn::triton_attention_bwd(grad_out, grad_weights, <saved>, stats, scores, <options>, needs)
                                     -> dq, dk, dv, dbias, dedge_key, dedge_value, dedge_scale

ptr, idx, perm: the destination-sorted CSR; cptr, cidx, cperm: the source-sorted one, for the
backward (None when no gradient is wanted). stats (N_dst, H, 2) in the accumulation dtype: (m, z)
per destination and head, saved for the backward; scores (E, H) float32: the forward's scores where
`launch.saves_scores` (float32 with a backward to come, `common.score`), else empty. forward_settings: the call's
`KernelOptions.triton_forward` (`policy.forward_ints`; the forward's launch follows from it and
the shapes inside the op); backward_launch: `policy.launch_ints` of the backward's settings as they
were when the forward ran (`KernelOptions.triton_backward`). The settings are ints, not a string:
dynamo cannot trace json, and the edge count (mean degree) stays inside the op, so a dynamic shape
is not specialized on."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import triton
from torch import Tensor

from ..attention_op import define_attention_op
from ..contract import AttentionInputs
from ..op_spec import Arg, Saved
from ..reference import accumulation_dtype
from ..triton_common import MAX_HEAD_DIM, on
from . import launch, policy
from .forward_kernel import forward_kernel

INDEX_ARGS = (
    Arg("ptr", "Tensor", saved=True),
    Arg("idx", "Tensor", saved=True),
    Arg("perm", "Tensor", saved=True),
    Arg("cptr", "Tensor?", saved=True),
    Arg("cidx", "Tensor?", saved=True),
    Arg("cperm", "Tensor?", saved=True),
    Arg("forward_settings", "int[]"),
    Arg("backward_launch", "int[]"),
)


def _pair(clamp: Optional[List[float]]) -> Optional[Tuple[float, float]]:
    return None if clamp is None else (clamp[0], clamp[1])


def _forward(a: Saved) -> Tuple[Tensor, ...]:
    q, v = a.q, a.v
    mean_degree = a.idx.shape[0] / max(q.shape[0], 1)
    given = policy.forward_from_ints(a.forward_settings)
    cfg = policy.forward_settings(q.shape[2], v.shape[2], q.shape[1], mean_degree, given, q.dtype == torch.float32)
    with on(q.device):
        out, stats, weights, scores = launch.forward(
            q, a.k, v, (a.ptr, a.idx, a.perm), a.scale, _pair(a.clamp), a.bias, a.mask, a.return_weights,
            tuple(a[name] for name in launch.TERM_ORDER), a.eps, cfg=cfg, backward=a.cptr is not None,
        )  # fmt: skip
    return out, weights if weights is not None else q.new_empty(0), stats, scores


def _saved_fake(a: Saved) -> Tuple[Tensor, ...]:
    q = a.q
    kept = a.idx.shape[0] if launch.saves_scores(q, a.cptr is not None) else 0
    return (
        q.new_empty(q.shape[0], q.shape[1], 2, dtype=accumulation_dtype(q.dtype)),
        q.new_empty(kept, q.shape[1], dtype=torch.float32),
    )


def _backward(a: Saved) -> Dict[str, Optional[Tensor]]:
    """dq, dk, dv, dbias ((E, H) in caller order, bias's dtype) and the edge terms' gradients
    (shaped as they are), by argument name; None where `a.wanted` says no gradient is wanted."""
    q, v = a.q, a.v
    needs = [a.wanted[n] for n in ("q", "k", "v", "bias", *launch.TERM_ORDER)]
    tiles = policy.launch_settings(a.backward_launch, q.shape[2], v.shape[2])
    with on(q.device):
        dq, dk, dv, ds, *d_terms = launch.backward(
            q, a.k, v, (a.ptr, a.idx, a.perm), (a.cptr, a.cidx, a.cperm), a.scale, _pair(a.clamp), a.bias, a.mask,
            a.stats, a.scores, a.grad_out, a.grad_weights, tuple(a[name] for name in launch.TERM_ORDER), needs[4:],
            tiles=tiles,
        )  # fmt: skip
    dbias = ds.to(a.bias.dtype) if needs[3] and a.bias is not None else None
    return dict(q=dq, k=dk, v=dv, bias=dbias, **dict(zip(launch.TERM_ORDER, d_terms)))


# what triton_attention calls (`TRITON_OP.call(*TRITON_OP.forward.bind(...))`)
TRITON_OP = define_attention_op("triton_attention", INDEX_ARGS, ("stats", "scores"), _forward, _saved_fake, _backward)
triton_attention_fwd, triton_attention_bwd = TRITON_OP.forward_op.op, TRITON_OP.backward_op.op  # the custom ops


# TRITON_INTERPRET=1 at import. Read here, not in the call: dynamo cannot trace this isinstance
_INTERPRETED = not isinstance(forward_kernel, triton.runtime.jit.JITFunction)


def _check_runnable(q: Tensor) -> None:
    if q.device.type != "cuda" and not (q.device.type == "cpu" and _INTERPRETED):
        raise RuntimeError(
            f"the triton backend needs CUDA tensors, got {q.device.type} (on CPU it runs only in "
            "Triton's interpreter: set TRITON_INTERPRET=1 before the backend is first used)"
        )


def _last_dim_contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    """An edge term as the kernels read it: rows with unit stride (other strides are passed)."""
    return t if t is None or t.stride(2) == 1 else t.contiguous()


def triton_attention(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
    """The fused Triton backend (the contract in contract.py): D, Dv <= 256; float16/bfloat16/float32
    accumulate in float32, float64 in float64. Takes the edge terms and eps (`Backend.edge_terms`)
    and, from `inputs.options`, the launch settings triton_forward and triton_backward (`policy`)."""
    q, k, v, graph, dropout_mask = inputs.q, inputs.k, inputs.v, inputs.graph, inputs.dropout_mask
    _check_runnable(q)
    if max(q.shape[2], v.shape[2]) > MAX_HEAD_DIM:
        raise ValueError(
            f"the triton backend supports head dims up to {MAX_HEAD_DIM}, got D={q.shape[2]}, "
            f"Dv={v.shape[2]}; use another backend"
        )
    forward_settings = policy.forward_ints(inputs.options.triton_forward)
    backward = policy.backward_settings(q.shape[2], v.shape[2], q.shape[1], inputs.options.triton_backward)
    terms = {name: _last_dim_contiguous(t) for name, t in inputs.terms.items()}
    ptr, idx, perm = graph.csr()
    cptr, cidx, cperm = graph.csc() if inputs.wants_grad() else (None, None, None)  # the backward walks both orders
    qkv = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous())
    mask = None if dropout_mask is None else dropout_mask.detach()
    out, weights, *_ = TRITON_OP.call(
        *TRITON_OP.forward.bind(
            **inputs.op_args(**qkv, mask=mask, **terms),
            ptr=ptr, idx=idx, perm=perm, cptr=cptr, cidx=cidx, cperm=cperm,
            forward_settings=forward_settings,
            backward_launch=policy.launch_ints(backward),
        )
    )  # fmt: skip
    return out, weights if inputs.return_weights else None


__all__ = ["TRITON_OP", "INDEX_ARGS", "triton_attention", "triton_attention_fwd", "triton_attention_bwd"]
