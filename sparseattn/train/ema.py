"""WeightEMA: an exponential moving average of a model's parameters, for evaluation.

A `torch.optim.swa_utils.AveragedModel` whose update n (from 0) computes
avg <- d_n * avg + (1 - d_n) * weight with d_n = min(decay, n / (n + 1)): the plain mean of all
weights so far until n reaches 1 / (1 - decay), then an exponential average over about the last
1 / (1 - decay) steps. Update 0 copies the weights, so the initial weights never count. Averaging
the weights of a noisy small-batch run smooths the step noise out.

Checkpoints hold {"decay", "num_updates", "average": {parameter name: tensor}}, the format of the
WeightEMA that predates AveragedModel, so checkpoints of either load with either.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Union

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

MultiAvgFn = Callable[[List[Tensor], List[Tensor], Union[Tensor, int]], None]


def warmed_up_ema(decay: float) -> MultiAvgFn:
    """AveragedModel's multi_avg_fn for avg <- d * avg + (1 - d) * weight with
    d = min(decay, n / (n + 1)), n the number of updates before this one."""

    @torch.no_grad()
    def update(average: List[Tensor], weights: List[Tensor], num_averaged: Union[Tensor, int]) -> None:
        n = int(num_averaged)
        torch._foreach_lerp_(average, weights, 1.0 - min(decay, n / (n + 1)))

    return update


class WeightEMA(AveragedModel):
    """The moving average (see the module docstring) of `model`'s parameters, tied ones once, in
    `self.module`: a copy of `model`, the one to evaluate. `update_parameters(model)` after each
    optimizer step adds the current weights; buffers are copied from `model` at each update, not
    averaged."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got decay={decay}")
        super().__init__(model, multi_avg_fn=warmed_up_ema(decay))
        self.module.requires_grad_(False)
        self.decay = decay

    @property
    def num_updates(self) -> int:
        return int(self.n_averaged)

    def average(self) -> Dict[str, Tensor]:
        """{parameter name: its average}, tied parameters under their first name."""
        return {k: p.detach() for k, p in self.module.named_parameters()}

    def checkpoint_state(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates, "average": self.average()}

    @torch.no_grad()
    def load_checkpoint_state(self, state: dict) -> None:
        """Continue from `checkpoint_state()`'s dict (also the one the pre-AveragedModel WeightEMA
        wrote); its decay is the one the run was configured with, not read back."""
        average = self.average()
        if state["average"].keys() != average.keys():
            raise ValueError("ema state does not match the model's parameters")
        for k, v in state["average"].items():
            average[k].copy_(v)
        self.n_averaged.fill_(int(state["num_updates"]))
