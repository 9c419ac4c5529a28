"""Whether code runs inside torch.compile's or torch.export's trace."""

import torch


def tracing() -> bool:
    """True inside a torch.compile or torch.export trace, where a Python branch on tensor values
    would break the graph (or fail the export): such code takes a path that needs no look at the
    data."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def caching_in_trace() -> bool:
    """Inside a trace, whether values built from a graph may be cached on it: under torch.compile
    (dynamo replays the write after the compiled code runs, so the next call with that graph finds
    them; it compiles once more, for a graph that has them), not under torch.export (its trace
    holds fake tensors, which must not reach the caller's graph)."""
    return torch.compiler.is_dynamo_compiling() and not torch.compiler.is_exporting()


__all__ = ["tracing", "caching_in_trace"]
