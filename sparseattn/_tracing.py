"""Whether code runs inside torch.compile's or torch.export's trace, and custom ops that eager code
calls as plain Python."""

from typing import Any, Callable, Optional

import torch

_FAKE = torch._C._TorchDispatchModeKey.FAKE


def tracing() -> bool:
    """True inside a torch.compile or torch.export trace, where a Python branch on tensor values
    would break the graph (or fail the export): such code takes a path that needs no look at the
    data. A fake-tensor mode counts too: AOTAutograd traces a backward under one, and there torch
    2.11's `is_compiling()` is False (the csr kernels' sparse tensors then failed to trace)."""
    return (
        torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch._C._get_dispatch_mode(_FAKE) is not None
    )


def exporting() -> bool:
    """True inside a torch.export trace (where code must keep to the library's custom ops)."""
    return torch.compiler.is_exporting()


def caching_in_trace() -> bool:
    """Inside a trace, whether values built from a graph may be cached on it: under torch.compile
    (dynamo replays the write after the compiled code runs, so the next call with that graph finds
    them; it compiles once more, for a graph that has them), not under torch.export (its trace
    holds fake tensors, which must not reach the caller's graph)."""
    return torch.compiler.is_dynamo_compiling() and not torch.compiler.is_exporting()


class TraceableOp:
    """A `torch.library` custom op (`.op`, what traces record and `opcheck` checks) whose eager calls
    run its Python function directly. Through the dispatcher, a custom op's first call imports
    torch._dynamo (about 1 s, the bulk of a fresh process's first attention call) and every call
    pays its argument handling; neither buys anything outside a trace."""

    def __init__(self, qualname: str, fn: Callable, schema: Optional[str] = None) -> None:
        self.fn, self.qualname = fn, qualname
        self.op = torch.library.custom_op(qualname, fn, mutates_args=(), schema=schema)
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any) -> Any:
        return self.op(*args) if tracing() else self.fn(*args)

    def register_fake(self, fake: Callable) -> Callable:
        """Register the op's shape function (as `CustomOpDef.register_fake`)."""
        return self.op.register_fake(fake)


def traceable_op(qualname: str) -> Callable[[Callable], TraceableOp]:
    """Decorator: `fn` as a `TraceableOp` named qualname, its schema read from fn's annotations."""
    return lambda fn: TraceableOp(qualname, fn)


__all__ = ["tracing", "exporting", "caching_in_trace", "TraceableOp", "traceable_op"]
