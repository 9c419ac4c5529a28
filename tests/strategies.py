"""Hypothesis strategies: small random graphs with the awkward cases (E = 0, duplicate edges,
isolated destinations, bipartite sizes), in every input layout a user may pass (contiguous or
not, int32 or int64, edges in any order), and matching attention inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from hypothesis import strategies as st

from sparseattn import graphs

# how the (2, E) index reaches edge_attention: as built, as a (2, E) view of an (E, 2) pairs tensor
# (`pairs.t()`), as a non-contiguous slice of a wider tensor, or in int32, alone or combined
INDEX_LAYOUTS = ("contiguous", "transposed", "strided", "int32", "transposed-int32")


def laid_out(edge_index: torch.Tensor, layout: str) -> torch.Tensor:
    """The same edges as `edge_index` (2, E) int64, in `layout` (one of INDEX_LAYOUTS)."""
    ei = edge_index.int() if layout.endswith("int32") else edge_index
    if layout.startswith("transposed"):
        return ei.t().contiguous().t()  # pairs (E, 2) viewed as (2, E): strides (1, 2)
    if layout == "strided":
        return ei.repeat_interleave(2, dim=1)[:, ::2]  # every other column: strides (2E, 2)
    return ei


@dataclass
class Case:
    edge_index: torch.Tensor  # (2, E)
    n_src: int
    n_dst: int
    heads: int
    d: int
    dv: int
    scale: Optional[float]
    clamp: Optional[Tuple[float, float]]
    use_bias: bool
    seed: int
    blocks: Optional[list] = None  # (kind, n_src, n_dst) specs when the graph is built from dense blocks
    layout: str = "contiguous"  # how graph() hands the raw index over (INDEX_LAYOUTS)

    def graph(self):
        """What to pass as the graph: a block-recording Graph for block cases, else the raw (2, E)
        index in the case's layout (`edge_index` stays contiguous int64 for the references)."""
        return graphs.from_blocks(self.blocks) if self.blocks is not None else laid_out(self.edge_index, self.layout)

    def tensors(self, dtype=torch.float64, device="cpu", magnitude=1.0):
        """q, k, v and a bias table (N_dst, N_src, H), all leaves requiring grad."""
        gen = torch.Generator().manual_seed(self.seed)
        q = torch.randn(self.n_dst, self.heads, self.d, generator=gen, dtype=torch.float64) * magnitude
        k = torch.randn(self.n_src, self.heads, self.d, generator=gen, dtype=torch.float64) * magnitude
        v = torch.randn(self.n_src, self.heads, self.dv, generator=gen, dtype=torch.float64)
        table = torch.randn(self.n_dst, self.n_src, self.heads, generator=gen, dtype=torch.float64)
        return [t.to(dtype=dtype, device=device).requires_grad_() for t in (q, k, v, table)]


@st.composite
def graph_cases(draw, max_nodes=10, max_edges=48, bipartite=None):
    is_bip = draw(st.booleans()) if bipartite is None else bipartite
    n_src = draw(st.integers(1, max_nodes))
    n_dst = draw(st.integers(1, max_nodes)) if is_bip else n_src
    num_edges = draw(st.integers(0, max_edges))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src, (num_edges,), generator=gen)
    dst = torch.randint(0, n_dst, (num_edges,), generator=gen)
    if num_edges and draw(st.booleans()):  # force duplicates
        src = torch.cat([src, src[: num_edges // 2 + 1]])
        dst = torch.cat([dst, dst[: num_edges // 2 + 1]])
    if draw(st.booleans()):  # destination-major, as builders and many users list edges (no sort needed)
        order = torch.argsort(dst * n_src + src, stable=True)
        src, dst = src[order], dst[order]
    return Case(
        edge_index=torch.stack([src, dst]),
        n_src=n_src,
        n_dst=n_dst,
        heads=draw(st.integers(1, 3)),
        d=draw(st.sampled_from([1, 3, 4, 8])),
        dv=draw(st.sampled_from([1, 2, 5, 8])),
        scale=draw(st.sampled_from([None, 0.3, 2.0])),
        clamp=draw(st.sampled_from([(-5.0, 5.0), None, (-1.0, 0.5)])),
        use_bias=draw(st.booleans()),
        seed=seed,
        layout=draw(st.sampled_from(INDEX_LAYOUTS)),
    )


BLOCK_KINDS = ["full", "full_no_self", "causal", "causal_no_self", "bipartite"]


@st.composite
def block_cases(draw, max_blocks=5, max_size=7):
    """Batches of complete / causal / bipartite blocks (sizes include 0 and 1), as the dense
    backend needs; duplicates cannot occur in such graphs."""
    specs = []
    for kind in draw(st.lists(st.sampled_from(BLOCK_KINDS), min_size=0, max_size=max_blocks)):
        n = draw(st.integers(0, max_size))
        specs.append(("full", draw(st.integers(0, max_size)), n) if kind == "bipartite" else (kind, n, n))
    g = graphs.from_blocks(specs)
    return Case(
        edge_index=g.edge_index,
        n_src=g.num_src,
        n_dst=g.num_dst,
        heads=draw(st.integers(1, 3)),
        d=draw(st.sampled_from([1, 3, 4, 8])),
        dv=draw(st.sampled_from([1, 2, 5, 8])),
        scale=draw(st.sampled_from([None, 0.3, 2.0])),
        clamp=draw(st.sampled_from([(-5.0, 5.0), None, (-1.0, 0.5)])),
        use_bias=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        blocks=specs,
    )
