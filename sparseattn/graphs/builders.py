"""Graph builders for the Transformer's graphs, local windows, random graphs and batches.

Every builder lists edges destination-major (for each destination in order, its
sources in increasing order) and returns a `Graph`. The dense patterns (complete,
causal, bipartite) also record their `Block` so a dense backend can use them.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor

from .block import BLOCK_KINDS, Block, block_num_edges
from .detect import find_blocks
from .graph import Graph

Device = Union[str, torch.device, None]


def _check_count(name: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def block_edges(kind: str, n_src: int, n_dst: int, device: Device = None) -> Tensor:
    """(2, E) local edge index of one dense block, destination-major. Built from the block's known
    edge count, with no boolean mask (whose output size a compiled graph could not know)."""
    num_edges = block_num_edges(kind, n_src, n_dst)
    rows = torch.arange(n_dst, device=device)
    if kind == "full":
        return torch.stack([torch.arange(n_src, device=device).repeat(n_dst), rows.repeat_interleave(n_src)])
    if kind == "full_no_self":  # row i: sources 0 .. n - 1 except i
        dst = rows.repeat_interleave(max(n_src - 1, 0), output_size=num_edges)
        j = torch.arange(num_edges, device=device) - dst * (n_src - 1)
        return torch.stack([j + (j >= dst).long(), dst])
    # causal: row i has sources 0 .. i (0 .. i - 1 without self-loops)
    degree = rows + (1 if kind == "causal" else 0)
    dst = rows.repeat_interleave(degree, output_size=num_edges)
    first = torch.cumsum(degree, 0) - degree  # (n_dst,) position of each row's first edge
    return torch.stack([torch.arange(num_edges, device=device) - first[dst], dst])


def _dense_graph(kind: str, n_src: int, n_dst: int, device: Device) -> Graph:
    ei = block_edges(kind, n_src, n_dst, device)
    return Graph.unchecked(ei, n_src, n_dst, blocks=[Block(kind, 0, 0, n_src, n_dst, 0)], sorted_by_dst=True)


def complete(n: int, self_loops: bool = True, *, device: Device = None) -> Graph:
    """Every token attends to every token (the encoder's graph): n*n edges, n*(n-1) without self-loops."""
    n = _check_count("n", n)
    return _dense_graph("full" if self_loops else "full_no_self", n, n, device)


def causal(n: int, self_loops: bool = True, *, device: Device = None) -> Graph:
    """Token i attends to tokens j <= i (the decoder's graph); j < i without self-loops."""
    n = _check_count("n", n)
    return _dense_graph("causal" if self_loops else "causal_no_self", n, n, device)


def bipartite(n_src: int, n_dst: int, *, device: Device = None) -> Graph:
    """Every destination attends to every source (cross attention, encoder -> decoder)."""
    n_src, n_dst = _check_count("n_src", n_src), _check_count("n_dst", n_dst)
    return _dense_graph("full", n_src, n_dst, device)


def window(n: int, radius: int, causal: bool = False, *, device: Device = None) -> Graph:
    """Local attention: token i attends to j with |i - j| <= radius (i - radius <= j <= i if causal)."""
    n, radius = _check_count("n", n), _check_count("radius", radius)
    offsets = torch.arange(-radius, 1 if causal else radius + 1, device=device)
    dst = torch.arange(n, device=device).repeat_interleave(offsets.numel())
    src = dst + offsets.repeat(n)
    keep = (src >= 0) & (src < n)
    return Graph.unchecked(torch.stack([src[keep], dst[keep]]), n, n, sorted_by_dst=True)


def random(n_src: int, n_dst: int, num_edges: int, seed: int = 0, *, device: Device = None) -> Graph:
    """`num_edges` edges drawn uniformly (with replacement, so duplicates can occur) from a seeded generator."""
    n_src, n_dst = _check_count("n_src", n_src), _check_count("n_dst", n_dst)
    num_edges = _check_count("num_edges", num_edges)
    if num_edges and (n_src == 0 or n_dst == 0):
        raise ValueError(f"cannot draw {num_edges} edges with n_src={n_src}, n_dst={n_dst}")
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, max(n_src, 1), (num_edges,), generator=gen)
    dst = torch.randint(0, max(n_dst, 1), (num_edges,), generator=gen)
    order = torch.argsort(dst * max(n_src, 1) + src, stable=True)
    ei = torch.stack([src[order], dst[order]]).to(device)
    return Graph.unchecked(ei, n_src, n_dst, sorted_by_dst=True)


