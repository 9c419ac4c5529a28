"""Run a function on N gloo processes on this machine, bounded in time, and collect what each rank returns."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable[[int, int], Any]) -> None:
    if not torch.cuda.is_available():  # triton kernels run in the interpreter (read when they are defined)
        os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        result = fn(rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def run_ranks(fn: Callable[[int, int], Any], world: int, timeout: float = 600.0) -> List[Any]:
    """fn(rank, world) on `world` spawned processes joined in a gloo group; their return values, by
    rank. A process that fails or a run past `timeout` seconds raises (the processes are killed)."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _entry, args=(world, _free_port(), out_dir, fn), nprocs=world, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} gloo processes ran past {timeout:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results: Dict[int, Any] = {}
        for rank in range(world):
            results[rank] = torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False)
    return [results[r] for r in range(world)]
