"""A `Graph` argument of an exported program: the run-time check of its node counts.

An exported program takes a Graph as its index, CSR and CSC beside the node tensors (`Graph`'s
pytree registration, `Graph.dynamic_shapes()`). `ep.module()` checks their lengths agree before it
runs (export's guards); an AOTInductor package reads each size from one input and checks nothing,
so a graph over other nodes than x's rows reached its first kernel ("allocated size does not match
required size"). In an export trace the row pointers therefore reach the program's ops through
`sparseattn::checked_row_pointers`, which compares them with the tensors' rows when the program
runs and raises eager code's ValueError.

`ep.module()` itself cannot say it first: export turns the trace's size checks into guards (a
graph's row pointers one longer than x's rows), which the module runs as its graph's first node, and
the op's node counts are then read from the same, guarded, sizes. It raises torch's
`AssertionError: Guard failed: -1 + graph.src_ptr.size()[0] == x_dst.size()[0]` (named after the
forward's arguments). `exported_module(ep)` is `ep.module()` with a check of the Graph arguments
that runs before torch's: the program's input sizes, as traced, against the arguments', raising
eager code's ValueError for a graph over other nodes than the tensors' rows.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree
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


def exported_module(program: Any) -> torch.nn.Module:
    """`program.module()` (a `torch.export.ExportedProgram`, exported or loaded) that checks its
    Graph arguments against the other inputs before torch's guards do: a graph whose node counts
    differ from the tensors' rows, where the program was traced with them equal, raises eager
    code's ValueError ("graph has num_src=45 but x_dst has 40 rows; ...") instead of torch's
    "Guard failed: ..."; a program exported without `Graph.dynamic_shapes()` names it for a graph
    of another size. Everything else is left to torch's checks."""
    module = program.module()
    module.register_forward_pre_hook(_check_graph_arguments, prepend=True, with_kwargs=True)
    return module


NODE_COUNTS = {"ptr": "num_dst", "src_ptr": "num_src"}  # a Graph's row pointers: N + 1 long


def _check_graph_arguments(module: torch.fx.GraphModule, args: tuple, kwargs: dict) -> None:
    """Each input size the program was traced with is an int or `symbol + c`; a symbol that the
    arguments give two values, one of them through a Graph, is a graph over other nodes (or edges)
    than the tensors it was traced with. Raises ValueError for those; returns for anything else."""
    if torch.compiler.is_compiling():
        return
    placeholders = module.graph.find_nodes(op="placeholder")
    leaves = pytree.tree_leaves_with_path((args, kwargs))
    if len(leaves) != len(placeholders):
        return  # torch's check names what differs
    names = list(inspect.signature(module.forward).parameters)
    seen: Dict[Any, Tuple[int, str, bool]] = {}  # symbol -> the value an input implies, that input, a Graph's?
    for (path, leaf), node in zip(leaves, placeholders):
        traced = node.meta.get("val")
        if not (isinstance(leaf, Tensor) and isinstance(traced, Tensor) and leaf.dim() == traced.dim()):
            continue
        graph, field = _graph_field((args, kwargs), path, names)
        for dim, (want, have) in enumerate(zip(traced.shape, leaf.shape)):
            what = _size(graph, field, dim, have) if graph else _size(_name(path, names), None, dim, have)
            offset = 1 if field in NODE_COUNTS else 0
            if isinstance(want, int):
                if graph and field in NODE_COUNTS and want != have:
                    raise ValueError(
                        f"{what} but the exported program takes only {NODE_COUNTS[field]}={want - offset}: export "
                        "it with dynamic_shapes=(..., Graph.dynamic_shapes()) for graphs of any size"
                    )
                continue
            expr = want.node.expr
            symbols = expr.free_symbols
            if len(symbols) != 1 or not (expr - next(iter(symbols))).is_Integer:
                continue
            symbol = next(iter(symbols))
            implied = have - int(expr - symbol)
            if symbol not in seen:
                seen[symbol] = (implied, what, bool(graph))
                continue
            first, first_what, first_graph = seen[symbol]
            if first != implied and (first_graph or graph):
                a, b = (what, first_what) if graph and not first_graph else (first_what, what)
                nodes = field in NODE_COUNTS or "num_" in first_what
                fix = "build the Graph with the tensors' node counts (without num_src= and num_dst= a Graph counts "
                raise ValueError(
                    f"{a} but {b}, which the exported program takes to be equal (they were in the call it was "
                    f"exported from)" + (f"; {fix}nodes up to its largest id)" if nodes else "")
                )


def _name(path: tuple, names: List[str]) -> str:
    """An input's name as torch's guards write it: the forward's argument, then the rest of its path."""
    if isinstance(path[1], pytree.SequenceKey) and path[0] == pytree.SequenceKey(0):
        top = names[path[1].idx] if path[1].idx < len(names) else f"args[{path[1].idx}]"
    else:
        top = str(getattr(path[1], "key", path[1]))
    return top + pytree.keystr(path[2:])


def _graph_field(inputs: tuple, path: tuple, names: List[str]) -> Tuple[Optional[str], Optional[str]]:
    """(the Graph's name, the field) for a tensor of a Graph argument, else (None, None)."""
    last = path[-1]
    if not isinstance(last, pytree.GetAttrKey) or len(path) < 3:
        return None, None
    parent: Any = inputs
    for key in path[:-1]:
        parent = key.get(parent)
    return (_name(path[:-1], names), last.name) if isinstance(parent, Graph) else (None, None)


def _size(name: str, field: Optional[str], dim: int, have: int) -> str:
    if field in NODE_COUNTS:
        return f"{name} has {NODE_COUNTS[field]}={have - 1}"
    if field is not None:
        return f"{name} has {have} edges"
    return f"{name} has {have} rows" if dim == 0 else f"{name}.shape[{dim}] is {have}"


__all__ = ["checked_row_pointers", "check_node_counts", "exported_module"]
