"""`Block`: a dense sub-pattern of a graph that the builders record (and `detect` recognizes) so
the dense backend can serve it; shared by `graph.py`, `detect.py`, the builders and `pyg.py`."""

from __future__ import annotations

from typing import NamedTuple, Tuple

from .._checks import check_node_count

BLOCK_KINDS = ("full", "full_no_self", "causal", "causal_no_self")


class Block(NamedTuple):
    """A dense sub-pattern of a graph, recorded by the builders for the dense backend.

    The block covers sources `src_start .. src_start + n_src` and destinations
    `dst_start .. dst_start + n_dst`; its edges are the `num_edges` edges starting at
    `edge_start` in the graph's edge order, listed destination-major (for each
    destination in order, its sources in order). Kinds:

        full            every (source, destination) pair
        full_no_self    every pair except s == t (square blocks)
        causal          pairs with local source j <= local destination i (square)
        causal_no_self  pairs with j < i (square)
    """

    kind: str
    src_start: int
    dst_start: int
    n_src: int
    n_dst: int
    edge_start: int

    @property
    def num_edges(self) -> int:
        """Edges in this block: n_src * n_dst for "full", the lower triangle for "causal"."""
        return block_num_edges(self.kind, self.n_src, self.n_dst)


def block_num_edges(kind: str, n_src: int, n_dst: int) -> int:
    """Edges in a block of `kind` over n_src sources and n_dst destinations (ValueError for an unknown kind)."""
    if kind == "full":
        return n_src * n_dst
    return square_blocks_num_edges(kind, n_src, n_src * n_src)


def square_blocks_num_edges(kind: str, nodes: int, squares: int) -> int:
    """Edges in square blocks of `kind` whose sizes s sum to `nodes` and whose s * s sum to `squares`
    (each kind's count is a s^2 + b s, so a batch's total needs only these two sums); ValueError for
    an unknown kind."""
    if kind == "full":
        return squares
    if kind == "full_no_self":
        return squares - nodes
    if kind == "causal":
        return (squares + nodes) // 2
    if kind == "causal_no_self":
        return (squares - nodes) // 2
    raise ValueError(f"unknown block kind {kind!r}; expected one of {BLOCK_KINDS}")


def checked_blocks(blocks: object, num_src: int, num_dst: int, num_edges: int) -> Tuple[Block, ...]:
    """Saved blocks (a list of 6-tuples, `Graph.__getstate__`) as `Block`s, checked to lie inside a
    graph of these counts (ValueError otherwise)."""
    if not isinstance(blocks, (list, tuple)):
        raise ValueError(f"a saved Graph's blocks must be a list, got {type(blocks).__name__}")
    out = []
    for b in blocks:
        if not isinstance(b, (list, tuple)) or len(b) != 6 or b[0] not in BLOCK_KINDS:
            raise ValueError(
                f"a saved Graph's block {b!r} is not (kind, src_start, dst_start, n_src, n_dst, edge_start)"
            )
        blk = Block(b[0], *(check_node_count("a saved block's field", x) for x in b[1:]))
        if (
            blk.src_start + blk.n_src > num_src
            or blk.dst_start + blk.n_dst > num_dst
            or blk.edge_start + blk.num_edges > num_edges
        ):
            raise ValueError(
                f"a saved Graph's block {tuple(blk)} reaches outside the graph "
                f"(num_src={num_src}, num_dst={num_dst}, num_edges={num_edges})"
            )
        out.append(blk)
    return tuple(out)


__all__ = ["Block", "BLOCK_KINDS", "block_num_edges", "square_blocks_num_edges", "checked_blocks"]
