"""WeightEMA: an exponential moving average of a model's parameters, for evaluation.

After each optimizer step, avg <- d * avg + (1 - d) * weight with d = min(decay, n / (n + 1)) at
update n (from 0): the plain mean of all weights so far until n reaches 1 / (1 - decay), then an
exponential average over about the last 1 / (1 - decay) steps. The initial weights never count.
Averaging the weights of a noisy small-batch run smooths the step noise out.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, Optional

import torch
from torch import Tensor, nn


class WeightEMA:
    """Averages of `model`'s parameters (tied parameters once), updated by `update()`."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay}")
        self.decay, self.num_updates = decay, 0
        self.params: Dict[str, nn.Parameter] = dict(model.named_parameters())
        self.average: Dict[str, Tensor] = {k: p.detach().clone() for k, p in self.params.items()}

    def current_decay(self) -> float:
        return min(self.decay, self.num_updates / (self.num_updates + 1))

    @torch.no_grad()
    def update(self) -> None:
        keys = list(self.params)
        torch._foreach_lerp_(
            [self.average[k] for k in keys], [self.params[k].detach() for k in keys], 1.0 - self.current_decay()
        )
        self.num_updates += 1

    @torch.no_grad()
    def copy_to_model(self, weights: Optional[Dict[str, Tensor]] = None) -> None:
        """Overwrite the model's parameters with `weights` (default: the averages)."""
        weights = self.average if weights is None else weights
        for k, p in self.params.items():
            p.copy_(weights[k])

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block and its own weights again after."""
        saved = {k: p.detach().clone() for k, p in self.params.items()}
        self.copy_to_model()
        try:
            yield
        finally:
            self.copy_to_model(saved)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates, "average": dict(self.average)}

    def load_state_dict(self, state: dict) -> None:
        if state["average"].keys() != self.average.keys():
            raise ValueError("ema state does not match the model's parameters")
        self.num_updates = int(state["num_updates"])
        for k, v in state["average"].items():
            self.average[k].copy_(v)
