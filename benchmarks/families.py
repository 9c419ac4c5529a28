"""The graph families bench_kernels and bench_dgl time (windows, uniform random, power-law, batches of
complete, causal, bipartite and variable-length blocks); bench_triton_gpu draws its edges on the GPU here."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from sparseattn import graphs


@dataclass
class Family:
    """A benchmark graph, built by `build()`; for block families `kind` and `lengths` ((n_src, n_dst) per
    block) describe the padded batch the dense peers use."""

    name: str
    build: Callable[[], graphs.Graph]
    kind: Optional[str] = None  # "full" or "causal" for block families
    lengths: Optional[List[Tuple[int, int]]] = None


def powerlaw_edges(
    n: int, degree: int, a_src: float = 0.8, a_dst: float = 0.5, seed: int = 0, device=None
) -> torch.Tensor:
    """(2, E <= n * degree) edges, destination-major, repeated pairs kept once: n * degree draws of a source
    and a destination with probability ~ 1 / rank**a_src and 1 / rank**a_dst (ranks placed at node ids by a
    seeded permutation): P(deg = x) ~ x**-(1 + 1/a), 0.8 and 0.5 give exponents 2.25 and 3, as reported for
    real networks (n=50,000, degree 16: ~784,000 edges, largest hub ~15,000 out-edges, in-degree ~1,400)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ranks = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    draws = [torch.multinomial(ranks.pow(-a), n * degree, replacement=True, generator=gen) for a in (a_src, a_dst)]
    src, dst = (torch.randperm(n, generator=gen, device=device)[r] for r in draws)
    key = torch.unique(dst * n + src)  # sorted: destination-major, sources ascending
    return torch.stack([key % n, key // n])


def random_edges(n: int, num_edges: int, seed: int = 0, device=None) -> torch.Tensor:
    """(2, E) uniform edges among n nodes (with replacement), destination-major, drawn and sorted on `device`
    as one key dst * n + src (2^28 edges need no host sort)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    key = torch.randint(0, n * n, (num_edges,), generator=gen, device=device).sort().values
    return torch.stack([key % n, key // n])


def _varlen(total: int, lo: int, hi: int, seed: int = 0) -> List[int]:
    rng, lengths = random.Random(seed), []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(lo, hi), total - sum(lengths)))
    return lengths


def _blocks(name: str, kind: str, sizes: List[Tuple[int, int]]) -> Family:
    return Family(name, lambda: graphs.from_blocks([(kind, s, d) for s, d in sizes]), kind, sizes)


def _sparse(n: int, size: str) -> List[Family]:
    """window-<n> (radius 8), random-<size> and powerlaw-<size> of n nodes and in-degree 16."""
    return [
        Family(f"random-{size}", lambda: graphs.random(n, n, n * 16, seed=0)),
        Family(f"powerlaw-{size}", lambda: graphs.Graph(powerlaw_edges(n, 16), n, n)),
    ]


def knn_graph(n: int = 50_000, k: int = 16, seed: int = 0) -> graphs.Graph:
    """In-edges of each of n uniform random 3-D points from its k nearest points (itself included),
    destination-major; point i is node i, so ids carry no spatial order (a point cloud stored shuffled).
    scipy's cKDTree where installed, else torch.cdist + topk in blocks of 1024 points (same neighbours
    up to ties)."""
    import numpy as np

    points = np.random.default_rng(seed).random((n, 3))
    try:
        from scipy.spatial import cKDTree  # type: ignore[import-untyped]

        nbr = torch.from_numpy(np.ascontiguousarray(cKDTree(points).query(points, k=k)[1])).long()
    except ImportError:
        p = torch.from_numpy(points)
        nbr = torch.cat([torch.cdist(b, p).topk(k, largest=False).indices for b in p.split(1024)])
    return graphs.Graph(torch.stack([nbr.reshape(-1), torch.arange(n).repeat_interleave(k)]), n, n)


def mesh_graph(side: int = 224, seed: int = 0) -> graphs.Graph:
    """A side x side grid, each node attending to itself and its 8 neighbours, node ids shuffled by a
    seeded permutation (edges destination-major in the shuffled ids)."""
    ids = torch.arange(side * side).view(side, side)
    src, dst = [], []
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            a = ids[max(0, -di) : side - max(0, di), max(0, -dj) : side - max(0, dj)]
            b = ids[max(0, di) : side - max(0, -di), max(0, dj) : side - max(0, -dj)]
            src.append(b.reshape(-1))
            dst.append(a.reshape(-1))
    perm = torch.randperm(side * side, generator=torch.Generator().manual_seed(seed))
    edges = perm[torch.stack([torch.cat(src), torch.cat(dst)])]
    order = torch.argsort(edges[1], stable=True)
    return graphs.Graph(edges[:, order], side * side, side * side)


def relabeled(build: Callable[[], graphs.Graph]) -> Callable[[], graphs.Graph]:
    """The graph `build` makes, its nodes renamed in `graphs.locality_order` (the same edges in the same
    order): what a user gets by relabeling once at the model's input."""
    return lambda: (lambda g: graphs.relabel(g, graphs.locality_order(g)))(build())


def structured(quick: bool) -> List[Family]:
    """kNN(16) points and an 8-neighbour mesh with shuffled ids, and each relabeled in locality order."""
    knn = (lambda: knn_graph(2000)) if quick else knn_graph
    mesh = (lambda: mesh_graph(48)) if quick else mesh_graph
    size = ("2k", "48") if quick else ("50k", "224")
    out = [Family(f"knn-{size[0]}-shuffled", knn), Family(f"knn-{size[0]}-local", relabeled(knn))]
    return out + [Family(f"mesh-{size[1]}-shuffled", mesh), Family(f"mesh-{size[1]}-local", relabeled(mesh))]


def families(quick: bool) -> Dict[str, Family]:
    sizes = (2048,) if quick else (8192, 65536)
    window = [Family(f"window-{n}", lambda n=n: graphs.window(n, 8)) for n in sizes]
    window += [Family(f"window-{n}-r64", lambda n=n: graphs.window(n, 64)) for n in sizes]
    if quick:
        fams = window + _sparse(5000, "5k") + [_blocks("complete-16x32", "full", [(32, 32)] * 16)]
        fams += [_blocks("causal-8x64", "causal", [(64, 64)] * 8), _blocks("bipartite-8x40x40", "full", [(40, 40)] * 8)]
        fams.append(_blocks("varlen-5..50-512", "full", [(n, n) for n in _varlen(512, 5, 50)]))
    else:
        fams = window + _sparse(50_000, "50k")
        fams += [_blocks(f"complete-{b}x{n}", "full", [(n, n)] * b) for b, n in ((64, 32), (32, 128), (8, 512))]
        fams += [_blocks("causal-32x128", "causal", [(128, 128)] * 32)]
        fams += [_blocks("bipartite-32x40x40", "full", [(40, 40)] * 32)]
        fams.append(_blocks("varlen-5..50-4096", "full", [(n, n) for n in _varlen(4096, 5, 50)]))
        fams.append(_blocks("complete-2x2048", "full", [(2048, 2048)] * 2))
    fams += structured(quick)
    return {f.name: f for f in fams}


FLEX_FAMILIES = ("window-8192", "causal-32x128", "window-2048", "causal-8x64")
COMPILE_FAMILIES = ("window-8192", "random-50k", "window-2048")  # inductor compiles each shape and pass once
