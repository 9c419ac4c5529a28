"""Large CPU buffers on transparent huge pages, for the kernels' own outputs and scratch.

A CPU tensor of glibc's largest mmap threshold (32 MiB) or more is a fresh anonymous mapping each
time, whose 4 KiB pages fault in one by one at its first write: a 100 MB buffer took 82 ms to
allocate and fill against 10.5 ms to fill again (1 thread). On 2 MiB transparent huge pages the
same buffer faults 512 times less often and took 14.7 ms. torch does this for all its allocations
when THP_MEM_ALLOC_ENABLE=1 is set before it starts; `empty` and `zeros` do it for the buffers the
kernels allocate themselves, in any process: an anonymous mapping from Python's mmap module,
advised MADV_HUGEPAGE and viewed by `torch.frombuffer`, which keeps the mapping alive as long as
the tensor's storage. A fresh mapping reads as zeros, so `zeros` costs no fill.

Used for CPU buffers of at least MIN_BYTES on Linux whose transparent huge pages are "always" or
"madvise", unless the environment sets SPARSEATTN_HUGE_PAGES=0 or THP_MEM_ALLOC_ENABLE=1 (torch
then backs everything itself), or inside `huge_pages(False)`; elsewhere `torch.empty` and
`torch.zeros`. Below glibc's largest threshold its heap is reused, but not reliably: it trims and
re-grows its top and maps mid-sized blocks afresh, so that a fresh 12.8 MB gather took 89 ms
against 21 ms into a kept buffer in one process (1 thread, 50K rows of 8 x 64 floats). Such a
tensor is an ordinary tensor except that its storage cannot grow (`resize_` beyond it raises).
A mapping whose tensors are gone is kept for the next buffer of its size (up to POOL_BYTES of free
ones; `release` unmaps them). The mappings belong to a `BufferPool`; the module's functions are
those of `DEFAULT_POOL`, the one the kernels use.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, List, Optional, Sequence, Union

import torch
from torch import Tensor

HUGE_PAGE = 1 << 21
# Buffers from this size on come from the pool's mappings. glibc maps every allocation of 32 MiB or
# more afresh; below that its heap often does too (module docstring). Measured against 32 MiB, auto's
# fwd / fwd+bwd with 4 MiB (1 thread, interleaved, medians of 4): random 50K 381 -> 373 / 1403 -> 1276
# ms, kNN 50K shuffled 234 -> 218 / 657 -> 578, mesh 224 local 91 -> 82 / 412 -> 378, windows of 8K
# 22 -> 21 / 82 -> 75; peak memory up 1-3% on those (the 2 MiB rounding; +8 MiB on the windows).
MIN_BYTES = 4 << 20

Shape = Union[int, Sequence[int]]


@lru_cache(maxsize=None)
def huge_pages_available() -> bool:
    """Whether `empty` and `zeros` back large CPU buffers with huge pages in this process (module
    docstring). Read once."""
    if os.environ.get("SPARSEATTN_HUGE_PAGES", "1") == "0" or os.environ.get("THP_MEM_ALLOC_ENABLE") == "1":
        return False
    if not (hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS")):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


@dataclass
class _Mapping:
    """An anonymous mapping and the 2 MiB aligned bytes of it that tensors use."""

    block: mmap.mmap
    start: int
    capacity: int

    def in_use(self) -> bool:
        # a tensor's storage holds the block (torch.frombuffer took a buffer of it); free, the
        # references are the pool's and getrefcount's argument
        return sys.getrefcount(self.block) > 2


def _new_mapping(nbytes: int) -> _Mapping:
    block = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block.madvise(mmap.MADV_HUGEPAGE)
    address = torch.frombuffer(block, dtype=torch.uint8, count=1).data_ptr()
    return _Mapping(block, -address % HUGE_PAGE, nbytes)


# mappings are kept for reuse after their tensors are gone, up to POOL_BYTES of free ones: a fresh
# mapping faults its pages in again, and on a virtual machine whose host reclaims free memory that
# can cost several times the fill (2026-11-27, a 65K-token window's forward: 216 to 838 ms)
POOL_BYTES = 1 << 30


class BufferPool:
    """The huge-page mappings of large CPU buffers (module docstring): `empty`, `zeros`, `take` give
    tensors on them, keeping up to `capacity` bytes of mappings whose tensors are gone for reuse;
    `release` unmaps those; `huge_pages(False)` turns them off within a block. The kernels use
    `DEFAULT_POOL` (through the module's functions); a pool of its own is an object like any other
    (tests make one instead of resetting the default)."""

    def __init__(self, capacity: int = POOL_BYTES) -> None:
        self.capacity = capacity
        self.mappings: List[_Mapping] = []
        self.enabled = True
        self._lock = threading.Lock()

    def _reuse(self, nbytes: int) -> Optional[_Mapping]:
        """A free mapping of nbytes up to 1.25 * nbytes + 2 MiB (the smallest), or None; drops the
        oldest free ones beyond the capacity."""
        free = [m for m in self.mappings if not m.in_use()]
        fits = [m for m in free if nbytes <= m.capacity <= nbytes * 1.25 + HUGE_PAGE]
        found = min(fits, key=lambda m: m.capacity) if fits else None
        total = sum(m.capacity for m in free if m is not found)
        for m in free:  # oldest first
            if total <= self.capacity:
                break
            if m is not found:
                self.mappings.remove(m)
                total -= m.capacity
        return found

    def release(self) -> None:
        """Unmap the mappings no tensor uses (their memory returns to the system)."""
        with self._lock:
            self.mappings[:] = [m for m in self.mappings if m.in_use()]

    def _mapped(self, shape: Sequence[int], dtype: torch.dtype, nbytes: int, zero: bool) -> Tensor:
        """A (shape) tensor of dtype on a kept or fresh anonymous mapping, 2 MiB aligned; zeros if zero."""
        with self._lock:
            m = self._reuse(nbytes) if nbytes <= self.capacity else None
            fresh = m is None
            if m is None:
                m = _new_mapping(nbytes)
                if nbytes <= self.capacity:
                    self.mappings.append(m)
            raw = torch.frombuffer(m.block, dtype=torch.uint8)[m.start : m.start + nbytes]  # holds the block
        if not fresh and zero:
            raw.zero_()
        elif fresh and torch.get_num_threads() > 1:
            # fault every huge page in now, from this thread: first writes from several threads at once
            # into fresh huge pages ran up to 10x slower (2 threads, 100 MB: 200 against 18 ms), while one
            # thread's first write zeroes each page just before it fills it, in cache
            raw[::HUGE_PAGE].zero_()
        return raw.view(dtype).view(shape)

    @contextmanager
    def huge_pages(self, enabled: bool) -> Iterator[None]:
        """Within the block, `empty` and `zeros` use huge pages where available (True) or never (False):
        `with memory.huge_pages(False): ...` for calls that should run on torch's allocator."""
        before, self.enabled = self.enabled, enabled
        try:
            yield
        finally:
            self.enabled = before

    def on_huge_pages(self, nbytes: int, like: Tensor) -> bool:
        """Whether `empty` and `zeros` give a buffer of nbytes on like's device huge pages."""
        cpu = like.device.type == "cpu"
        return cpu and nbytes >= MIN_BYTES and self.enabled and huge_pages_available()

    def _fresh(self, shape: Shape, like: Tensor, dtype: Optional[torch.dtype], zero: bool) -> Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = like.dtype if dtype is None else dtype
        nbytes = math.prod(shape) * dtype.itemsize
        if self.on_huge_pages(nbytes, like):
            try:
                return self._mapped(shape, dtype, nbytes, zero)
            except (OSError, ValueError):  # no address space or mapping refused: the ordinary allocator
                pass
        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=dtype, device=like.device)

    def empty(self, shape: Shape, like: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
        """An uninitialized contiguous tensor of `shape` on like's device, in `dtype` (default like's)."""
        return self._fresh(shape, like, dtype, zero=False)

    def zeros(self, shape: Shape, like: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
        """A contiguous tensor of zeros of `shape` on like's device, in `dtype` (default like's)."""
        return self._fresh(shape, like, dtype, zero=True)

    def empty_like(self, x: Tensor) -> Tensor:
        """An uninitialized tensor shaped as x, with x's strides: `empty` where x is contiguous, else
        `torch.empty_like` (which keeps its memory layout)."""
        return self.empty(x.shape, x) if x.is_contiguous() else torch.empty_like(x)

    def take(self, x: Tensor, index: Tensor) -> Tensor:
        """x.index_select(0, index), its result from `empty`."""
        return torch.index_select(x, 0, index, out=self.empty((index.numel(), *x.shape[1:]), x))


DEFAULT_POOL = BufferPool()
empty, zeros, empty_like, take = DEFAULT_POOL.empty, DEFAULT_POOL.zeros, DEFAULT_POOL.empty_like, DEFAULT_POOL.take
release, huge_pages, on_huge_pages = DEFAULT_POOL.release, DEFAULT_POOL.huge_pages, DEFAULT_POOL.on_huge_pages

__all__ = [
    "BufferPool",
    "DEFAULT_POOL",
    "release",
    "POOL_BYTES",
    "empty",
    "empty_like",
    "take",
    "zeros",
    "huge_pages",
    "on_huge_pages",
    "huge_pages_available",
    "MIN_BYTES",
    "HUGE_PAGE",
]
