"""A model's training step captured in CUDA graphs (`torch.cuda.CUDAGraph`), one per batch, for
bench_layers --gps --device cuda's row "sparseattn GPS model (CUDA graph)": the step as a GPU user who
captures it runs it (no Python, no kernel launches of its own per replay)."""

from __future__ import annotations

from typing import Callable, List, Tuple

import torch
from torch import nn

from .molecules import step_inputs


def capture_steps(
    model: nn.Module, batches: list, lr: float = 1e-3, warmup: int = 3
) -> Tuple[Callable[[], None], float]:
    """One captured step (forward, MSE loss, backward, Adam(capturable=True)) per batch of `batches`
    (PyG Batches on a CUDA device, x, edge_index, edge_attr, batch, y), after `warmup` eager steps of
    each on a side stream and one more under torch.cuda.set_sync_debug_mode("error") (a host read
    raises there, naming its op). Returns (epoch: replays every batch's graph once, the relative
    difference between the first graph's loss and an eager forward's at the same parameters)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
    statics = [(*step_inputs(b), b.y.clone()) for b in batches]  # the captured steps read these tensors

    def step(inputs: tuple) -> torch.Tensor:
        *args, y = inputs
        loss = nn.functional.mse_loss(model(*args), y)
        opt.zero_grad(set_to_none=False)  # the gradients keep their addresses across the graphs
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for inputs in statics:
            for _ in range(warmup):
                step(inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(statics[0])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graphs: List[torch.cuda.CUDAGraph] = []
    losses = []
    for inputs in statics:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            losses.append(step(inputs))
        graphs.append(graph)
    with torch.no_grad():
        *args, y = statics[0]
        expected = nn.functional.mse_loss(model(*args), y).item()
    graphs[0].replay()
    torch.cuda.synchronize()
    err = abs(losses[0].item() - expected) / max(abs(expected), 1e-12)

    def epoch() -> None:
        for graph in graphs:
            graph.replay()

    return epoch, err


__all__ = ["capture_steps"]
