"""`Graph`: a validated (2, E) edge index that caches what kernels need."""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from .._checks import check_edge_ids, check_edge_index, check_node_count, edge_index_sizes
from .._tracing import caching_in_trace, tracing
from .block import Block, checked_blocks
from .detect import find_blocks
from .memo import recall
from .structure import CSR, compress, compress_op, destination_major, row_pointers

_EXPORT_CALLS = itertools.count()  # names the Dims of each `Graph.dynamic_shapes()` call


class Graph:
    """A directed graph for edge attention: source nodes attend into destination nodes.

    Args:
        edge_index: (2, E) integer tensor; row 0 = source node, row 1 = destination node.
            Duplicate edges are kept and count once each. A torch_geometric.EdgeIndex is taken as
            the plain tensor it wraps.
        num_src: number of source nodes (default: an EdgeIndex's sparse size where set, else
            largest source id + 1, which misses trailing nodes without out-edges).
        num_dst: number of destination nodes (default likewise, from the destinations).

    The graph is validated once at construction and keeps a contiguous int64 copy of the
    index, so the tensor passed in may be reused or edited afterwards. It is immutable:
    kernels cache the destination-sorted CSR (`csr()`), the transposed CSR (`csc()`) and
    in-degrees on first use, so the many layers of a model sort the edges only once (do not
    edit `graph.edge_index` in place). Graphs survive `copy.deepcopy`, pickling (DataLoader
    workers) and `torch.save`/`torch.load(weights_only=True)`; a copy rebuilds its cached
    structure on first use. torch.compile and torch.export take a Graph as an input: it is a
    registered pytree node (its index, CSR and CSC; `Graph.dynamic_shapes()`), and inside a trace
    its structure is built by ops (docs/guide/compile.md).
    """

    def __init__(
        self,
        edge_index: Tensor,
        num_src: Optional[int] = None,
        num_dst: Optional[int] = None,
    ) -> None:
        sizes = edge_index_sizes(edge_index)  # a torch_geometric.EdgeIndex's, else (None, None)
        num_src, num_dst = (size if n is None else n for n, size in zip((num_src, num_dst), sizes))
        # a copy of its own (contiguous int64): the caller may reuse or edit the tensor passed in
        edge_index = check_edge_index(edge_index).to(torch.long, memory_format=torch.contiguous_format, copy=True)
        self._validate_and_init(edge_index, num_src, num_dst, counts_given=True)

    @classmethod
    def borrowed(
        cls, edge_index: Tensor, num_src: Optional[int] = None, num_dst: Optional[int] = None, *, one_call: bool = False
    ) -> "Graph":
        """For library code: a Graph validated as `Graph(...)` validates, over `edge_index` itself
        (made contiguous int64, not copied). For an index nobody else will edit: one the library has
        just built (`from_row_pointers`, a distributed shard's local graph) or a raw tensor
        `edge_attention` wraps for the length of one call (one_call=True, see `one_call`). User code
        calls `Graph(...)`, which keeps a copy of its own."""
        g = cls.__new__(cls)
        index = check_edge_index(edge_index).contiguous()
        if one_call and num_src is not None and num_dst is not None and not tracing():
            # the raw index a model hands to each of its layers: checked by the first call alone (graphs.memo)
            key = ("edge_index checked", num_src, num_dst)
            facts = recall(edge_index, key, lambda: g._checked(index, num_src, num_dst))
            g._init(index, *facts)
        else:
            g._validate_and_init(index, num_src, num_dst)
        g._one_call = one_call
        return g

    @classmethod
    def unchecked(
        cls,
        edge_index: Tensor,
        num_src: int,
        num_dst: int,
        *,
        blocks: Optional[Sequence[Block]] = None,
        src_ptr: Optional[Sequence[int]] = None,
        dst_ptr: Optional[Sequence[int]] = None,
        sorted_by_dst: bool = False,
        row_ptr: Optional[Tensor] = None,
    ) -> "Graph":
        """For library code that has just built a valid index (the builders, `KVCache.step_graph`, a
        kernel's backward rebuilding the graph of its op's tensors): a Graph over `edge_index` as
        given, with no check and no copy. The caller guarantees what `Graph(...)` would check, and
        wrong input reads out of bounds in the kernels:

            edge_index  (2, E) contiguous int64, sources in [0, num_src), destinations in [0, num_dst)
            blocks      the dense `Block`s the edges form (None: none recorded, none looked for)
            src_ptr, dst_ptr  (B + 1,) node offsets of the graphs of a batch (None: one graph)
            sorted_by_dst     True only if the edges are ordered by (destination, source)
            row_ptr     (N_dst + 1,) int64 row pointers of the destinations, when already known

        User code calls `Graph(...)` (or a builder)."""
        g = cls.__new__(cls)
        g._init(
            edge_index,
            num_src,
            num_dst,
            tuple(blocks) if blocks is not None else None,
            tuple(src_ptr) if src_ptr is not None else None,
            tuple(dst_ptr) if dst_ptr is not None else None,
            sorted_by_dst,
        )
        g._ptr = row_ptr
        return g

    def _validate_and_init(
        self, edge_index: Tensor, num_src: Optional[int], num_dst: Optional[int], counts_given: bool = False
    ) -> None:
        """counts_given: num_src/num_dst came from the caller of `Graph(...)`, so an id beyond them
        is reported with the argument to change."""
        if tracing():  # nothing that reads the index: its ids are checked when the CSR is built
            if num_src is None or num_dst is None:
                raise ValueError(
                    "under torch.compile or torch.export a Graph needs num_src= and num_dst= (counting the "
                    "nodes would read the index's values)"
                )
            self._init(edge_index, num_src, num_dst)
            return
        self._init(edge_index, *self._checked(edge_index, num_src, num_dst, counts_given))

    @staticmethod
    def _checked(
        edge_index: Tensor, num_src: Optional[int], num_dst: Optional[int], counts_given: bool = False
    ) -> Tuple[int, int, None, None, None, bool, bool]:
        """`_init`'s arguments after edge_index: the node counts (counted where None), ids checked against
        them, and whether the index is destination-major and free of duplicates (as the builders list
        edges: no sort needed, and dense blocks are recognized on first use of `blocks`)."""
        src, dst = edge_index[0], edge_index[1]
        if num_src is None:
            num_src = int(src.max()) + 1 if src.numel() else 0
        if num_dst is None:
            num_dst = int(dst.max()) + 1 if dst.numel() else 0
        num_src, num_dst = check_node_count("num_src", num_src), check_node_count("num_dst", num_dst)
        check_edge_ids(edge_index, num_src, num_dst, ("num_src", "num_dst") if counts_given else (None, None))
        sorted_by_dst, unique = destination_major(src, dst, num_src, num_dst)
        return num_src, num_dst, None, None, None, sorted_by_dst, unique

    def _init(
        self,
        edge_index: Tensor,
        num_src: int,
        num_dst: int,
        blocks: Optional[Tuple[Block, ...]] = None,
        src_ptr: Optional[Tuple[int, ...]] = None,
        dst_ptr: Optional[Tuple[int, ...]] = None,
        sorted_by_dst: bool = False,
        detect_blocks: bool = False,
    ) -> None:
        self._edge_index = edge_index
        self._num_src = num_src
        self._num_dst = num_dst
        self._blocks = blocks
        self._detect_blocks = detect_blocks and blocks is None  # find them on first use of `blocks`
        self._src_ptr = src_ptr
        self._dst_ptr = dst_ptr
        self._sorted_by_dst = sorted_by_dst
        self._csr: Optional[CSR] = None
        self._csc: Optional[CSR] = None
        self._ptr: Optional[Tensor] = None
        self._cache: dict = {}
        self._one_call = False  # see `one_call`
        self._unchecked_input = False

    # ---- copies, pickles, torch.save ------------------------------------------
    def __getstate__(self) -> dict:
        """What a copy or pickle keeps: the index and what the builders recorded, as plain values
        (no cached structure: a copy rebuilds it on first use). `torch.load(weights_only=True)`
        reads it (sparseattn allowlists Graph on import)."""
        return {
            "edge_index": self._edge_index,
            "num_src": self._num_src,
            "num_dst": self._num_dst,
            "blocks": None if self._blocks is None else [tuple(b) for b in self._blocks],
            "src_ptr": None if self._src_ptr is None else list(self._src_ptr),
            "dst_ptr": None if self._dst_ptr is None else list(self._dst_ptr),
            "detect_blocks": self._detect_blocks,
        }

    def __setstate__(self, state: dict) -> None:
        """Rebuild from `__getstate__`'s dict, validated as a new Graph is (a corrupted or crafted
        file gives a one-line error, not an index that reads out of bounds)."""
        if not isinstance(state, dict) or not {"edge_index", "num_src", "num_dst"} <= set(state):
            raise ValueError("not the state of a sparseattn.Graph (a dict with edge_index, num_src, num_dst)")
        edge_index = check_edge_index(state["edge_index"], "a saved Graph's edge_index").contiguous()
        self._validate_and_init(edge_index, state["num_src"], state["num_dst"])
        blocks = state.get("blocks")
        if blocks is not None:
            self._blocks = checked_blocks(blocks, self._num_src, self._num_dst, self.num_edges)
            self._detect_blocks = False
        elif not state.get("detect_blocks", True):
            self._detect_blocks = False
        for name in ("src_ptr", "dst_ptr"):
            offsets = state.get(name)
            if offsets is not None:
                total = self._num_src if name == "src_ptr" else self._num_dst
                setattr(self, f"_{name}", _checked_offsets(name, offsets, total))

    # ---- what it holds -------------------------------------------------------
    @property
    def edge_index(self) -> Tensor:
        """(2, E) int64: row 0 sources, row 1 destinations, in the caller's order."""
        return self._edge_index

    @property
    def src(self) -> Tensor:
        """(E,) int64 source ids, row 0 of the edge index (a view of the graph's own copy)."""
        return self._edge_index[0]

    @property
    def dst(self) -> Tensor:
        """(E,) int64 destination ids, row 1 of the edge index."""
        return self._edge_index[1]

    @property
    def num_src(self) -> int:
        """N_src: the number of source nodes (ids 0 .. N_src - 1)."""
        return self._num_src

    @property
    def num_dst(self) -> int:
        """N_dst: the number of destination nodes; outputs have this many rows."""
        return self._num_dst

    @property
    def num_edges(self) -> int:
        """E: the number of edges, duplicates counted."""
        return self._edge_index.shape[1]

    @property
    def device(self) -> torch.device:
        """The device of the edge index and of the structure cached from it."""
        return self._edge_index.device

    @property
    def blocks(self) -> Optional[Tuple[Block, ...]]:
        """Dense block structure recorded by a builder, or None (see `Block`). A graph built from
        a destination-major tensor without duplicates gets the "full"/"causal" blocks its edges
        decompose into (`detect.find_blocks`), found on first access."""
        if self._detect_blocks:
            if tracing():  # finding them reads the index: traced code takes no dense path on such a graph
                return None
            idx = self.src if self._sorted_by_dst else self.csr().idx
            self._blocks, self._detect_blocks = find_blocks(idx, self._row_ptr()), False
        return self._blocks

    @property
    def num_graphs(self) -> int:
        """How many graphs `graphs.batch`, `from_blocks` or `from_pyg` joined into this one (1 if
        not a batch). A batch records its per-graph node ranges (`src_ptr`, `dst_ptr`), with or
        without dense `blocks`."""
        return len(self._dst_ptr) - 1 if self._dst_ptr is not None else 1

    @property
    def src_ptr(self) -> Tuple[int, ...]:
        """(B + 1,) source-node offsets of the batched graphs."""
        return self._src_ptr if self._src_ptr is not None else (0, self._num_src)

    @property
    def dst_ptr(self) -> Tuple[int, ...]:
        """(B + 1,) destination-node offsets of the batched graphs."""
        return self._dst_ptr if self._dst_ptr is not None else (0, self._num_dst)

    @property
    def is_sorted_by_dst(self) -> bool:
        """True when the edges are already in destination-major order."""
        return self._sorted_by_dst

    @property
    def one_call(self) -> bool:
        """True for a graph made for a single attention call (`edge_attention` given a raw tensor,
        `for_one_call()`): kernels then skip structure that pays off only when the graph is reused
        (csr trains in its head-major layout rather than building the transposed index)."""
        return self._one_call

    def for_one_call(self) -> "Graph":
        """This graph marked `one_call`, for a layer that builds a graph per call (GlobalAttention):
        a new Graph sharing the index, the recorded blocks and whatever structure is cached; this
        one is left unchanged."""
        if self._one_call:
            return self
        g = Graph.__new__(Graph)
        g.__dict__.update(self.__dict__)  # the same tensors: nothing is copied or validated again
        g._cache = dict(self._cache)
        g._one_call = True
        return g

    def __repr__(self) -> str:
        extra = f", graphs={self.num_graphs}" if self._dst_ptr is not None else ""
        extra += f", blocks={len(self.blocks)}" if self.blocks is not None else ""
        return (
            f"Graph(num_src={self.num_src}, num_dst={self.num_dst}, "
            f"num_edges={self.num_edges}{extra}, device={self.device})"
        )

    # ---- cached structure ----------------------------------------------------
    def csr(self) -> CSR:
        """Destination-sorted CSR (sorted by destination, then source). Cached. Inside a trace it is
        built by the `sparseattn::compress` op (and cached only under torch.compile, see
        `_tracing.caching_in_trace`)."""
        if self._csr is None:
            if tracing():
                csr = CSR(*compress_op(self.dst, self.src, self._num_dst, self._num_src, False))
                if caching_in_trace():
                    self._csr = csr
                return csr
            self._csr = compress(self.dst, self.src, self._num_dst, self._num_src, self._sorted_by_dst, self._ptr)
        return self._csr

    def _row_ptr(self) -> Tensor:
        """csr().ptr, without sorting or a permutation when only the row pointers are needed."""
        if self._csr is not None or tracing():
            return self.csr().ptr
        if self._ptr is None:
            self._ptr = row_pointers(self.dst, self._num_dst)
        return self._ptr

    def csc(self) -> CSR:
        """Source-sorted (transposed) CSR: ptr over sources, idx holds destinations. Cached (inside a
        trace built by an op, as `csr`)."""
        if self._csc is None:
            if tracing():
                csc = CSR(*compress_op(self.src, self.dst, self._num_src, self._num_dst, True))
                if caching_in_trace():
                    self._csc = csc
                return csc
            self._csc = compress(
                self.src, self.dst, self._num_src, self._num_dst, False, cols_sorted=self._sorted_by_dst
            )
        return self._csc

    def in_degree(self) -> Tensor:
        """(N_dst,) int64 number of in-edges of each destination. Cached."""
        ptr = self._row_ptr()
        return ptr[1:] - ptr[:-1]

    def cached(self, key: str, build):
        """Per-graph cache for backends: `build()` runs once per key (inside a torch.export trace a
        value not cached before is built and not kept)."""
        if key not in self._cache:
            value = build()
            if tracing() and not caching_in_trace():
                return value
            self._cache[key] = value
        return self._cache[key]

    # ---- torch.export: a Graph argument is its tensors -----------------------
    @classmethod
    def _from_structure(cls, children: Sequence[Tensor]) -> "Graph":
        """The Graph `_flatten` took apart: node counts from the row pointers' lengths (so they stay
        symbolic in an exported program), the CSR and CSC as they were."""
        edge_index, ptr, idx, perm, cptr, cidx, cperm = children
        g = cls.unchecked(edge_index, cptr.shape[0] - 1, ptr.shape[0] - 1)
        g._csr, g._csc = CSR(ptr, idx, perm), CSR(cptr, cidx, cperm)
        g._unchecked_input = True  # against the tensors' rows: exported.check_node_counts
        return g

    @staticmethod
    def dynamic_shapes() -> List[dict]:
        """The `dynamic_shapes` entry of a Graph argument of `torch.export.export`: its node and
        edge counts dynamic (a Graph flattens into its index, CSR and CSC), node counts from 0.

            ep = torch.export.export(model, (x, graph), dynamic_shapes=({0: Dim.AUTO}, Graph.dynamic_shapes()))

        The row pointers' lengths are N + 1 for a Dim N >= 0 of each call's own: with Dim.AUTO export
        assumes N + 1 >= 3 (it specializes sizes 0 and 1) and the program refuses 1-node graphs."""
        k = next(_EXPORT_CALLS)
        n_dst, n_src = (torch.export.Dim(f"graph{k}_num_{end}", min=0) for end in ("dst", "src"))
        auto = torch.export.Dim.AUTO
        return [{1: auto}, {0: n_dst + 1}, {0: auto}, {0: auto}, {0: n_src + 1}, {0: auto}, {0: auto}]

    # ---- derived graphs ------------------------------------------------------
    def to(self, device: Union[str, torch.device]) -> "Graph":
        """The same graph with its index (and any cached CSR) on `device`."""
        if isinstance(device, torch.dtype) or not isinstance(device, (str, torch.device)):
            raise TypeError(
                f"Graph.to takes a device (a graph's index is always int64), got {device!r}; "
                "cast q, k and v to change the dtype of attention"
            )
        device = torch.device(device)
        if device == self.device:
            return self
        g = Graph.unchecked(
            self._edge_index.to(device),
            self._num_src,
            self._num_dst,
            blocks=self.blocks,
            src_ptr=self._src_ptr,
            dst_ptr=self._dst_ptr,
            sorted_by_dst=self._sorted_by_dst,
        )
        if self._csr is not None:
            g._csr = CSR(*(t.to(device) for t in self._csr))
        if self._csc is not None:
            g._csc = CSR(*(t.to(device) for t in self._csc))
        return g

    def edge_subgraph(self, edge_mask: Tensor) -> "Graph":
        """Keep the edges where `edge_mask` (E,) bool is True; node sets are unchanged."""
        if not isinstance(edge_mask, Tensor) or edge_mask.dtype != torch.bool:
            raise TypeError("edge_mask must be a bool tensor of shape (E,)")
        if edge_mask.shape != (self.num_edges,):
            raise ValueError(f"edge_mask must have shape ({self.num_edges},), got {tuple(edge_mask.shape)}")
        return Graph.unchecked(
            self._edge_index[:, edge_mask],
            self._num_src,
            self._num_dst,
            src_ptr=self._src_ptr,
            dst_ptr=self._dst_ptr,
            sorted_by_dst=self._sorted_by_dst,
        )

    def dst_subgraph(self, node_mask: Tensor) -> "Graph":
        """Keep only the edges into destinations where `node_mask` (N_dst,) bool is True.

        Node ids are unchanged, so outputs still have N_dst rows; destinations left
        without in-edges get 0 from `edge_attention`. The kept edges are those where
        `node_mask[graph.dst]` is True, in their original order.
        """
        if not isinstance(node_mask, Tensor) or node_mask.dtype != torch.bool:
            raise TypeError("node_mask must be a bool tensor of shape (N_dst,)")
        if node_mask.shape != (self.num_dst,):
            raise ValueError(f"node_mask must have shape ({self.num_dst},), got {tuple(node_mask.shape)}")
        return self.edge_subgraph(node_mask[self.dst])

    def split_dst(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Split a (N_dst, ...) tensor back into the per-graph pieces of a batch."""
        sizes = [b - a for a, b in zip(self.dst_ptr[:-1], self.dst_ptr[1:])]
        return torch.split(x, sizes)

    def split_src(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Split a (N_src, ...) tensor back into the per-graph pieces of a batch."""
        sizes = [b - a for a, b in zip(self.src_ptr[:-1], self.src_ptr[1:])]
        return torch.split(x, sizes)


def _checked_offsets(name: str, offsets: object, total: int) -> Tuple[int, ...]:
    if (
        not isinstance(offsets, (list, tuple))
        or not offsets
        or offsets[0] != 0
        or offsets[-1] != total
        or any(not isinstance(x, int) or isinstance(x, bool) for x in offsets)
        or any(b < a for a, b in zip(offsets[:-1], offsets[1:]))
    ):
        raise ValueError(f"a saved Graph's {name} must be non-decreasing ints from 0 to {total}, got {offsets!r}")
    return tuple(offsets)


# `torch.load(weights_only=True)` may rebuild a Graph: its state is plain values and one tensor,
# and `__setstate__` validates them like a new Graph
torch.serialization.add_safe_globals([Graph])


def _flatten(g: Graph) -> Tuple[List[Tensor], None]:
    return [g.edge_index, *g.csr(), *g.csc()], None


_CHILDREN = ("edge_index", "ptr", "idx", "perm", "src_ptr", "src_idx", "src_perm")

# torch.export takes a Graph argument as these tensors (the structure built eagerly, once), with node
# and edge counts that may vary; what the builders recorded (blocks, batch offsets) is not carried
pytree.register_pytree_node(
    Graph,
    _flatten,
    lambda children, _: Graph._from_structure(list(children)),
    serialized_type_name="sparseattn.Graph",
    flatten_with_keys_fn=lambda g: ([(pytree.GetAttrKey(n), t) for n, t in zip(_CHILDREN, _flatten(g)[0])], None),
)
