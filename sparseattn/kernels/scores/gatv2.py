"""GATv2's additive score (Brody et al. 2022), per edge e = (j -> i) and head h:

    s_e     = x_l[j] + x_r[i] (+ W_e edge_attr_e)        (H, C)
    score_e = sum_c att[h, c] * LeakyReLU(s_e[h, c])       (H,)

`gatv2_scores_reference` is the definition (plain torch, autograd: (E, H, C) tensors). `gatv2_scores`
computes the same in edge chunks whose temporaries stay in cache, with a hand-written backward that
recomputes each chunk's s: nothing of shape (E, H, C) exists at once or is saved (it saves x_l, x_r,
edge_attr, the weights and the index). Its backward, per chunk, with g = d loss / d score (n, H):

    g_s       = g[..., None] * att * where(s > 0, 1, negative_slope)          (n, H, C)
    d x_l    += index_add at the sources of g_s;  d x_r += the same at the destinations
    d att    += sum_e g_e[h] LeakyReLU(s_e)[h, c];  d W_e^T += edge_attr^T g_s;  d edge_attr = g_s W_e

Forward gathers and adds each edge's two rows with one embedding_bag over x_l and x_r concatenated (a
transient (N_src + N_dst, H * C) copy; ~2x faster than two index_selects and an add on CPU); backward
gathers into its two chunk buffers instead, so no such copy sits beside the gradients. Under
create_graph=True the backward runs through the reference instead, so second derivatives exist.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ...graphs import Graph

# Values (edge x head x channel) per chunk buffer. CPU: the op's fwd+bwd, 1 thread, 20K nodes x 17 in-edges,
# H x C = 8 x 64, edge_dim 16, float32 (2 shared cores): 2^14 values 3,231 ms, 2^16 1,589, 2^18 1,161,
# 2^20 1,134, 2^21 1,322, 2^22 1,457 (4 MiB buffers at 2^20 stay in cache; smaller chunks pay per-op
# overhead). A GPU chunk costs launches, so it takes 2^27 values (the old checkpointed path's best on an H100).
CHUNK_VALUES = {"cpu": 1 << 20, "cuda": 1 << 27}
# Scores of at most this many (edge, head, channel) values take the plain reference (`gatv2_edge_scores`):
# 32 molecules (~550 edges), GATv2Conv(64, 16, heads=4, edge_dim=16) fwd+bwd 2.0 ms against 2.35 via the
# chunked op.
UNCHUNKED_VALUES = 1 << 18


def default_chunk(heads: int, channels: int, device: torch.device) -> int:
    """Edges per chunk: CHUNK_VALUES of the device type (CPU's for any other) over H * C values per edge."""
    return max(1, CHUNK_VALUES.get(device.type, CHUNK_VALUES["cpu"]) // max(1, heads * channels))


def gatv2_scores_reference(
    x_l: Tensor,
    x_r: Tensor,
    edge_index: Tensor,
    att: Tensor,
    negative_slope: float = 0.2,
    edge_attr: Optional[Tensor] = None,
    edge_weight: Optional[Tensor] = None,
) -> Tensor:
    """GATv2 scores (E, H) as the module docstring's formula, through (E, H, C) tensors. Shapes:
    x_l (N_src, H, C), x_r (N_dst, H, C), edge_index (2, E) int64 (row 0 source, row 1 destination),
    att (H, C), edge_attr (E, F) and edge_weight (H * C, F) (an nn.Linear's weight), both or neither."""
    s = x_l.index_select(0, edge_index[0]) + x_r.index_select(0, edge_index[1])  # (E, H, C)
    if edge_attr is not None and edge_weight is not None:
        s = s + F.linear(edge_attr, edge_weight).view_as(s)
    return (F.leaky_relu(s, negative_slope) * att).sum(-1)


def gatv2_scores(
    x_l: Tensor,
    x_r: Tensor,
    edge_index: Tensor,
    att: Tensor,
    negative_slope: float = 0.2,
    edge_attr: Optional[Tensor] = None,
    edge_weight: Optional[Tensor] = None,
    *,
    chunk: Optional[int] = None,
) -> Tensor:
    """`gatv2_scores_reference` in chunks of `chunk` edges (None: `default_chunk`), O(E * H + chunk * H * C)
    memory beyond the inputs. Shapes as the reference's; x_r may be x_l itself (GATv2's shared weights
    on one node set), then read once. Gradients for every input; a second derivative via the reference."""
    if x_l.dim() != 3 or x_r.dim() != 3 or x_l.shape[1:] != x_r.shape[1:]:
        raise ValueError(f"x_l and x_r must be (N, H, C) with equal H, C, got {tuple(x_l.shape)}, {tuple(x_r.shape)}")
    if att.shape != x_l.shape[1:]:
        raise ValueError(f"att must be (H, C) = {tuple(x_l.shape[1:])}, got {tuple(att.shape)}")
    if (edge_attr is None) != (edge_weight is None):
        raise ValueError("edge_attr and edge_weight go together: pass both or neither")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must be (2, E), got {tuple(edge_index.shape)}")
    heads, channels = x_l.shape[1], x_l.shape[2]
    if chunk is None:
        chunk = default_chunk(heads, channels, x_l.device)
    elif chunk <= 0:
        raise ValueError(f"chunk must be a positive number of edges, got {chunk}")
    shared = x_r is x_l
    x_l = x_l.contiguous()
    return _GATv2Scores.apply(
        x_l,
        None if shared else x_r.contiguous(),
        edge_index,
        att,
        edge_attr,
        edge_weight,
        float(negative_slope),
        int(chunk),
    )


def _table(x_l: Tensor, x_r: Optional[Tensor]) -> Tensor:
    """The rows both gathers read, (N_src [+ N_dst], H * C): x_l's, then x_r's unless shared."""
    rows = x_l.reshape(x_l.shape[0], -1)
    return rows if x_r is None else torch.cat([rows, x_r.reshape(x_r.shape[0], -1)])


def _pre_activation(
    table: Tensor, pairs: Tensor, offsets: Tensor, edge_attr: Optional[Tensor], weight_t: Optional[Tensor]
) -> Tensor:
    """s (n, H * C) of one chunk in forward: each edge's two table rows summed by one embedding_bag, plus
    the edge projection. pairs (2n,) holds each edge's (source row, destination row), offsets (n,) = 0, 2, 4, ..."""
    s = F.embedding_bag(pairs, table, offsets, mode="sum")
    if edge_attr is not None and weight_t is not None:
        s.addmm_(edge_attr, weight_t)
    return s


class _GATv2Scores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_l, x_r, edge_index, att, edge_attr, edge_weight, slope, chunk):
        num_edges, heads, channels = edge_index.shape[1], x_l.shape[1], x_l.shape[2]
        ctx.save_for_backward(x_l, x_r, edge_index, att, edge_attr, edge_weight)
        ctx.slope, ctx.chunk = slope, chunk
        scores = x_l.new_empty(num_edges, heads)
        table = _table(x_l, x_r)
        pairs = _pairs(edge_index, 0 if x_r is None else x_l.shape[0])
        offsets = torch.arange(0, 2 * min(chunk, num_edges), 2, device=x_l.device)
        weight_t = None if edge_weight is None else edge_weight.t()
        att_flat = att.reshape(-1)
        for start in range(0, num_edges, chunk):
            n = min(chunk, num_edges - start)
            ea = None if edge_attr is None else edge_attr[start : start + n]
            s = _pre_activation(table, pairs[2 * start : 2 * (start + n)], offsets[:n], ea, weight_t)
            F.leaky_relu(s, slope, inplace=True).mul_(att_flat)
            torch.sum(s.view(n, heads, channels), -1, out=scores[start : start + n])
        return scores

    @staticmethod
    def backward(ctx, grad):
        x_l, x_r, edge_index, att, edge_attr, edge_weight = ctx.saved_tensors
        slope, chunk = ctx.slope, ctx.chunk
        if torch.is_grad_enabled():  # create_graph=True: differentiable gradients from the reference
            return _reference_grads(ctx, grad)
        need_l, need_r, _, need_att, need_ea, need_w = ctx.needs_input_grad[:6]
        num_edges, heads, channels = edge_index.shape[1], x_l.shape[1], x_l.shape[2]
        num_src = x_l.shape[0]
        rows_l = x_l.view(num_src, -1)
        rows_r = rows_l if x_r is None else x_r.view(x_r.shape[0], -1)
        weight_t = None if edge_weight is None else edge_weight.t()
        grad = grad.contiguous()
        grad_l = x_l.new_zeros(x_l.shape) if need_l else None
        if x_r is None:
            grad_r = grad_l  # shared x_l: both gathers' gradients go to it
        else:
            grad_r = x_r.new_zeros(x_r.shape) if need_r else None
        grad_att = torch.zeros_like(att) if need_att else None
        grad_wt = torch.zeros_like(weight_t) if need_w and weight_t is not None else None
        grad_ea = torch.empty_like(edge_attr) if need_ea and edge_attr is not None else None
        s_buf = x_l.new_empty(min(chunk, num_edges), heads * channels)
        g_s = x_l.new_empty(min(chunk, num_edges), heads, channels)
        for start in range(0, num_edges, chunk):
            n, end = min(chunk, num_edges - start), min(start + chunk, num_edges)
            ea = None if edge_attr is None else edge_attr[start:end]
            # s recomputed by two gathers into the chunk buffers (no (N_src + N_dst) table beside the gradients)
            s = torch.index_select(rows_l, 0, edge_index[0, start:end], out=s_buf[:n])
            s.add_(torch.index_select(rows_r, 0, edge_index[1, start:end], out=g_s[:n].view(n, -1)))
            if ea is not None and weight_t is not None:
                s.addmm_(ea, weight_t)
            g = grad[start:end]  # (n, H)
            gs = g_s[:n]
            torch.mul(g.unsqueeze(-1), att, out=gs)
            # (n, H, C): g * att * where(s > 0, 1, slope), in place
            torch.ops.aten.leaky_relu_backward.grad_input(gs, s.view_as(gs), slope, False, grad_input=gs)
            gs2 = gs.view(n, -1)
            if grad_wt is not None and ea is not None:
                grad_wt.addmm_(ea.t(), gs2)
            if grad_ea is not None:
                torch.mm(gs2, edge_weight, out=grad_ea[start:end])
            if grad_att is not None:
                lrelu = F.leaky_relu(s, slope, inplace=True).view(n, heads, channels)
                # per head: (1, n) @ (n, C)
                grad_att.unsqueeze(1).baddbmm_(g.t().unsqueeze(1), lrelu.transpose(0, 1))
            if grad_l is not None:
                grad_l.view(num_src, -1).index_add_(0, edge_index[0, start:end], gs2)
            if grad_r is not None:
                grad_r.view(grad_r.shape[0], -1).index_add_(0, edge_index[1, start:end], gs2)
        if x_r is None:
            grad_r = None
        grad_w = None if grad_wt is None else grad_wt.t()
        return grad_l, grad_r, None, grad_att, grad_ea, grad_w, None, None


def _pairs(edge_index: Tensor, dst_offset: int) -> Tensor:
    """(2E,) the table rows of each edge, source then destination (+ dst_offset): embedding_bag's bags."""
    return torch.stack([edge_index[0], edge_index[1] + dst_offset], dim=1).reshape(-1).long()


def _reference_grads(ctx, grad: Tensor) -> tuple:
    """The gradients `_GATv2Scores.backward` returns, differentiable (create_graph=True), through
    `gatv2_scores_reference`."""
    x_l, x_r, edge_index, att, edge_attr, edge_weight = ctx.saved_tensors
    inputs = (x_l, x_r, None, att, edge_attr, edge_weight)
    needs = [need and t is not None for need, t in zip(ctx.needs_input_grad[:6], inputs)]
    scores = gatv2_scores_reference(
        x_l, x_l if x_r is None else x_r, edge_index, att, ctx.slope, edge_attr, edge_weight
    )
    wanted = [t for t, need in zip(inputs, needs) if need]
    grads = iter(torch.autograd.grad(scores, wanted, grad, create_graph=True, allow_unused=True))
    out = [next(grads) if need else None for need in needs]
    return (*out, None, None)


def gatv2_edge_scores(
    x_l: Tensor,
    x_r: Tensor,
    graph: Union[Tensor, Graph],
    edge_index: Tensor,
    att: Tensor,
    negative_slope: float = 0.2,
    edge_attr: Optional[Tensor] = None,
    edge_weight: Optional[Tensor] = None,
    *,
    chunk: Optional[int] = None,
) -> Tensor:
    """GATv2 scores (E, H) of edge_index's edges in their order, by the path that pays: with chunk None
    and at most UNCHUNKED_VALUES (E * H * C) values the plain reference (a batch of molecules: no op
    overhead to amortize); otherwise `gatv2_scores` in chunks, over the edges in destination order when
    graph is a `Graph` whose edges are not (its CSR, which the attention call builds anyway): the
    gathers of x_r and the index_add of its gradient then walk rows in order (measured 1 thread, 20K
    nodes x 17 in-edges, H x C = 8 x 64: the op's fwd+bwd 1160 -> 972 ms). Shapes as `gatv2_scores`;
    graph: the Graph (or (2, E) tensor) the attention runs on, whose edges edge_index lists."""
    h, c = x_l.shape[1], x_l.shape[2]
    if chunk is None and edge_index.shape[1] * h * c <= UNCHUNKED_VALUES:
        return gatv2_scores_reference(x_l, x_r, edge_index, att, negative_slope, edge_attr, edge_weight)
    if not isinstance(graph, Graph) or graph.is_sorted_by_dst:
        return gatv2_scores(x_l, x_r, edge_index, att, negative_slope, edge_attr, edge_weight, chunk=chunk)

    def order() -> Tuple[Tensor, Tensor]:
        perm = graph.csr().perm
        return edge_index.index_select(1, perm), perm

    sorted_index, perm = graph.cached("gatv2_destination_order", order)
    ea = None if edge_attr is None else edge_attr.index_select(0, perm)
    scores = gatv2_scores(x_l, x_r, sorted_index, att, negative_slope, ea, edge_weight, chunk=chunk)
    return scores.new_empty(scores.shape).index_copy(0, perm, scores)  # (E, H) back in the caller's order
