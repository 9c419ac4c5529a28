"""`PerformerAttention`: GraphGPS's linear global attention, "performer" (Choromanski et al. 2021,
"Rethinking Attention with Performers": positive random features with a ReLU kernel), as PyG's
`torch_geometric.nn.attention.PerformerAttention` computes it, for `GPSConv(attn_type="performer")`.

Per graph and head, with phi(t) = kernel(P t) + 1e-3 for P (m, D) stacked orthonormal random rows
(m = int(D ln D)):

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / phi(q_i)^T (sum_j phi(k_j))

over the graph's L slots of PyG's `to_dense_batch` padding, L the batch's largest graph: a padded
slot's value is zero, but its key (the key projection of a zero row) still adds phi(k) to the
normalizer, so a graph's output depends on the largest graph of its batch. The layer computes that
formula as PyG does, on the padded batch (linear in L; there is no quadratic score matrix to avoid),
so state dicts and results carry over both ways.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor, nn

from .._tracing import tracing
from ..graphs.structure import sorted_id_counts
from ._common import NotScriptable

# Added to every random feature, as PyG's generalized kernel does, so that no normalizer is zero.
FEATURE_EPSILON = 1e-3


def orthogonal_rows(num_rows: int, num_cols: int) -> Tensor:
    """(num_rows, num_cols) float32 random rows, orthonormal within each block of num_cols: each
    block the transposed Q of a standard Gaussian square matrix's QR, drawn in order (on the CPU,
    from torch's global generator), the last one cut to the rows left."""
    blocks = []
    for _ in range(-(-num_rows // num_cols)):
        q, _ = torch.linalg.qr(torch.randn(num_cols, num_cols), mode="reduced")
        blocks.append(q.t())
    return torch.cat(blocks)[:num_rows]


class RandomFeatures(nn.Module):
    """phi(t) = kernel(t @ projection_matrix^T) + FEATURE_EPSILON: (..., D) -> (..., m), with
    `projection_matrix` (m, D) a buffer of m = int(D ln D) `orthogonal_rows` (PyG's
    `PerformerProjection`'s state)."""

    projection_matrix: Tensor
    kernel: Callable[[Tensor], Tensor]

    def __init__(self, num_cols: int, kernel: Callable[[Tensor], Tensor]) -> None:
        """num_cols: D, the head width; kernel: the elementwise map (a ReLU in GraphGPS)."""
        super().__init__()
        self.num_rows = int(num_cols * math.log(num_cols))
        self.num_cols = num_cols
        self.register_buffer("projection_matrix", orthogonal_rows(self.num_rows, num_cols))
        self.kernel = kernel

    def forward(self, t: Tensor) -> Tensor:
        """t (..., D) -> phi(t) (..., m)."""
        return self.kernel(t @ self.projection_matrix.t()) + FEATURE_EPSILON

    @torch.no_grad()
    def redraw(self) -> None:
        """New random rows, in place (on the buffer's device and dtype)."""
        self.projection_matrix.copy_(orthogonal_rows(self.num_rows, self.num_cols))


class PerformerAttention(NotScriptable, nn.Module):
    """Linear "performer" attention within each graph of a batch (the module docstring), with PyG's
    `PerformerAttention` constructor, submodules (fast_attn, q, k, v, attn_out, dropout), init order
    and state-dict keys (`fast_attn.projection_matrix`, `q.weight`, ...): `GPSConv`'s `attn` for
    `attn_type="performer"`. PyG's own `GPSConv` calls only its own class, so this module is not a
    drop-in there: use `sparseattn.nn.GPSConv`.

    Args:
        channels: C, the width of x and of the output; divisible by heads.
        heads: H.
        head_channels: D, each head's width (PyG's default 64, whatever C is); None: C // H.
        kernel: the random features' elementwise map (default ReLU).
        qkv_bias: biases in the q, k, v projections.
        attn_out_bias: a bias in the output projection.
        dropout: dropout on the output (not on weights: there are none).

    The (N, C) call reads the batch's graph sizes back to the host (the padded layout's shape), as
    PyG's `to_dense_batch` does: a step with it cannot be captured in a CUDA graph, unlike
    attn_type="multihead".

    Shapes:
        `attn(x, batch)`: x (N, C), batch (N,) sorted graph ids (None: one graph) -> (N, C).
        `attn(x, mask=mask)`, PyG's call: x (B, L, C) padded, mask (B, L) bool, True at real rows
        (None: all real) -> (B, L, C).
    """

    kernel: Callable[[Tensor], Tensor]

    def __init__(
        self,
        channels: int,
        heads: int,
        head_channels: Optional[int] = 64,
        kernel: Callable[[Tensor], Tensor] = nn.ReLU(),
        qkv_bias: bool = False,
        attn_out_bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        super().__init__()
        if heads <= 0 or channels <= 0 or channels % heads != 0:
            raise ValueError(f"channels must be divisible by heads, got channels={channels}, heads={heads}")
        head_channels = channels // heads if head_channels is None else head_channels
        if head_channels < 2:
            raise ValueError(f"head_channels must be at least 2 (m = int(D ln D) random features), got {head_channels}")
        self.heads = heads
        self.head_channels = head_channels
        self.kernel = kernel
        self.fast_attn = RandomFeatures(head_channels, kernel)
        inner = heads * head_channels
        self.q = nn.Linear(channels, inner, bias=qkv_bias)
        self.k = nn.Linear(channels, inner, bias=qkv_bias)
        self.v = nn.Linear(channels, inner, bias=qkv_bias)
        self.attn_out = nn.Linear(inner, channels, bias=attn_out_bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None, *, mask: Optional[Tensor] = None) -> Tensor:
        """x (N, C) with batch (N,) -> (N, C); or PyG's call, x (B, L, C) with mask (B, L) -> (B, L, C)."""
        if x.dim() == 3:
            if batch is not None:
                raise ValueError("a padded x (B, L, C) takes mask=, not batch (batch goes with x (N, C))")
            if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2])):
                shape = tuple(x.shape[:2])
                raise ValueError(f"mask must be a bool tensor {shape}, got {mask.dtype} {tuple(mask.shape)}")
            return self._padded(x, mask)
        if x.dim() != 2 or mask is not None:
            raise ValueError(
                f"x must be (N, C) with batch (N,), or (B, L, C) with mask (B, L), got {tuple(x.shape)}"
                + (" with mask" if mask is not None else "")
            )
        # traced, the slots come from host reads: one call run eagerly (a clean break) instead of a trace
        # broken at each read
        slots = torch.compiler.disable(_slots) if tracing() else _slots
        slot, num_graphs, length = slots(batch, x.shape[0]) if batch is not None else (None, 1, x.shape[0])
        if slot is None or x.shape[0] == 0:  # one graph, or none: no padding
            return self._padded(x.unsqueeze(0), None).squeeze(0)
        dense = x.new_zeros(num_graphs * length, x.shape[1]).index_copy_(0, slot, x)
        real = torch.zeros(num_graphs * length, dtype=torch.bool, device=x.device).index_fill_(0, slot, True)
        out = self._padded(dense.view(num_graphs, length, -1), real.view(num_graphs, length))
        return out.reshape(num_graphs * length, -1).index_select(0, slot)

    def _padded(self, x: Tensor, mask: Optional[Tensor]) -> Tensor:
        """The module docstring's formula over x (B, L, C), padding slots False in mask (B, L)."""
        b, length = x.shape[0], x.shape[1]

        def heads(t: Tensor) -> Tensor:  # (B, L, H * D) -> (B, H, L, D)
            return t.view(b, length, self.heads, self.head_channels).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if mask is not None:
            v = v.masked_fill(~mask[:, None, :, None], 0.0)  # a padded slot's value; its key still counts
        phi_q, phi_k = self.fast_attn(q), self.fast_attn(k)  # (B, H, L, m)
        context = phi_k.transpose(-2, -1) @ v  # (B, H, m, D)
        normalizer = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (B, H, L, 1)
        out = (phi_q @ context) / normalizer  # (B, H, L, D)
        out = out.transpose(1, 2).reshape(b, length, self.heads * self.head_channels)
        return self.dropout(self.attn_out(out))

    @torch.no_grad()
    def redraw_projection_matrix(self) -> None:
        """Draw new random features (the paper redraws them every so many steps)."""
        self.fast_attn.redraw()

    def reset_parameters(self) -> None:
        """nn.Linear's init of q, k, v and attn_out, and new random features (PyG's `_reset_parameters`)."""
        for lin in (self.q, self.k, self.v, self.attn_out):
            lin.reset_parameters()
        self.redraw_projection_matrix()

    _reset_parameters = reset_parameters  # PyG's GPSConv calls this name

    def __repr__(self) -> str:
        """PyG's repr."""
        return f"{type(self).__name__}(heads={self.heads}, head_channels={self.head_channels} kernel={self.kernel})"


def _slots(batch: Tensor, n: int) -> Tuple[Tensor, int, int]:
    """Each node's slot (N,) in to_dense_batch's (B * L) layout, B = batch.max() + 1 graphs (an id
    without nodes: a row of padding) and L = the largest graph's node count; ValueError unless batch
    is a sorted (N,) integer tensor."""
    if batch.dim() != 1 or batch.shape[0] != n or batch.dtype not in (torch.int32, torch.int64):
        got = f"{batch.dtype} {tuple(batch.shape)}"
        raise ValueError(f"batch must be an integer tensor ({n},) of sorted graph ids, got {got}")
    if n == 0:
        return batch.new_zeros(0, dtype=torch.long), 0, 0
    counts = sorted_id_counts(batch)
    if counts is None:
        raise ValueError("batch must hold sorted, non-negative graph ids (each graph's nodes together, as PyG's)")
    starts = counts.cumsum(0) - counts
    length = int(counts.max())
    slot = torch.arange(n, device=batch.device) - starts[batch] + batch.long() * length
    return slot, counts.shape[0], length


__all__ = ["PerformerAttention", "RandomFeatures", "orthogonal_rows", "FEATURE_EPSILON"]
