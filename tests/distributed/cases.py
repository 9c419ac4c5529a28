"""What each gloo rank runs in tests/distributed: sharded attention against the whole graph in one process.

Every rank builds the same graph and inputs (seeded), computes `edge_attention` on the whole graph
itself, and compares its shard's outputs and gradients with the rows it owns; the halo it received
is compared with the boundary sources counted here from the whole graph with Python sets."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from sparseattn import EdgeAttention, Graph, edge_attention, graphs
from sparseattn.distributed import HaloExchange, local_shard, partition, sharded_edge_attention

DEFAULT_CLAMP = (-5.0, 5.0)


def power_law(n: int, num_edges: int, seed: int) -> Graph:
    """Sources drawn with probability ~ 1/(rank+1)^1.2 (a few hubs feed most destinations)."""
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** 1.2
    src = torch.multinomial(weights, num_edges, replacement=True, generator=gen)
    src = torch.randperm(n, generator=gen)[src]  # hubs spread over the id range
    dst = torch.randint(0, n, (num_edges,), generator=gen)
    return Graph(torch.stack([src, dst]), num_src=n, num_dst=n)


def isolated(n: int, seed: int) -> Graph:
    """Edges into the even destinations only: every odd destination has no in-edge."""
    gen = torch.Generator().manual_seed(seed)
    dst = 2 * torch.randint(0, n // 2, (3 * n,), generator=gen)
    src = torch.randint(0, n, (3 * n,), generator=gen)
    return Graph(torch.stack([src, dst]), num_src=n, num_dst=n)


def build_graph(name: str, world: int) -> Graph:
    if name == "window":
        return graphs.window(60, 3)
    if name == "window_causal":  # rank 0 reads only its own rows: no halo
        return graphs.window(60, 4, causal=True)
    if name == "random":
        return graphs.random(48, 48, 260, seed=1)
    if name == "power_law":
        return power_law(64, 400, seed=2)
    if name == "blocks":
        return graphs.batch([graphs.complete(7), graphs.causal(5), graphs.complete(11), graphs.window(9, 2)])
    if name == "aligned_blocks":  # one complete block per part or two: no halo anywhere
        return graphs.batch([graphs.complete(8) for _ in range(4)])
    if name == "isolated":
        return isolated(40, seed=3)
    if name == "tiny":  # fewer nodes than 4 ranks: an empty shard
        return graphs.window(3, 1)
    if name == "bipartite":
        return graphs.random(30, 20, 140, seed=4)
    if name == "small_window":
        return graphs.window(12, 2)
    raise ValueError(name)


GRAPHS = ("window", "window_causal", "random", "power_law", "blocks", "aligned_blocks", "isolated", "tiny", "bipartite")


@dataclass(frozen=True)
class Case:
    graph: str
    backend: str = "csr"
    clamp: Optional[Tuple[float, float]] = DEFAULT_CLAMP
    dtype: torch.dtype = torch.float64
    method: str = "contiguous"
    edge_terms: str = "none"  # "none", "per_head", "shared"
    heads: int = 2
    d: int = 4
    dv: int = 3

    @property
    def name(self) -> str:
        clamp = "exact" if self.clamp is None else "clamp"
        dtype = str(self.dtype).replace("torch.", "")
        return f"{self.graph}-{self.method}-{self.backend}-{clamp}-{dtype}-terms_{self.edge_terms}"


def all_cases() -> List[Case]:
    cases: List[Case] = []
    for g in GRAPHS:
        for backend in ("reference", "csr", "scatter", "auto"):
            for clamp in (DEFAULT_CLAMP, None):
                cases.append(Case(g, backend, clamp))
        for backend in ("csr", "auto"):
            cases.append(Case(g, backend, dtype=torch.float32))
    for g in ("window", "random", "power_law", "bipartite", "isolated"):
        for backend in ("reference", "csr", "scatter"):
            for clamp in (DEFAULT_CLAMP, None):
                cases.append(Case(g, backend, clamp, edge_terms="per_head"))
        cases.append(Case(g, "csr", edge_terms="shared"))
        cases.append(Case(g, "auto", dtype=torch.float32, edge_terms="per_head"))
    for clamp in (DEFAULT_CLAMP, None):
        cases.append(Case("aligned_blocks", "dense", clamp))
    for g in ("window", "random", "power_law"):
        cases.append(Case(g, "csr", method="metis"))
    cases.append(Case("power_law", "csr", method="metis", edge_terms="per_head"))
    for clamp in (DEFAULT_CLAMP, None):
        cases.append(Case("small_window", "triton", clamp, dtype=torch.float32, edge_terms="per_head"))
    return cases


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    terms: Dict[str, torch.Tensor] = field(default_factory=dict)


def make_inputs(case: Case, g: Graph) -> Inputs:
    gen = torch.Generator().manual_seed(zlib.crc32(case.graph.encode()))  # the same on every rank
    h, d, dv, e = case.heads, case.d, case.dv, g.num_edges

    def rand(*shape: int, scale: float = 1.5) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(case.dtype)

    inputs = Inputs(rand(g.num_dst, h, d), rand(g.num_src, h, d), rand(g.num_src, h, dv), rand(g.num_dst, h, dv))
    if case.edge_terms != "none":
        th = h if case.edge_terms == "per_head" else 1
        inputs.terms = {
            "bias": rand(e, h),
            "edge_key": rand(e, th, d, scale=0.5),
            "edge_value": rand(e, th, dv),
            "edge_scale": 1 + rand(e, th, d, scale=0.3),
        }
    return inputs


def expected_halo(g: Graph, nodes: torch.Tensor, src_nodes: torch.Tensor) -> set:
    """The sources of the edges into `nodes` that this rank does not own, from the whole graph."""
    mine, own_src = set(nodes.tolist()), set(src_nodes.tolist())
    return {s for s, t in zip(g.src.tolist(), g.dst.tolist()) if t in mine} - own_src


def max_err(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> float:
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return float("inf")
    return 0.0 if a.numel() == 0 else float((a.detach().double() - b.detach().double()).abs().max())


def run_case(case: Case, rank: int, world: int) -> dict:
    g = build_graph(case.graph, world)
    x = make_inputs(case, g)
    kwargs = dict(clamp=case.clamp, backend=case.backend, eps=1e-6 if case.clamp and case.edge_terms != "none" else 0.0)
    # the whole graph, in this process
    full = {n: t.clone().requires_grad_() for n, t in (("q", x.q), ("k", x.k), ("v", x.v), *x.terms.items())}
    full_terms = {n: full[n] for n in x.terms}
    out_full, w_full = edge_attention(full["q"], full["k"], full["v"], g, return_weights=True, **full_terms, **kwargs)
    (out_full * x.grad_out).sum().backward()
    # this rank's shard
    shard = partition(g, world, method=case.method)[rank]
    exchange = HaloExchange(shard)
    src_rows = shard.src_nodes
    mine = {
        "q": x.q[shard.nodes].clone().requires_grad_(),
        "k": x.k[src_rows].clone().requires_grad_(),
        "v": x.v[src_rows].clone().requires_grad_(),
    }
    terms = {n: t[shard.edge_ids].clone().requires_grad_() for n, t in x.terms.items()}
    out, w = sharded_edge_attention(mine["q"], mine["k"], mine["v"], exchange, return_weights=True, **terms, **kwargs)
    fwd_sent, fwd_received = exchange.rows_sent, exchange.rows_received
    (out * x.grad_out[shard.nodes]).sum().backward()
    errors = {
        "out": max_err(out, out_full[shard.nodes]),
        "weights": max_err(w, w_full[shard.edge_ids]),
        "q": max_err(mine["q"].grad, full["q"].grad[shard.nodes]),
        "k": max_err(mine["k"].grad, full["k"].grad[src_rows]),
        "v": max_err(mine["v"].grad, full["v"].grad[src_rows]),
    }
    for n, t in terms.items():
        errors[n] = max_err(t.grad, full[n].grad[shard.edge_ids])
    halo = expected_halo(g, shard.nodes, src_rows)
    return {
        "errors": errors,
        "fwd_rows_sent": fwd_sent,
        "fwd_rows_received": fwd_received,
        "bwd_rows_sent": exchange.rows_sent - fwd_sent,
        "halo_size": shard.halo_size,
        "expected_halo_size": len(halo),
        "halo_matches": set(shard.halo.tolist()) == halo,
        "nodes": shard.nodes.numel(),
        "edges": shard.graph.num_edges,
    }


def local_shard_check(rank: int, world: int) -> dict:
    """local_shard from each rank's own in-edges (ranges= and owner=) against partition's shard."""
    result = {}
    for name in ("window", "power_law"):
        g = build_graph(name, world)
        ref = partition(g, world)[rank]
        owner = torch.repeat_interleave(
            torch.arange(world), torch.tensor([s.nodes.numel() for s in partition(g, world)])
        )
        ranges = [0] + torch.cumsum(torch.bincount(owner, minlength=world), 0).tolist()
        mine = g.edge_index[:, ref.edge_ids]
        # as users hold an index: int32, or (E, 2) pairs viewed as (2, E)
        for how, index, kw in (
            ("ranges", mine, dict(ranges=ranges)),
            ("owner", mine, dict(owner=owner)),
            ("ranges-int32", mine.int(), dict(ranges=ranges)),
            ("owner-transposed", mine.t().contiguous().t(), dict(owner=owner)),
        ):
            s = local_shard(index, **kw)
            result[f"{name}-{how}"] = all(
                [
                    torch.equal(s.nodes, ref.nodes),
                    torch.equal(s.halo, ref.halo),
                    torch.equal(s.send_index, ref.send_index),
                    s.send_counts == ref.send_counts,
                    s.recv_counts == ref.recv_counts,
                    torch.equal(s.graph.edge_index, ref.graph.edge_index),
                ]
            )
    return result


class Net(torch.nn.Module):
    """Two EdgeAttention layers with residuals and a linear head (self-attention)."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(EdgeAttention(width, heads) for _ in range(2))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, graph) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.tanh(layer(x, graph))
        return self.head(x).squeeze(-1)


