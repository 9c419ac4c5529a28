"""A `Graph` argument of an exported program: the run-time check of its node counts.

An exported program takes a Graph as its index, CSR and CSC beside the node tensors (`Graph`'s
pytree registration, `Graph.dynamic_shapes()`). `ep.module()` checks their lengths agree before it
runs (export's guards); an AOTInductor package reads each size from one input and checks nothing,
so a graph over other nodes than x's rows reached its first kernel ("allocated size does not match
required size"). In an export trace the row pointers therefore reach the program's ops through
`sparseattn::checked_row_pointers`, which compares them with the tensors' rows when the program
runs and raises eager code's ValueError.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .._checks import node_count_message
from .graph import Graph
from .structure import CSR


@torch.library.custom_op("sparseattn::checked_row_pointers", mutates_args=())
def checked_row_pointers(ptr: Tensor, src_ptr: Tensor, num_src: int, num_dst: int) -> Tuple[Tensor, Tensor]:
    """Copies of a Graph's row pointers, ptr (N_dst + 1,) and src_ptr (N_src + 1,), once their
    lengths are checked against the tensors' node counts (num_dst: q's rows, num_src: k's); else
    the ValueError eager code raises. Copies, as an op's output may not alias its input."""
    for name, p, n in (("num_src", src_ptr, num_src), ("num_dst", ptr, num_dst)):
        if p.shape[0] != n + 1:
            raise ValueError(node_count_message(name, p.shape[0] - 1, n, num_src, num_dst))
    return ptr.clone(), src_ptr.clone()


@checked_row_pointers.register_fake
def _(ptr, src_ptr, num_src, num_dst):
    return ptr.new_empty(num_dst + 1), src_ptr.new_empty(num_src + 1)


def check_node_counts(graph: Graph, num_src: int, num_dst: int) -> None:
    """Inside an export trace, route the row pointers of a Graph the program takes as input through
    `checked_row_pointers`, once: the graph then holds the checked copies, which every later use
    reads, so the check runs before any kernel that reads them. Anywhere else nothing."""
    if not (graph._unchecked_input and torch.compiler.is_exporting()):
        return
    csr, csc = graph.csr(), graph.csc()
    ptr, src_ptr = checked_row_pointers(csr.ptr, csc.ptr, num_src, num_dst)
    graph._csr, graph._csc = CSR(ptr, csr.idx, csr.perm), CSR(src_ptr, csc.idx, csc.perm)
    graph._unchecked_input = False


__all__ = ["checked_row_pointers", "check_node_counts"]
