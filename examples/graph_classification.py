"""Graph classification on networkx's graph atlas (every graph with 1 to 7 nodes, bundled, no
download): predict a graph's triangle count class (0-1, 2-4, 5 or more) from one-hot node degrees.
Graphs are batched PyG-style (features stacked, edge ids shifted, a batch vector). A GraphGPS-style
model (two TransformerConv layers, global attention within each graph, mean pooling) is trained
with sparseattn.nn (TransformerConv, GlobalAttention: no padding) and with PyG's TransformerConv
plus GraphGPS's to_dense_batch + nn.MultiheadAttention (same initial state dict, same seeds).

    python examples/graph_classification.py                 # 30 epochs
    python examples/graph_classification.py --small         # a few seconds
    python examples/graph_classification.py --epochs 10 --threads 2 --seed 1
"""

from __future__ import annotations

from typing import Callable, Dict, List, Union

import networkx as nx
import torch
import torch.nn.functional as F
from _common import (
    Contender,
    accuracy,
    import_pyg_conv,
    minibatch_training,
    parse_args,
    run_side_by_side,
    seed_everything,
)
from torch import Tensor, nn

import sparseattn
from sparseattn.nn import GlobalAttention, TransformerConv, complete_per_graph

MAX_DEGREE = 6  # atlas graphs have at most 7 nodes


def atlas_graphs() -> List[Dict[str, Tensor]]:
    """Each non-empty atlas graph: x (n, 7) one-hot degree, edge_index (2, 2m) both directions,
    y the triangle count class."""
    out = []
    for g in nx.graph_atlas_g()[1:]:  # the first graph has no nodes
        degree = torch.tensor([d for _, d in sorted(g.degree())])
        edges = torch.tensor(list(g.edges()), dtype=torch.long).reshape(-1, 2).t()
        triangles = sum(nx.triangles(g).values()) // 3
        out.append(
            dict(
                x=F.one_hot(degree, MAX_DEGREE + 1).float(),
                edge_index=torch.cat([edges, edges.flip(0)], dim=1),
                y=torch.tensor(0 if triangles <= 1 else 1 if triangles <= 4 else 2),
            )
        )
    return out


def collate(graphs: List[Dict[str, Tensor]]) -> Dict[str, object]:
    """PyG-style batch: x (N, 7), edge_index (2, E) with ids shifted per graph, batch (N,), ptr
    (B + 1,), y (B,), and the sparseattn graphs built once per batch (local edges; complete per graph)."""
    sizes = torch.tensor([g["x"].shape[0] for g in graphs])
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    edge_index = torch.cat([g["edge_index"] + p for g, p in zip(graphs, ptr[:-1].tolist())], dim=1)
    n = int(ptr[-1])
    return dict(
        x=torch.cat([g["x"] for g in graphs]),
        edge_index=edge_index,
        batch=torch.repeat_interleave(torch.arange(len(graphs)), sizes),
        y=torch.stack([g["y"] for g in graphs]),
        local=sparseattn.Graph(edge_index, num_src=n, num_dst=n),
        complete=complete_per_graph(ptr=ptr),
    )


class PaddedGlobalAttention(nn.MultiheadAttention):
    """GraphGPS's global attention: pad each graph (to_dense_batch), attend with a key padding mask."""

    def forward(self, x: Tensor, batch: Tensor) -> Tensor:  # type: ignore[override]
        from torch_geometric.utils import to_dense_batch

        dense, mask = to_dense_batch(x, batch)  # (B, L_max, C), (B, L_max)
        return super().forward(dense, dense, dense, key_padding_mask=~mask, need_weights=False)[0][mask]


class Net(nn.Module):
    """Two residual layers h = norm(h + relu(conv(h)) + attention(h)), mean pooling per graph, a
    linear classifier. conv: a TransformerConv class; attention(width, heads): a global attention
    module with nn.MultiheadAttention's parameters."""

    def __init__(self, conv: type, attention: Callable[[int, int], nn.Module], hidden: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Linear(MAX_DEGREE + 1, hidden)
        self.convs = nn.ModuleList(conv(hidden, hidden // heads, heads=heads) for _ in range(2))
        self.attns = nn.ModuleList(attention(hidden, heads) for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(2))
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: Tensor, edges: Union[Tensor, sparseattn.Graph], batch: Tensor, attn_kw: Dict) -> Tensor:
        """x (N, 7), edges (2, E) or Graph, batch (N,); attn_kw: what the attention takes besides x."""
        h = self.embed(x)
        for conv, attn, norm in zip(self.convs, self.attns, self.norms):
            h = norm(h + F.relu(conv(h, edges)) + attn(h, **attn_kw))
        sums = torch.zeros(int(batch[-1]) + 1, h.shape[1]).index_add_(0, batch, h)
        return self.head(sums / torch.bincount(batch)[:, None])  # (B, 3)


def contender(name: str, model: Net, batches: Dict[str, List[Dict]], sparse: bool) -> Contender:
    """Minibatch training over the shuffled training batches; the sparseattn model takes the
    prebuilt Graphs, the PyG one the edge index and batch vector."""
    opt = torch.optim.Adam(model.parameters(), lr=0.005)

    def logits(b: Dict) -> Tensor:
        if sparse:
            return model(b["x"], b["local"], b["batch"], {"graph": b["complete"]})
        return model(b["x"], b["edge_index"], b["batch"], {"batch": b["batch"]})

    step, train_epoch = minibatch_training(model, opt, batches, lambda b: F.cross_entropy(logits(b), b["y"]))

    def evaluate(split: str) -> float:
        model.eval()
        correct = sum(accuracy(logits(b), b["y"]) * len(b["y"]) for b in batches[split])
        return correct / sum(len(b["y"]) for b in batches[split])

    return Contender(name, train_epoch, evaluate, step)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_epochs=30)
    seed_everything(args.seed)
    num_graphs, batch_size, hidden, heads = (150, 32, 8, 2) if args.small else (1252, 64, 32, 4)
    epochs = min(args.epochs, 2) if args.small else args.epochs
    graphs = atlas_graphs()
    order = torch.randperm(len(graphs), generator=torch.Generator().manual_seed(args.seed))[:num_graphs].tolist()
    n = len(order)
    parts = {"train": order[: int(0.7 * n)], "val": order[int(0.7 * n) : int(0.85 * n)], "test": order[int(0.85 * n) :]}
    batches = {
        split: [collate([graphs[i] for i in ids[j : j + batch_size]]) for j in range(0, len(ids), batch_size)]
        for split, ids in parts.items()
    }
    print(
        f"graph atlas: {n} graphs (1-7 nodes), triangle-count classes, batches of {batch_size}, "
        f"{args.threads} thread(s), {epochs} epochs"
    )
    b0 = batches["train"][0]
    q = torch.empty(b0["x"].shape[0], heads, hidden // heads)
    print(
        f"sparseattn backends (auto): local {sparseattn.kernels.choose_auto(q, b0['local'])}, "
        f"global {sparseattn.kernels.choose_auto(q, b0['complete'])} on the first batch"
    )
    ours = Net(TransformerConv, GlobalAttention, hidden, heads)
    contenders = [contender("sparseattn", ours, batches, sparse=True)]
    pyg_conv = import_pyg_conv()
    if pyg_conv is not None:
        theirs = Net(pyg_conv, lambda width, h: PaddedGlobalAttention(width, h, batch_first=True), hidden, heads)
        theirs.load_state_dict(ours.state_dict())  # the same initial weights
        contenders.append(contender("pyg", theirs, batches, sparse=False))
    run_side_by_side(contenders, epochs, args.seed)


if __name__ == "__main__":
    main()
