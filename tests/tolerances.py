"""Tolerances: float64/float32 absolute bounds; half types measured against the reference's own error."""

import torch

ATOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def assert_close(actual, expected, dtype, what=""):
    actual, expected = actual.double(), expected.double()
    err = (actual - expected).abs().max().item() if actual.numel() else 0.0
    scale = max(1.0, expected.abs().max().item() if expected.numel() else 0.0)
    assert err <= ATOL[dtype] * scale, f"{what}: max |err| {err:.3g} > {ATOL[dtype] * scale:.3g}"


def assert_within_reference_error(out, ref_same_dtype, gold, factor=2.0, what=""):
    """A half-precision result may be off from the float64 gold by at most `factor` times the
    error of the reference backend run in the same dtype (plus a small floor)."""
    gold = gold.double()
    if gold.numel() == 0:
        return
    # floor: one rounding unit of the dtype at the result's magnitude (the final cast alone can cost
    # that much, and the reference may happen to round to the closer neighbour), at least 1e-3
    floor = max(1e-3, torch.finfo(out.dtype).eps) * max(1.0, gold.abs().max().item())
    budget = factor * (ref_same_dtype.double() - gold).abs().max().item() + floor
    err = (out.double() - gold).abs().max().item()
    assert err <= budget, f"{what}: max |err| {err:.3g} exceeds {factor}x reference error ({budget:.3g})"
