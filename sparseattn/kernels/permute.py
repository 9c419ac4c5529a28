"""Rows of a node tensor in another order, for `KernelOptions(node_order="locality")`: a gather
whose backward is the inverse gather (autograd's index_select backward is a scatter-add into a
fresh zero tensor, several times slower), written into the kernels' reusable CPU buffers
(`memory`; a fresh 100 MB tensor on the machines measured faulted its pages in for 4x the gather's
time)."""

from __future__ import annotations

import torch
from torch import Tensor

from . import memory


class PermuteRows(torch.autograd.Function):
    """x[index] for a permutation index of x's rows, with inverse[index] = arange(N): the backward
    gathers the gradient back by `inverse` (differentiable again, as a PermuteRows itself)."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(index, inverse)
        return memory.take(x, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, inverse = ctx.saved_tensors
        if torch.is_grad_enabled():
            return PermuteRows.apply(grad, inverse, index), None, None
        return memory.take(grad, inverse), None, None


def permute_rows(x: Tensor, index: Tensor, inverse: Tensor) -> Tensor:
    """x's rows in the order `index` (x: (N, ...), index and inverse: (N,) int64 permutations)."""
    return PermuteRows.apply(x, index, inverse)


__all__ = ["permute_rows", "PermuteRows"]