def training_check(rank: int, world: int) -> dict:
    """Three SGD steps with DDP on the parameters and sharded attention on the activations, against
    the same steps in one process on the whole graph: the parameters after each step."""
    g = power_law(50, 300, seed=5)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(g.num_dst, 8, generator=gen, dtype=torch.float64)
    y = torch.randn(g.num_dst, generator=gen, dtype=torch.float64)
    torch.manual_seed(0)
    single = Net().double()
    torch.manual_seed(0)
    model = Net().double()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    shard = partition(g, world, method="contiguous")[rank]
    exchange = HaloExchange(shard, group=dist.new_group())  # a group apart from DDP's all-reduces
    opt_single = torch.optim.SGD(single.parameters(), lr=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    worst = 0.0
    for _ in range(3):
        opt_single.zero_grad()
        ((single(x, g) - y) ** 2).mean().backward()
        opt_single.step()
        opt.zero_grad()
        # each rank's share of the global mean; DDP averages the ranks' gradients, so scale by world
        loss = ((ddp(x[shard.nodes], exchange) - y[shard.nodes]) ** 2).sum() / g.num_dst * world
        loss.backward()
        opt.step()
        worst = max(worst, max(max_err(a, b) for a, b in zip(single.parameters(), model.parameters())))
    return {"param_err": worst, "exchange_calls": exchange.calls}


def bipartite_module_check(rank: int, world: int) -> dict:
    """EdgeAttention cross attention (x_src given) on a bipartite graph's shard."""
    g = build_graph("bipartite", world)
    gen = torch.Generator().manual_seed(11)
    x_dst = torch.randn(g.num_dst, 8, generator=gen, dtype=torch.float64)
    x_src = torch.randn(g.num_src, 6, generator=gen, dtype=torch.float64)
    torch.manual_seed(0)
    attn = EdgeAttention(8, 2, kdim=6, vdim=6, clamp=None).double()
    full = attn(x_dst, g, x_src)
    shard = partition(g, world)[rank]
    out = attn(x_dst[shard.nodes], shard, x_src[shard.src_nodes])
    return {"err": max_err(out, full[shard.nodes])}


def wrong_shard_check(rank: int, world: int) -> dict:
    """A shard of another rank is refused on every rank, before any collective."""
    g = build_graph("window", world)
    shard = partition(g, world)[(rank + 1) % world]
    q = torch.randn(shard.nodes.numel(), 2, 4, dtype=torch.float64)
    try:
        sharded_edge_attention(q, q, q, shard)
    except ValueError as e:
        return {"message": str(e)}
    return {"message": None}


def halo_rows_check(rank: int, world: int) -> dict:
    """HaloExchange(x) alone: the rows received are the halo's (x holds each node's global id), and
    backward gives each owned row the number of ranks it was sent to."""
    g = build_graph("power_law", world)
    shard = partition(g, world)[rank]
    x = shard.nodes.double().unsqueeze(1).repeat(1, 3).requires_grad_()
    (halo,) = HaloExchange(shard)(x)
    halo.sum().backward()
    assert x.grad is not None
    sent_to = torch.bincount(shard.send_index, minlength=shard.nodes.numel()).double()
    return {
        "ids": bool(torch.equal(halo[:, 0].long(), shard.halo)) and bool((halo[:, 1:] == halo[:, :1]).all()),
        "grad": bool(torch.equal(x.grad, sent_to.unsqueeze(1).expand(-1, 3))),
        "halo_size": shard.halo_size,
    }


def run_all(rank: int, world: int, names: Optional[List[str]] = None) -> dict:
    """Every check on this rank; of the cases, those named in `names` (all by default)."""
    return {
        "cases": {
            case.name: run_case(case, rank, world) for case in all_cases() if names is None or case.name in names
        },
        "local_shard": local_shard_check(rank, world),
        "training": training_check(rank, world),
        "bipartite_module": bipartite_module_check(rank, world),
        "wrong_shard": wrong_shard_check(rank, world),
        "halo_rows": halo_rows_check(rank, world),
    }
