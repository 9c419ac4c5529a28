"""Multi-process training under torchrun: `torchrun --nproc_per_node=N -m sparseattn train ...`.

DistributedDataParallel with gloo on CPU and nccl on CUDA (one GPU per LOCAL_RANK). Design:
- Every rank builds the same global batch list for an epoch (a function of seed and epoch), groups
  it into steps of N consecutive batches, and rank r takes batch r of each step; a last group of
  fewer than N batches is dropped. So N ranks with per-rank batches of B sentences (or max_tokens
  tokens) take the same steps as one process whose batch is the union of the N rank batches.
- The loss is the per-token mean over that global batch: each rank scales its summed loss by
  N / (tokens on all ranks) (an all_reduce of the token count), and DDP's gradient average
  divides by N again. `global_batches` builds the equivalent single-process batch list
  (tests/test_distributed.py checks the parameters match).
- Rank 0 alone writes checkpoints, metrics, tokenizer and results and runs the per-epoch
  validation; all ranks load the same checkpoint on --resume. Logged train stats are rank 0's.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .trainer import Trainer


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def process_device(device: str, local_rank: int, local_procs: int, gpus: int) -> str:
    """The device of process `local_rank` of `local_procs` on a node with `gpus` GPUs: --device=auto
    takes cuda:<local_rank> only when every local process gets a GPU of its own, else cpu; cuda or
    cuda:N becomes cuda:<local_rank> (one GPU per process), a ValueError when there are too few."""
    if device == "auto":
        device = "cuda" if gpus >= local_procs else "cpu"
    if not device.startswith("cuda"):
        return device
    if local_rank >= gpus:
        raise ValueError(
            f"--device={device}: {local_procs} processes on this node but {gpus} GPU(s); "
            "start at most one process per GPU, or use --device=cpu"
        )
    return f"cuda:{local_rank}"


def init_from_env(cfg) -> None:
    """Join the process group torchrun describes in the environment (gloo on CPU, nccl on CUDA),
    on the device `process_device` gives this process."""
    run = cfg.run
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", str(local + 1)))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    run.device = process_device(run.device, local, local_procs, gpus)
    use_cuda = run.device.startswith("cuda")
    if use_cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")


def shard_batches(batches: Sequence[List[int]], rank: int, world_size: int) -> List[List[int]]:
    """Batch `rank` of each group of `world_size` consecutive batches (incomplete last group dropped)."""
    steps = len(batches) // world_size
    return [list(batches[s * world_size + rank]) for s in range(steps)]


def global_batches(batches: Sequence[List[int]], world_size: int) -> List[List[int]]:
    """The single-process batches equivalent to `world_size` ranks: each group's union, in rank order."""
    steps = len(batches) // world_size
    return [[i for r in range(world_size) for i in batches[s * world_size + r]] for s in range(steps)]


class DistributedTrainer(Trainer):
    """Trainer for one rank of a torchrun job (call init_from_env first)."""

    def __init__(self, cfg, resume: bool = False, staging=None) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.main_process = self.rank == 0
        super().__init__(cfg, resume=resume, staging=staging)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp: Optional[DistributedDataParallel] = DistributedDataParallel(self.model, device_ids=ids)

    def epoch_batches(self, epoch: int) -> list:
        return shard_batches(super().epoch_batches(epoch), self.rank, self.world_size)

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is true on any (so all ranks stop at the same step)."""
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def train_step(self, batch) -> dict:
        if self.ddp is None:
            raise RuntimeError("this rank's DDP wrapper was released (distributed.cleanup): it trains no more")
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss, stats = self.task.loss(self.ddp, batch, self.cfg)  # per-token mean of this rank's batch
        total = torch.tensor([float(stats["tokens"])], device=self.device)
        dist.all_reduce(total)
        (loss * (stats["tokens"] * self.world_size / total.item())).backward()  # DDP averages over ranks
        self.optimizer_step()
        return stats

    def release(self) -> None:
        """Drop the DistributedDataParallel wrapper, before `cleanup` destroys the process group.

        DDP's reducer holds the group from C++. Were it the last holder, the group's gloo worker
        threads would be joined from the reducer's destructor with the GIL held, while a worker
        finishing the last backward's all-reduce waits for the GIL to free what backward left in its
        thread state (a Python context): a deadlock at exit, one run in five on a loaded 2-core
        machine. Released here, the reducer is not the last holder, and destroy_process_group frees
        the group with the GIL released."""
        self.ddp = None  # its only holder: the wrapper and its reducer go now


def cleanup(trainer: Optional[Trainer] = None) -> None:
    """Release `trainer`'s DDP wrapper if it has one, then destroy the process group."""
    if isinstance(trainer, DistributedTrainer):
        trainer.release()
    if dist.is_initialized():
        dist.destroy_process_group()
