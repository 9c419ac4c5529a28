"""The triton backend: edge attention fused into one forward and two backward Triton kernels.

Forward (`forward_kernel.py`): one program per destination t and head h (or all heads: `LAYOUTS`, chosen
by `policy.forward_settings`) walks t's in-edges in the destination-sorted CSR in tiles of BLOCK_E, gathers k[s, h]
and v[s, h], and accumulates z = sum w_e and wv = sum w_e m_e v[s] in registers in float32 (float64
for float64 inputs), with w_e = exp(clamp(score_e)) or, for clamp=None, an online max as in
FlashAttention. It writes
out[t, h] = wv / (z + eps) once (0 without in-edges when eps = 0) and two statistics per
destination and head, stats = (m, z + eps) with m the max score (exact) or 0 (clamp), so that
p_e = w_e / (z + eps) = exp(logit_e - m) / (z + eps) (`common.weight`; every kernel computes the scores
with `common.score`, so the backward's p_e are the forward's). Bias, dropout mask, edge terms and
returned weights stay in the caller's edge order, read and written through perm (each sorted
edge's caller position).

Edge terms (each optional; absent ones compile away through the HAS_EDGE_* flags): per edge and head
the key is (k[s] + edge_key[e]) * edge_scale[e] and the value v[s] + edge_value[e]; the kernels load
those rows where they load k[s] and v[s], so no (E, H, D) tensor is made besides the inputs and their
gradients. An (E, 1, .) term, shared by the heads, is read with head stride 0.

Backward recomputes the weights; nothing of shape (E, H, D) is ever stored but the edge terms'
gradients. With dp_e = m_e <do[t], v[s] + edge_value[e]> + dweights_e and g_e clamp's gradient
indicator (1 in exact mode):
    dscore_e = g_e p_e (dp_e - delta[t]),   delta[t] = sum_{e -> t} p_e dp_e  (= <do[t], out[t]> + ...).
`dq_kernel` walks the CSR once: delta in float32 (not from the rounded output, which costs
half-precision gradients accuracy), dq[t] = scale sum g p (dp - delta) key_e (shifted, see the
kernel), and dp per edge into an (E, H) buffer in caller order. `dkdv_kernel` walks the
transposed CSR (per source): dscore = g p (dp - delta), which it leaves in that buffer as dbias;
with G_e = scale dscore_e q[t], dk[s] = sum_e G_e edge_scale[e], dv[s] = sum_e p_e m_e do[t], and
per edge d edge_key[e] = G_e edge_scale[e], d edge_scale[e] = G_e (k[s] + edge_key[e]),
d edge_value[e] = p_e m_e do[t] (a shared term's per-head rows are summed afterwards). Each
backward kernel runs one program per node and head, or per node for all heads
(`BACKWARD_LAYOUTS`, `policy.backward_settings`). No atomics, so
every run gives bit-identical gradients. Under create_graph=True (double backward) backward
recomputes through the reference instead (`reference.differentiable_grads`), whose gradients torch
can differentiate again.

The launches are two custom ops, `sparseattn::triton_attention_fwd`/`_bwd` (ops.py), with an
autograd rule: eager, compiled and exported code call the same ops, and a compiled graph holds them
whole. Runs on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before this
package was imported (tests do that).

The package, by job: common.py (jit helpers every kernel shares), forward_kernel.py,
backward_kernels.py, policy.py (launch settings from the shapes and a call's
`KernelOptions.triton_forward` / `triton_backward`), launch.py (the launches, by keyword), ops.py
(the ops, derived from `op_spec`, and `triton_attention`), blocks.py (the dense backend's fused
clamp-mode kernel for equal blocks).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..options import as_kernel_options, kernel_options
from ..triton_common import MAX_HEAD_DIM
from .ops import TRITON_OP, triton_attention, triton_attention_bwd, triton_attention_fwd
from .policy import BACKWARD_LAYOUTS, LAYOUTS, backward_settings, check_backward, check_forward, forward_settings


@contextlib.contextmanager
def forward_config(**settings: Any) -> Iterator[None]:
    """Inside the block, calls that pass no kernel_options launch the forward with these settings
    (layout, BLOCK_E, num_warps, num_stages), merged into an enclosing block's: a thin convenience
    over `kernels.kernel_options(triton_forward=...)`."""
    merged = {**as_kernel_options(None).triton_forward, **check_forward(settings)}
    with kernel_options(triton_forward=merged):
        yield


@contextlib.contextmanager
def backward_config(**settings: Any) -> Iterator[None]:
    """Calls whose forward runs inside the block (and passes no kernel_options) launch their
    backward kernels with these settings, whenever that backward runs: a thin convenience over
    `kernels.kernel_options(triton_backward=...)`."""
    merged = {**as_kernel_options(None).triton_backward, **check_backward(settings)}
    with kernel_options(triton_backward=merged):
        yield


__all__ = [
    "triton_attention",
    "MAX_HEAD_DIM",
    "LAYOUTS",
    "BACKWARD_LAYOUTS",
    "forward_settings",
    "backward_settings",
    "forward_config",
    "backward_config",
    "TRITON_OP",
    "triton_attention_fwd",
    "triton_attention_bwd",
]
