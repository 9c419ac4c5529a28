"""Per-edge terms given as a projection of edge features (`EdgeProjection`), and the form a call
with one takes, decided here (`kernels.auto.factor_edge_projection`), not by the layer that passes it.

An `EdgeProjection(features, weight)` stands for the term W_h a_e of each edge e and head h, with a_e
the edge's F features and W_h the (C, F) block of head h in weight (H * C, F): TransformerConv's
lin_edge(edge_attr) before it is computed. `edge_attention` takes one as edge_key and/or edge_value and
either builds the (E, H, C) term (`EdgeProjection.materialize`) and attends with it, or, where one
projection is both the key and the value term, attends without ever building it:

    <q_t, k_s + W_h a_e> = <[q_t, W_h^T q_t], [k_s, a_e]>          (per head; C + F channels)
    sum_e p_e (v_s + W_h a_e) = [sum_e p_e v_s] + W_h sum_e p_e a_e

so the call runs with queries [q, W_h^T q] (N_dst, H, C + F), keys [k, 0] and values [v, 0]
(N_src, H, C + F) and one edge row [0, a_e] (E, 1, C + F) shared by the heads as both terms, and maps
the last F output channels back through W_h: C + F values per edge instead of H * C, the same formula.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_qkv
from .auto import factor_edge_projection


class EdgeProjection(NamedTuple):
    """A per-edge term given by its factors: term[e, h] = weight[h * C:(h + 1) * C] @ features[e],
    i.e. `F.linear(features, weight).view(E, H, C)`, left to the kernels to compute or to factor.

    features: (E, F) per-edge features in the graph's edge order (a PyG layer's edge_attr);
    weight: (H * C, F), heads major (an `nn.Linear(F, H * C, bias=False)`'s weight); C is q's head dim
    D for edge_key and v's Dv for edge_value. Both differentiable."""

    features: Tensor
    weight: Tensor

    def materialize(self, heads: int) -> Tensor:
        """The term itself, (E, heads, C)."""
        return F.linear(self.features, self.weight).view(self.features.shape[0], heads, self.weight.shape[0] // heads)


def check_projection(p: EdgeProjection, name: str, heads: int, width: int, width_name: str) -> None:
    """features (E, F) and weight (heads * width, F), floating point; ValueError or TypeError naming
    `name` (edge_key or edge_value)."""
    for part, t in (("features", p.features), ("weight", p.weight)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 2:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{name}.{part} must be a 2-D floating-point tensor, got {got}")
    if p.weight.shape != (heads * width, p.features.shape[1]):
        raise ValueError(
            f"{name}.weight must have shape (H * {width_name}, F) = {(heads * width, p.features.shape[1])} "
            f"(H={heads} heads of {width_name}={width}, F={p.features.shape[1]} features per edge), got "
            f"{tuple(p.weight.shape)}"
        )


def shape_view(term: Any, heads: int) -> Any:
    """A projection as a zero-copy (E, heads, C) stand-in of its term (its dtype and device), for
    checks that read only those; anything else as it is."""
    if not isinstance(term, EdgeProjection):
        return term
    width = term.weight.shape[0] // heads if heads else 0
    return term.features[:, :1].unsqueeze(2).expand(term.features.shape[0], heads, width)


class ProjectedCall(NamedTuple):
    """The call `edge_attention` makes for one with projections (`plan_projections`): its q, k, v,
    edge_key, edge_value and scale, and, when factored, w (H, C, F), by which `finish` maps the
    output's last F channels back (None: the output is the call's own)."""

    q: Tensor
    k: Tensor
    v: Tensor
    edge_key: Optional[Tensor]
    edge_value: Optional[Tensor]
    scale: Optional[float]
    w: Optional[Tensor] = None


def plan_projections(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_key: Union[Tensor, EdgeProjection, None],
    edge_value: Union[Tensor, EdgeProjection, None],
    edge_scale: Optional[Tensor],
    eps: float,
    scale: Optional[float],
) -> ProjectedCall:
    """How `edge_attention` computes a call whose edge_key and/or edge_value is an `EdgeProjection`:
    factored (the module docstring) where one projection is both terms, no edge_scale or eps, k and v
    have q's heads and `auto.factor_edge_projection` says so; otherwise with the projections built.
    The projections are checked first (errors name edge_key or edge_value)."""
    check_qkv(q, k, v)
    heads = q.shape[1]
    for name, term, width, width_name in (
        ("edge_key", edge_key, q.shape[2], "D"),
        ("edge_value", edge_value, v.shape[2], "Dv"),
    ):
        if isinstance(term, EdgeProjection):
            check_projection(term, name, heads, width, width_name)
    factored = (
        isinstance(edge_key, EdgeProjection)
        and edge_key is edge_value
        and edge_scale is None
        and not eps
        and k.shape[1] == heads
        and q.shape[2] == v.shape[2]
        and factor_edge_projection(edge_key.features.shape[0], heads, q.shape[2], edge_key.features.shape[1])
    )
    if not factored:
        key = edge_key.materialize(heads) if isinstance(edge_key, EdgeProjection) else edge_key
        # one projection as both terms: one tensor, which the backends read (and differentiate) once
        value = key if edge_value is edge_key else edge_value
        value = value.materialize(heads) if isinstance(value, EdgeProjection) else value
        return ProjectedCall(q, k, v, key, value, scale)
    assert isinstance(edge_key, EdgeProjection)
    a, c = edge_key.features, q.shape[2]
    f = a.shape[1]
    w = edge_key.weight.view(heads, c, f)  # (H, C, F)
    # W_h^T q_h of every head as one batched product over the heads, (H, N_dst, C) @ (H, C, F): q's
    # (N_dst, H, C) rows read in place (a stride of H * C), nothing multiplied by zeros
    w_q = torch.bmm(q.transpose(0, 1), w).transpose(0, 1)  # (N_dst, H, F)
    q_aug = torch.cat([q, w_q], dim=2)  # (N_dst, H, C + F)
    k_aug, v_aug = F.pad(k, (0, f)), F.pad(v, (0, f))  # (N_src, H, C + F): zeros after, not projected
    row = a.new_zeros(a.shape[0], 1, c + f)  # (E, 1, C + F): [0, a_e]
    row[:, 0, c:] = a
    scale = c**-0.5 if scale is None else scale  # of the query's own width, not C + F
    return ProjectedCall(q_aug, k_aug, v_aug, row, row, scale, w)


def finish(call: ProjectedCall, result: Any) -> Any:
    """edge_attention's result of the planned call as the caller's: out (N_dst, H, C), with the
    weights where they were asked for."""
    if call.w is None:
        return result
    out_aug = result[0] if isinstance(result, tuple) else result
    c = call.w.shape[1]
    out = torch.einsum("nhf,hcf->nhc", out_aug[..., c:], call.w).add_(out_aug[..., :c])  # (N_dst, H, C)
    return (out, result[1]) if isinstance(result, tuple) else out


__all__ = ["EdgeProjection", "ProjectedCall", "plan_projections", "finish", "check_projection", "shape_view"]