def batch(graphs: Sequence[Graph]) -> Graph:
    """Join graphs into one block-diagonal graph with no padding.

    Graph b's sources are shifted by the number of sources before it, its destinations
    likewise; `src_ptr`/`dst_ptr` keep the per-graph node ranges (use `split_dst` to
    split outputs back). Blocks are kept when every input has them.
    """
    graphs = list(graphs)
    for i, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise TypeError(f"graphs[{i}] must be a sparseattn.Graph, got {type(g).__name__}")
    if not graphs:
        return Graph.unchecked(
            torch.empty(2, 0, dtype=torch.long), 0, 0, src_ptr=[0], dst_ptr=[0], blocks=[], sorted_by_dst=True
        )
    device = graphs[0].device
    if any(g.device != device for g in graphs):
        raise ValueError("all graphs passed to batch() must be on one device")
    src_ptr, dst_ptr, edge_ptr = [0], [0], [0]
    for g in graphs:
        src_ptr.append(src_ptr[-1] + g.num_src)
        dst_ptr.append(dst_ptr[-1] + g.num_dst)
        edge_ptr.append(edge_ptr[-1] + g.num_edges)
    shift = torch.tensor([src_ptr[:-1], dst_ptr[:-1]], device=device)  # (2, B)
    counts = torch.tensor([g.num_edges for g in graphs], device=device)
    ei = torch.cat([g.edge_index for g in graphs], dim=1) + shift.repeat_interleave(counts, dim=1)
    found: list = []
    for g, s0, d0, e0 in zip(graphs, src_ptr, dst_ptr, edge_ptr):
        if g.blocks is None:
            break
        found.extend(
            Block(b.kind, b.src_start + s0, b.dst_start + d0, b.n_src, b.n_dst, b.edge_start + e0) for b in g.blocks
        )
    every_graph_has_blocks = all(g.blocks is not None for g in graphs)
    return Graph.unchecked(
        ei,
        src_ptr[-1],
        dst_ptr[-1],
        blocks=found if every_graph_has_blocks else None,
        src_ptr=src_ptr,
        dst_ptr=dst_ptr,
        sorted_by_dst=all(g.is_sorted_by_dst for g in graphs),
    )


def from_blocks(blocks: Sequence[tuple], *, device: Device = None) -> Graph:
    """A block-diagonal graph of dense blocks given as (kind, n_src, n_dst) triples; the fastest
    way to build a Transformer batch (kinds as in `Block`). The edges of all blocks come from one
    set of tensor ops, whatever the number of blocks."""
    specs = []
    for i, spec in enumerate(blocks):
        if not isinstance(spec, (tuple, list)) or len(spec) != 3:
            raise TypeError(f"blocks[{i}] must be a (kind, n_src, n_dst) triple, got {spec!r}")
        kind, n_src, n_dst = spec
        if kind not in BLOCK_KINDS:
            raise ValueError(f"blocks[{i}] kind must be one of {BLOCK_KINDS}, got {kind!r}")
        n_src, n_dst = _check_count(f"blocks[{i}] n_src", n_src), _check_count(f"blocks[{i}] n_dst", n_dst)
        if kind != "full" and n_src != n_dst:
            raise ValueError(f"blocks[{i}]: a {kind!r} block must be square, got {n_src} x {n_dst}")
        specs.append((kind, n_src, n_dst))
    src_ptr, dst_ptr, edge_start, found = [0], [0], 0, []
    for kind, n_src, n_dst in specs:
        found.append(Block(kind, src_ptr[-1], dst_ptr[-1], n_src, n_dst, edge_start))
        edge_start += block_num_edges(kind, n_src, n_dst)
        src_ptr.append(src_ptr[-1] + n_src)
        dst_ptr.append(dst_ptr[-1] + n_dst)
    edge_index = _block_diagonal_edges(specs, src_ptr, dst_ptr, edge_start, device)
    return Graph.unchecked(
        edge_index, src_ptr[-1], dst_ptr[-1], blocks=found, src_ptr=src_ptr, dst_ptr=dst_ptr, sorted_by_dst=True
    )


def _take(x: Tensor, index: Tensor) -> Tensor:
    """x[index] for 1-D x (index_select: several times faster than advanced indexing on CPU)."""
    return torch.index_select(x, 0, index)


