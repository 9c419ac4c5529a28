"""Node classification on a kNN graph of scikit-learn's bundled digits (no download): each of the
1797 8x8 images is a node with its 64 pixels as features, edges come from its k nearest neighbours
with distance features, and the class is the digit. The same two-layer TransformerConv model is
trained with sparseattn.nn.TransformerConv and with PyG's (same initial state dict, same seeds),
side by side.

    python examples/node_classification.py                  # 100 epochs
    python examples/node_classification.py --small          # a few seconds
    python examples/node_classification.py --epochs 50 --threads 2 --seed 1
"""

from __future__ import annotations

from typing import Dict, Union

import torch
import torch.nn.functional as F
from _common import Contender, accuracy, import_pyg_conv, parse_args, run_side_by_side, seed_everything
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestNeighbors
from torch import Tensor, nn

import sparseattn
from sparseattn.nn import TransformerConv


def digits_graph(k: int, num_nodes: int, seed: int) -> Dict[str, Tensor]:
    """x (N, 64) standardized pixels, y (N,) digits, edge_index (2, E) from each node's k nearest
    neighbours (sources) into it (destination), edge_attr (E, 2) = [d / mean d, exp(-(d / mean d)^2)],
    and random 60/20/20 train/val/test masks."""
    data, target = load_digits(return_X_y=True)
    gen = torch.Generator().manual_seed(seed)
    keep = torch.randperm(len(target), generator=gen)[:num_nodes].sort().values
    x = torch.tensor(data, dtype=torch.float32)[keep]
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    dist, nbr = NearestNeighbors(n_neighbors=k + 1).fit(x.numpy()).kneighbors(x.numpy())
    dist, nbr = torch.tensor(dist[:, 1:], dtype=torch.float32), torch.tensor(nbr[:, 1:])  # drop self
    n = x.shape[0]
    edge_index = torch.stack([nbr.reshape(-1), torch.arange(n).repeat_interleave(k)])  # destination-major
    d = dist.reshape(-1, 1) / dist.mean()
    order = torch.randperm(n, generator=gen)
    split = {"train": order[: int(0.6 * n)], "val": order[int(0.6 * n) : int(0.8 * n)], "test": order[int(0.8 * n) :]}
    return dict(
        x=x,
        y=torch.tensor(target)[keep],
        edge_index=edge_index,
        edge_attr=torch.cat([d, torch.exp(-(d**2))], 1),
        **split,
    )


class Net(nn.Module):
    """conv(64 -> heads x hidden) -> ELU -> dropout -> conv(-> 10 classes, heads averaged)."""

    def __init__(self, conv: type, in_dim: int, hidden: int, heads: int, num_classes: int, edge_dim: int) -> None:
        super().__init__()
        self.conv1 = conv(in_dim, hidden, heads=heads, edge_dim=edge_dim)
        self.conv2 = conv(hidden * heads, num_classes, heads=heads, concat=False, edge_dim=edge_dim)

    def forward(self, x: Tensor, edge_index: Union[Tensor, sparseattn.Graph], edge_attr: Tensor) -> Tensor:
        h = F.dropout(F.elu(self.conv1(x, edge_index, edge_attr)), p=0.3, training=self.training)
        return self.conv2(h, edge_index, edge_attr)


def contender(name: str, model: Net, data: Dict[str, Tensor], edges: Union[Tensor, sparseattn.Graph]) -> Contender:
    """Full-batch training: one optimizer step per epoch on the training nodes."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def step() -> float:
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(data["x"], edges, data["edge_attr"])[data["train"]], data["y"][data["train"]])
        loss.backward()
        opt.step()
        return loss.item()

    def evaluate(split: str) -> float:
        model.eval()
        logits = model(data["x"], edges, data["edge_attr"])
        return accuracy(logits[data[split]], data["y"][data[split]])

    return Contender(name, step, evaluate, step)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_epochs=100)
    seed_everything(args.seed)
    k, num_nodes, hidden, heads = (6, 200, 8, 2) if args.small else (10, 1797, 16, 4)
    epochs = min(args.epochs, 3) if args.small else args.epochs
    data = digits_graph(k, num_nodes, args.seed)
    n, e = data["x"].shape[0], data["edge_index"].shape[1]
    print(f"digits kNN graph: {n} nodes, {e} edges (k={k}), 10 classes, {args.threads} thread(s), {epochs} epochs")
    # a Graph built once: its CSR is cached across layers and epochs
    graph = sparseattn.Graph(data["edge_index"], num_src=n, num_dst=n)
    q = torch.empty(n, heads, hidden)
    print(f"sparseattn backend: {sparseattn.kernels.choose_auto(q, graph, edge_terms=True)} (auto, with edge features)")

    def build(conv: type) -> Net:
        return Net(conv, data["x"].shape[1], hidden, heads, 10, edge_dim=2)

    ours = build(TransformerConv)
    contenders = [contender("sparseattn", ours, data, graph)]
    pyg_conv = import_pyg_conv()
    if pyg_conv is not None:
        theirs = build(pyg_conv)
        theirs.load_state_dict(ours.state_dict())  # the same initial weights
        contenders.append(contender("pyg", theirs, data, data["edge_index"]))
    run_side_by_side(contenders, epochs, args.seed)


if __name__ == "__main__":
    main()
