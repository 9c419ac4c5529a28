"""Checkpoints: atomic writes, safe loads and RNG state capture/restore.

A checkpoint is a dict saved with torch.save; trainer.py writes keys version, config, model,
optimizer, scheduler, rng, position, task_state, history, train_seconds, run_id (which run of
the run folder it belongs to, run_folder.py), and ema (the weight averages, ema.py) when
ema_decay > 0; `save_atomic` adds `checksum`, a SHA-256 of every tensor in it (dtype, shape and
bytes, in key order), which `load` verifies. Everything in it is tensors and plain Python values,
so it loads with `torch.load(weights_only=True)`: a crafted file cannot run code. Files that are
not checkpoints (truncated, empty, another format, another dict, tensors whose bytes changed since
they were saved) fail with one line naming them.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, Union

import numpy as np
import torch

REQUIRED_KEYS = ("config", "model")
# what loading a malformed entry raises (a wrong type, shape or key deep inside a state dict)
MALFORMED = (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError)


def first_line(e: BaseException) -> str:
    """An exception's message as one line (its first), or its type's name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_weights(model: torch.nn.Module, weights: Any, path: Union[str, Path], strict: bool = True) -> None:
    """model.load_state_dict(weights); its multi-line complaint (missing keys, shapes) as one
    ValueError naming the file `path` they came from."""
    try:
        model.load_state_dict(weights, strict=strict)
    except MALFORMED as e:
        reasons = [line.strip() for line in str(e).splitlines()[1:] if line.strip()] or [first_line(e)]
        raise ValueError(
            f"{path} does not hold weights of the model its config describes: {'; '.join(reasons)[:300]}"
        ) from None


def tensor_checksum(obj: Any) -> str:
    """SHA-256 hex digest of every tensor in obj (nested dicts, lists and tuples, dict keys in sorted
    order): each tensor's path, dtype, shape and bytes. Plain values are not hashed: a corruption
    there fails unpickling or the entry's own checks."""
    digest = hashlib.sha256()

    def visit(x: Any, where: str) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            digest.update(f"{where}:{t.dtype}:{tuple(t.shape)};".encode())
            if t.numel():
                digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for key in sorted(x, key=repr):
                visit(x[key], f"{where}/{key!r}")
        elif isinstance(x, (list, tuple)):
            for i, item in enumerate(x):
                visit(item, f"{where}/{i}")

    visit(obj, "")
    return digest.hexdigest()


def save_atomic(obj: Any, path: Union[str, Path]) -> None:
    """torch.save to a temp file in the same folder, then os.replace: a reader (or a crash)
    sees the old file or the new one, never half of one. A failed write (a full disk) raises
    OSError naming the file and leaves the old one in place. A dict gets a `checksum` entry
    (`tensor_checksum` of the rest), which `load` verifies."""
    path = Path(path)
    if isinstance(obj, dict):
        obj = {**{k: v for k, v in obj.items() if k != "checksum"}, "checksum": None}
        obj["checksum"] = tensor_checksum({k: v for k, v in obj.items() if k != "checksum"})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError)) and not isinstance(e, FileNotFoundError):
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
            raise OSError(f"could not write {path} ({reason}); the previous {path.name}, if any, is intact") from None
        raise


def remove_stale_temps(path: Union[str, Path]) -> int:
    """Delete the temp files a killed `save_atomic` of `path` left behind; returns how many."""
    path = Path(path)
    stale = list(path.parent.glob(path.name + ".*.tmp")) if path.parent.is_dir() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return len(stale)


def _numpy_globals() -> list:
    """The numpy types a checkpoint written before RNG states were stored as tensors holds."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load(path: Union[str, Path], map_location: Union[str, torch.device] = "cpu") -> Dict[str, Any]:
    """The checkpoint dict at `path`, loaded without running code from it. FileNotFoundError
    or ValueError with one line naming the file when it is missing or not a checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with torch.serialization.safe_globals(_numpy_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's note on a pickle protocol it did not write
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # whatever the unpickler trips on, the file is not a checkpoint we can read
        first = first_line(e)
        if first.startswith("Weights only load failed"):
            first = "it holds Python objects other than tensors and plain values; they are not loaded"
        raise ValueError(f"{path} is not a readable sparseattn checkpoint ({first[:200]})") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise ValueError(
            f"{path} is not a sparseattn checkpoint (a dict with keys {', '.join(REQUIRED_KEYS)} is expected)"
        )
    saved = state.pop("checksum", None)  # absent from checkpoints written before checksums
    if saved is not None and saved != tensor_checksum(state):
        raise ValueError(
            f"{path} is corrupted: its tensors do not match the checksum saved with them (the file changed "
            "after it was written: a disk or copy error)"
        )
    return state


def peek(path: Union[str, Path], key: str) -> Any:
    """The plain value (a str, number, ...) saved under `key` in the checkpoint at `path`, read
    without reading its tensors (they are mapped, not loaded) or verifying its checksum; None when
    the file has no such entry or is not a checkpoint (`load` then says what is wrong with it)."""
    try:
        with torch.serialization.safe_globals(_numpy_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a legacy (non-zip) file cannot be mapped; a damaged one is load's to name
        return None
    value = state.get(key) if isinstance(state, dict) else None
    return None if isinstance(value, torch.Tensor) else value


def non_finite(tensors: Iterable[Any]) -> bool:
    """True when any float tensor among `tensors` (nested dicts/lists searched) holds NaN or inf."""
    for t in tensors:
        if isinstance(t, dict):
            if non_finite(t.values()):
                return True
        elif isinstance(t, (list, tuple)):
            if non_finite(t):
                return True
        elif isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return True
    return False


def rng_state() -> Dict[str, Any]:
    """Every RNG a training step may draw from: torch (CPU and CUDA), numpy, random, as tensors
    and plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what `rng_state` saved; its tensors may have been loaded onto a GPU (torch wants the
    generator states as CPU byte tensors)."""
    torch.set_rng_state(state["torch"].cpu())
    npy = state["numpy"]
    if isinstance(npy, dict):
        np.random.set_state(
            (npy["kind"], npy["keys"].cpu().numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["gauss"])
        )
    else:  # a numpy state tuple, as older checkpoints stored it
        np.random.set_state(npy)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"][: torch.cuda.device_count()]  # a run resumed on fewer GPUs
        torch.cuda.set_rng_state_all([s.cpu() for s in states])