def _block_diagonal_edges(
    specs: List[Tuple[str, int, int]], src_ptr: List[int], dst_ptr: List[int], num_edges: int, device: Device
) -> Tensor:
    """(2, E) edge index of the blocks `specs` placed at node offsets src_ptr, dst_ptr (B + 1,),
    destination-major, as `block_edges` lists each block: per destination row its degree (n_src,
    n_src - 1, i + 1 or i for local row i), then each edge's position j in its row gives its source
    (j, or j + 1 past the diagonal for "full_no_self")."""
    info = torch.tensor(  # (5, B): kind code, n_src, n_dst, src_start, dst_start
        [
            [BLOCK_KINDS.index(k) for k, _, _ in specs],
            [s[1] for s in specs],
            [s[2] for s in specs],
            src_ptr[:-1],
            dst_ptr[:-1],
        ],
        dtype=torch.long,
        device=device,
    ).view(5, len(specs))
    kind, n_src, n_dst, src_start, dst_start = info
    block = torch.repeat_interleave(torch.arange(len(specs), device=device), n_dst, output_size=dst_ptr[-1])
    kind, n_src, src_start = (_take(t, block) for t in (kind, n_src, src_start))  # (N_dst,) per destination row
    local = torch.arange(dst_ptr[-1], device=device) - _take(dst_start, block)  # (N_dst,) row i within its block
    causal = kind >= BLOCK_KINDS.index("causal")
    no_self = (kind == BLOCK_KINDS.index("full_no_self")) | (kind == BLOCK_KINDS.index("causal_no_self"))
    degree = torch.where(causal, local + 1, n_src) - no_self.long()
    dst = torch.repeat_interleave(torch.arange(dst_ptr[-1], device=device), degree, output_size=num_edges)
    first = torch.cumsum(degree, 0) - degree  # (N_dst,) position of each row's first edge
    edge = torch.arange(num_edges, device=device)
    edge_index = torch.empty(2, num_edges, dtype=torch.long, device=device)
    edge_index[1] = dst
    src = torch.add(edge, _take(src_start - first, dst), out=edge_index[0])  # j + src_start, j = edge - first
    if any(k == "full_no_self" for k, _, _ in specs):  # past the diagonal: one more
        diagonal = torch.where(causal | ~no_self, num_edges, first + local)  # (N_dst,) position of j = i
        src += (edge >= _take(diagonal, dst)).long()
    return edge_index


def from_row_pointers(ptr: Tensor, src: Tensor, num_src: int, *, validate: bool = True) -> Graph:
    """A graph given destination-major, as CSR rows: destination t's sources are
    src[ptr[t] : ptr[t + 1]].

    Args:
        ptr: (N_dst + 1,) integer row pointers, ptr[0] = 0, non-decreasing, ptr[-1] = E.
        src: (E,) integer source ids.
        num_src: number of source nodes.
        validate: check ptr, src and num_src as `Graph` does (ptr and src are not kept: the
            graph's index is built from them). False skips every check, for code
            that builds valid rows each time, such as a decoder's per-step graphs: each row's
            sources must then be increasing (no duplicates), and the dense blocks the rows form
            are found at once (`graphs.detect`).
    """
    if validate:
        if not isinstance(ptr, Tensor) or ptr.dim() != 1 or ptr.numel() == 0 or ptr.is_floating_point():
            raise ValueError("ptr must be a non-empty 1-D integer tensor of row pointers (N_dst + 1,)")
        if not isinstance(src, Tensor) or src.dim() != 1 or src.is_floating_point():
            raise ValueError("src must be a 1-D integer tensor of source ids (E,)")
        if int(ptr[0]) != 0 or int(ptr[-1]) != src.numel():
            raise ValueError(f"ptr must start at 0 and end at E = {src.numel()}, got {int(ptr[0])} .. {int(ptr[-1])}")
        if ptr.numel() > 1 and int(ptr.diff().min()) < 0:
            raise ValueError("ptr must be non-decreasing")
    ptr = ptr.long()
    num_dst, num_edges = ptr.numel() - 1, src.numel()
    dst = torch.arange(num_dst, device=ptr.device).repeat_interleave(ptr.diff(), output_size=num_edges)
    edge_index = torch.stack([src.long(), dst])
    if validate:
        return Graph.borrowed(edge_index, num_src=num_src, num_dst=num_dst)  # a new tensor: no copy
    blocks = find_blocks(src.long(), ptr)
    return Graph.unchecked(edge_index, num_src, num_dst, blocks=blocks, sorted_by_dst=True, row_ptr=ptr)
