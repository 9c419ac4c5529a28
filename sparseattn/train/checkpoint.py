"""Checkpoints: atomic writes (temp file + os.replace) and RNG state capture/restore.

A checkpoint is a dict saved with torch.save; train.py writes keys config, model_name,
model_kwargs, model, optimizer, scheduler, rng, position, task_state, history, and ema (the
weight averages, ema.py) when ema_decay > 0.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any, Dict, Union

import numpy as np
import torch


def save_atomic(obj: Any, path: Union[str, Path]) -> None:
    """torch.save to a temp file in the same folder, then os.replace: a reader (or a crash)
    sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load(path: Union[str, Path], map_location: Union[str, torch.device] = "cpu") -> Dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location=map_location, weights_only=False)


def rng_state() -> Dict[str, Any]:
    """Every RNG a training step may draw from: torch (CPU and CUDA), numpy, random."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
