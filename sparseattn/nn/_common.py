"""Constructor and input checks shared by the `sparseattn.nn` layers."""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_dropout as _check_dropout
from ..graphs import Graph, from_row_pointers
from ..kernels import backend_names
from ..kernels.auto import fuse_projections

SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)


# the child module `explainable` gives a layer: a PyG MessagePassing that PyG's explainers fill with their edge mask
MASK_HOLDER = "explain_masks"


def explained_edge_weight(
    layer: nn.Module, like: Tensor, num_edges: int, num_dst: int, appended_loops: int = 0
) -> Optional[Tensor]:
    """(E',) multipliers of the layer's E' = num_edges edges' normalized weights: the edge mask PyG's
    explainers set on the layer's `MASK_HOLDER` (`sparseattn.nn.explainable`) as PyG's
    `MessagePassing.explain_message` applies it to messages (sigmoid where the explainer asks; the
    masks of removed self loops dropped and ones for the loops the layer adds); None outside an
    explanation. like: a tensor of the layer's call (the mask's dtype and like's promote).
    appended_loops: the layer attends over the explained edges in their places (its own self loops
    kept, scored -inf, as a GAT layer does under a trace), then this many loops of its own, which
    get 1 (PyG's mask for the loops it adds)."""
    holder = layer._modules.get(MASK_HOLDER)
    if holder is None or holder.explain is not True:
        return None
    ones = like.new_ones(num_edges - appended_loops, 1)
    mask = holder.explain_message(ones, num_dst).view(-1)
    return torch.cat([mask, mask.new_ones(appended_loops)]) if appended_loops else mask


def check_backend(backend: str) -> str:
    """A backend name `edge_attention` takes ("auto" or a registered one); ValueError otherwise."""
    if backend not in backend_names():
        raise ValueError(f"unknown backend {backend!r}; valid names are {', '.join(map(repr, backend_names()))}")
    return backend


def check_dropout(p: float, name: str = "dropout") -> float:
    """An attention dropout probability in [0, 1) (the layers name it `dropout`)."""
    return _check_dropout(p, name)


def edge_count(edge_index: Union[Tensor, Graph]) -> Optional[int]:
    """E of a Graph or a (2, E) tensor, the rows edge_attr must have; None for anything else
    (edge_attention then says what is wrong with it)."""
    if isinstance(edge_index, Graph):
        return edge_index.num_edges
    if isinstance(edge_index, Tensor) and edge_index.dim() == 2 and edge_index.shape[0] == 2:
        return edge_index.shape[1]
    return None


def graph_of_adj_t(edge_index: object) -> object:
    """A torch.sparse `adj_t` (PyG's convention: (N_dst, N_src), adj_t[dst, src] nonzero for an edge
    src -> dst; COO coalesced, CSR or CSC) as a `Graph` whose edges follow adj_t's nonzeros in
    storage order (the order of edge_attr's rows, and of PyG's alpha); anything else as it is.
    A torch_sparse.SparseTensor is refused, naming its conversion."""
    if type(edge_index).__name__ == "SparseTensor" and hasattr(edge_index, "to_torch_sparse_csr_tensor"):
        raise TypeError(
            "edge_index as a torch_sparse.SparseTensor is not supported: pass adj_t.to_torch_sparse_csr_tensor(), "
            "a torch.sparse adj_t (N_dst, N_src), or a (2, E) edge_index"
        )
    if not isinstance(edge_index, Tensor) or edge_index.layout == torch.strided:
        return edge_index
    adj = edge_index
    if adj.layout not in SPARSE_LAYOUTS or adj.sparse_dim() != 2:
        raise TypeError(
            f"edge_index as a sparse adj_t must be a 2-D torch.sparse tensor (N_dst, N_src) in COO, CSR or CSC "
            f"layout, got layout {adj.layout} with {adj.sparse_dim()} sparse dims"
        )
    num_dst, num_src = adj.shape[0], adj.shape[1]
    if adj.layout == torch.sparse_csr:
        return from_row_pointers(adj.crow_indices(), adj.col_indices(), num_src)
    if adj.layout == torch.sparse_csc:
        ccol = adj.ccol_indices().long()
        src = torch.arange(num_src, device=adj.device).repeat_interleave(ccol.diff())
        return Graph(torch.stack([src, adj.row_indices().long()]), num_src=num_src, num_dst=num_dst)
    if not adj.is_coalesced():
        raise ValueError(
            "edge_index as a COO adj_t must be coalesced (its edges, and edge_attr's rows, in (destination, source) "
            "order): pass adj_t.coalesce()"
        )
    dst, src = adj.indices()
    return Graph(torch.stack([src, dst]), num_src=num_src, num_dst=num_dst)


def fused_linear(x: Tensor, lins: Sequence[nn.Linear]) -> List[Tensor]:
    """[lin(x) for lin in lins], as one matrix product over their stacked weights where the kernels say
    it pays (`kernels.auto.fuse_projections`: inside a trace, and eagerly on small inputs off the CPU),
    else one by one: the same values (to rounding). The layers' parameters and state dicts stay those
    of the separate Linear layers. x (N, in) -> [(N, lin.out_features)]."""
    if len(lins) == 1 or not fuse_projections(x.shape[0], x.device):
        return [lin(x) for lin in lins]
    weight = torch.cat([lin.weight for lin in lins])
    bias = None
    if any(lin.bias is not None for lin in lins):
        bias = torch.cat([lin.weight.new_zeros(lin.out_features) if lin.bias is None else lin.bias for lin in lins])
    return list(F.linear(x, weight, bias).split([lin.out_features for lin in lins], dim=-1))


def lazy_or_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """nn.Linear, or nn.LazyLinear for in_features=-1 (PyG's lazy width, inferred at the first call);
    ValueError for other widths <= 0."""
    if in_features == -1:
        return nn.LazyLinear(out_features, bias=bias)
    if in_features <= 0:
        raise ValueError(f"in_channels must be > 0, or -1 to infer it at the first call, got {in_features}")
    return nn.Linear(in_features, out_features, bias=bias)


class NotScriptable:
    """Mixin: `torch.jit.script` on the layer (or a model holding it) fails with one line that names
    torch.compile, instead of TorchScript's error on the first construct it cannot compile."""

    def __prepare_scriptable__(self) -> nn.Module:
        """Called by torch.jit.script before compiling; always raises."""
        raise RuntimeError(
            f"sparseattn.nn.{type(self).__name__} does not support torch.jit.script (TorchScript cannot compile "
            "edge_attention's backends): use torch.compile(model) instead"
        )
