"""Comparison helpers for tests/nn: absolute tolerances per dtype, and the largest error seen per
(what, dtype), printed at the end of the run (conftest.py)."""

from typing import Dict, Tuple

import torch

ATOL = {torch.float64: 1e-9, torch.float32: 1e-5}
MAX_ERR: Dict[Tuple[str, str], float] = {}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, kind: str = "") -> float:
    """max |actual - expected| <= ATOL[dtype]; records it under (kind or what, dtype)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    key = (kind or what, str(dtype).replace("torch.", ""))
    MAX_ERR[key] = max(MAX_ERR.get(key, 0.0), err)
    assert err <= ATOL[dtype], f"{what} ({dtype}): max |err| {err:.3g} > {ATOL[dtype]:.0e}"
    return err


def grads_of(loss: torch.Tensor, tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """d loss / d tensor for each named tensor (zeros where the loss does not depend on it)."""
    names = list(tensors)
    got = torch.autograd.grad(loss, [tensors[n] for n in names], allow_unused=True)
    return {n: torch.zeros_like(tensors[n]) if g is None else g for n, g in zip(names, got)}
