"""`HostReads`: the ops of a block of code that read a tensor's values back to the host. On a GPU each
of them waits for the stream (what `torch.cuda.set_sync_debug_mode` reports) and none may run inside a
CUDA graph capture; on the CPU the same ops run, so a CPU test sees where a GPU step would stop."""

from __future__ import annotations

from typing import List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# ops whose result (or its shape) comes from the values of a tensor: CUDA reads them back
READING = {
    aten._local_scalar_dense.default,  # .item(), int(t), float(t), bool(t)
    aten.bincount.default,  # sizes its output by the largest id
    aten.nonzero.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.masked_select.default,
    aten.histc.default,
}


def _reads(func, args, kwargs) -> bool:
    if func in READING:
        return True
    if func is aten.repeat_interleave.Tensor:  # sized by the repeats' sum unless given output_size
        return (kwargs or {}).get("output_size") is None
    if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):  # a bool index is a nonzero
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
    return False


class HostReads(TorchDispatchMode):
    """Counts (`count`) and names (`ops`) the host reads of the code run under it: the ops in READING,
    repeat_interleave without output_size, indexing with a bool mask, and Tensor.tolist (which on the
    CPU does not pass through the dispatcher: counted by wrapping it while the mode is on)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[str] = []

    @property
    def count(self) -> int:
        return len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _reads(func, args, kwargs):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tolist = self._tolist = torch.Tensor.tolist

        def counted(t, *args, **kwargs):
            self.ops.append("Tensor.tolist")
            return tolist(t, *args, **kwargs)

        torch.Tensor.tolist = counted  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
        return super().__exit__(*exc)
