"""Per-edge terms given as a projection of edge features (`EdgeProjection`), and the form a call
with one takes, decided here (`kernels.auto.factor_edge_projection`), not by the layer that passes it.

An `EdgeProjection(features, weight)` stands for the term W_h a_e of each edge e and head h, with a_e
the edge's F features and W_h the (C, F) block of head h in weight (H * C, F) (a bias b_h is one
more feature, 1 on every edge, and one more column of W_h): TransformerConv's
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

from typing import Any, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_qkv
from .auto import factor_edge_projection


class EdgeProjection(NamedTuple):
    """A per-edge term given by its factors: term[e, h] = weight[h * C:(h + 1) * C] @ features[e]
    (+ bias[h * C:(h + 1) * C]), i.e. `F.linear(features, weight, bias).view(E, H, C)`, left to the
    kernels to compute or to factor.

    features: (E, F) per-edge features in the graph's edge order (a PyG layer's edge_attr);
    weight: (H * C, F), heads major (an `nn.Linear(F, H * C)`'s weight); bias: (H * C,) or None (its
    bias); C is q's head dim D for edge_key and v's Dv for edge_value. All differentiable."""

    features: Tensor
    weight: Tensor
    bias: Optional[Tensor] = None

    def materialize(self, heads: int) -> Tensor:
        """The term itself, (E, heads, C)."""
        term = F.linear(self.features, self.weight, self.bias)
        return term.view(self.features.shape[0], heads, self.weight.shape[0] // heads)

    def without_bias(self) -> "EdgeProjection":
        """The same term with the bias as one more feature, 1 on every edge (weight (H * C, F + 1))."""
        if self.bias is None:
            return self
        ones = self.features.new_ones(self.features.shape[0], 1)
        features = torch.cat([self.features, ones], dim=1)
        return EdgeProjection(features, torch.cat([self.weight, self.bias.unsqueeze(1)], dim=1))


class QueryProjection(NamedTuple):
    """The queries given by their factors: q = `F.linear(inputs, weight, bias).view(N_dst, H, D)`, D
    being k's head dim and H = weight.shape[0] // D. Where a call attends through the factored form
    of an `EdgeProjection` (the module docstring), the augmented queries [q, W_h^T q] come from the
    inputs in one product with lin's weights composed with the W_h (H * (C + F), in), as q alone
    would; otherwise q is computed and the call runs as with it.

    inputs: (N_dst, in); weight: (H * D, in), heads major (an `nn.Linear(in, H * D)`'s weight);
    bias: (H * D,) or None. All differentiable."""

    inputs: Tensor
    weight: Tensor
    bias: Optional[Tensor] = None

    def materialize(self, head_dim: int) -> Tensor:
        """q itself, (N_dst, H, head_dim)."""
        heads = self.weight.shape[0] // head_dim
        return F.linear(self.inputs, self.weight, self.bias).view(self.inputs.shape[0], heads, head_dim)


def _check_matrices(name: str, parts: Any) -> None:
    """Each (part, tensor) of parts a 2-D floating-point tensor; TypeError naming `name.part`."""
    for part, t in parts:
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 2:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{name}.{part} must be a 2-D floating-point tensor, got {got}")


def _check_bias(name: str, bias: Optional[Tensor], rows: int, rows_name: str) -> None:
    """bias None or of shape (rows,); ValueError naming `name.bias` and the shape (rows_name,)."""
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (rows,)):
        got = str(tuple(bias.shape)) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"{name}.bias must have shape ({rows_name},) = ({rows},) or be None, got {got}")


def query_heads(q: QueryProjection, k: Any) -> Tuple[int, int]:
    """(H, D) of a QueryProjection q: D is k's head dim, H = q.weight.shape[0] // D; q checked (inputs
    (N_dst, in), weight (H * D, in), bias (H * D,) or None, floating point), errors naming q.inputs,
    q.weight, q.bias, or k when it gives no D."""
    if not isinstance(k, Tensor) or k.dim() != 3:
        raise TypeError("k must be a (N_src, H_kv, D) tensor: a QueryProjection q takes its head dim D from k")
    d = k.shape[2]
    _check_matrices("q", (("inputs", q.inputs), ("weight", q.weight)))
    rows, width = q.weight.shape
    if width != q.inputs.shape[1] or rows == 0 or rows % d:
        raise ValueError(
            f"q.weight must have shape (H * D, in) with D={d} (k's head dim) and in={q.inputs.shape[1]} "
            f"(q.inputs' width), got {tuple(q.weight.shape)}"
        )
    _check_bias("q", q.bias, rows, "H * D")
    return rows // d, d


def query_shape_view(q: Any, k: Any) -> Any:
    """A QueryProjection as a zero-copy (N_dst, H, D) stand-in of q (its dtype and device), checked
    first (`query_heads`), for checks that read only those; anything else as it is."""
    if not isinstance(q, QueryProjection):
        return q
    heads, d = query_heads(q, k)
    return q.inputs[:, :1].unsqueeze(2).expand(q.inputs.shape[0], heads, d)


def check_projection(p: EdgeProjection, name: str, heads: int, width: int, width_name: str) -> None:
    """features (E, F), weight (heads * width, F) and bias (heads * width,) or None, floating point;
    ValueError or TypeError naming `name` (edge_key or edge_value)."""
    _check_matrices(name, (("features", p.features), ("weight", p.weight)))
    if p.weight.shape != (heads * width, p.features.shape[1]):
        raise ValueError(
            f"{name}.weight must have shape (H * {width_name}, F) = {(heads * width, p.features.shape[1])} "
            f"(H={heads} heads of {width_name}={width}, F={p.features.shape[1]} features per edge), got "
            f"{tuple(p.weight.shape)}"
        )
    _check_bias(name, p.bias, heads * width, f"H * {width_name}")


def check_projections(edge_key: Any, edge_value: Any, heads: int, d: int, dv: Optional[int]) -> None:
    """`check_projection` of edge_key (width d, q's) and edge_value (width dv, v's; None: not known,
    left to the call) where they are EdgeProjections."""
    for name, term, width, width_name in (("edge_key", edge_key, d, "D"), ("edge_value", edge_value, dv, "Dv")):
        if isinstance(term, EdgeProjection) and width is not None:
            check_projection(term, name, heads, width, width_name)


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
    q: Union[Tensor, QueryProjection],
    k: Tensor,
    v: Tensor,
    edge_key: Union[Tensor, EdgeProjection, None],
    edge_value: Union[Tensor, EdgeProjection, None],
    edge_scale: Optional[Tensor],
    eps: float,
    scale: Optional[float],
) -> ProjectedCall:
    """How `edge_attention` computes a call whose q is a `QueryProjection` or whose edge_key and/or
    edge_value is an `EdgeProjection`: factored (the module docstring) where one projection is both
    terms, no edge_scale or eps, k and v have q's heads and `auto.factor_edge_projection` says so
    (the augmented queries from a QueryProjection's inputs, else from q); otherwise with everything
    built. The projections are checked first (errors name q, edge_key or edge_value)."""
    query = q  # a tensor, or the QueryProjection the augmented queries may come from
    if isinstance(query, QueryProjection):  # checked here; k and v by the call this plans
        heads, d = query_heads(query, k)
    else:
        check_qkv(query, k, v)
        heads, d = query.shape[1], query.shape[2]
    dv = v.shape[2] if isinstance(v, Tensor) and v.dim() == 3 else None
    check_projections(edge_key, edge_value, heads, d, dv)
    factored = (
        isinstance(edge_key, EdgeProjection)
        and edge_key is edge_value
        and edge_scale is None
        and not eps
        and k.shape[1] == heads
        and d == dv
        and factor_edge_projection(
            edge_key.features.shape[0], heads, d, edge_key.features.shape[1] + (edge_key.bias is not None)
        )
    )
    if not factored:
        q = query.materialize(d) if isinstance(query, QueryProjection) else query
        key = edge_key.materialize(heads) if isinstance(edge_key, EdgeProjection) else edge_key
        # one projection as both terms: one tensor, which the backends read (and differentiate) once
        value = key if edge_value is edge_key else edge_value
        value = value.materialize(heads) if isinstance(value, EdgeProjection) else value
        return ProjectedCall(q, k, v, key, value, scale)
    assert isinstance(edge_key, EdgeProjection)
    projection = edge_key.without_bias()  # a bias is one more feature, 1 on every edge
    a, c = projection.features, d
    f = a.shape[1]
    w = projection.weight.view(heads, c, f)  # (H, C, F)
    if isinstance(query, QueryProjection):
        # [q_h, W_h^T q_h] straight from the inputs: lin's rows composed with the W_h, one product
        wq = query.weight.view(heads, c, -1)  # (H, C, in)
        weight_aug = torch.cat([wq, torch.einsum("hcf,hci->hfi", w, wq)], dim=1).reshape(heads * (c + f), -1)
        bias_aug = None
        if query.bias is not None:
            b = query.bias.view(heads, c)
            bias_aug = torch.cat([b, torch.einsum("hcf,hc->hf", w, b)], dim=1).reshape(-1)
        q_aug = F.linear(query.inputs, weight_aug, bias_aug).view(-1, heads, c + f)  # (N_dst, H, C + F)
    else:
        # W_h^T q_h of every head as one batched product over the heads, (H, N_dst, C) @ (H, C, F): q's
        # (N_dst, H, C) rows read in place (a stride of H * C), nothing multiplied by zeros
        w_q = torch.bmm(query.transpose(0, 1), w).transpose(0, 1)  # (N_dst, H, F)
        q_aug = torch.cat([query, w_q], dim=2)  # (N_dst, H, C + F)
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


__all__ = [
    "EdgeProjection",
    "QueryProjection",
    "ProjectedCall",
    "plan_projections",
    "finish",
    "check_projection",
    "check_projections",
    "query_heads",
    "query_shape_view",
    "shape_view",
]
