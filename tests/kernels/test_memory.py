"""kernels/memory.py: large CPU buffers on transparent huge pages, and the kernels that allocate
from it (csr in both layouts, with its embedding_bag results written a chunk at a time, and local)
giving bit for bit what they give on torch's own allocator."""

import gc
import mmap
import re

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.kernels import kernel_options, memory
from sparseattn.kernels.csr import primitives

from ..dense import dense_attention

CPU = torch.zeros(())


@pytest.fixture
def everything_mapped(monkeypatch):
    """Every buffer the kernels allocate through `memory` on a mapping (where this machine can), and
    embedding_bag results written three rows of 64 floats at a time."""
    monkeypatch.setattr(memory, "MIN_BYTES", 1)
    monkeypatch.setattr(primitives, "BAG_CHUNK_BYTES", 3 * 64 * 4)


def _needs_huge_pages():
    if not memory.huge_pages_available():
        pytest.skip("this platform offers no transparent huge pages (or SPARSEATTN_HUGE_PAGES=0)")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"^VmRSS:\s*(\d+)", f.read(), re.M).group(1))


def test_a_large_buffer_is_a_zeroed_aligned_mapping_that_outlives_its_mapping_object(everything_mapped):
    _needs_huge_pages()
    z = memory.zeros((3, 5), CPU, dtype=torch.float64)
    e = memory.empty(7, CPU, dtype=torch.int64)
    gc.collect()  # the mmap objects are referenced by the tensors' storages only
    assert z.shape == (3, 5) and z.dtype == torch.float64 and z.is_contiguous()
    assert e.shape == (7,) and e.dtype == torch.int64
    assert torch.equal(z, torch.zeros(3, 5, dtype=torch.float64))
    assert z.data_ptr() % memory.HUGE_PAGE == 0 and e.data_ptr() % memory.HUGE_PAGE == 0
    e.copy_(torch.arange(7))
    z += 2.5
    assert e.sum().item() == 21 and z.sum().item() == 37.5
    with pytest.raises(RuntimeError, match="not resizable"):  # the documented difference
        z.resize_(1 << 20)


def test_a_freed_buffer_is_reused_and_released_on_request():
    _needs_huge_pages()
    pool = memory.BufferPool()  # its own mappings: nothing of the kernels' pool to reset
    size = memory.MIN_BYTES * 2
    before = _rss_kib()
    x = pool.zeros(size // 4, CPU)
    x.fill_(7.0)
    address = x.data_ptr()
    assert _rss_kib() - before > 0.9 * size / 1024  # the whole buffer is resident
    del x
    gc.collect()
    assert _rss_kib() - before > 0.9 * size / 1024  # kept, free, for the next buffer of its size
    y = pool.zeros(size // 4, CPU)  # the same mapping, its old contents cleared
    assert y.data_ptr() == address and int(torch.count_nonzero(y)) == 0
    z = pool.empty(size // 4, CPU)  # y still holds it: another one
    assert z.data_ptr() != address
    z.fill_(1.0)
    assert int(torch.count_nonzero(y)) == 0
    del y, z
    gc.collect()
    pool.release()  # unmapped: the memory returns to the system
    assert _rss_kib() - before < 0.25 * size / 1024


def test_free_mappings_beyond_the_pool_size_are_unmapped():
    _needs_huge_pages()
    pool = memory.BufferPool(capacity=memory.MIN_BYTES)
    a, b, c = (pool.empty(memory.MIN_BYTES // 4, CPU) for _ in range(3))
    newest = c.data_ptr()
    del a, b, c
    gc.collect()
    d = pool.empty(memory.MIN_BYTES // 4, CPU)  # reuses one; of the two others the older is unmapped
    addresses = [_address(m) + m.start for m in pool.mappings]
    assert len(pool.mappings) == 2 and d.data_ptr() in addresses and newest in addresses
    assert sum(m.capacity for m in pool.mappings if not m.in_use()) <= pool.capacity
    del d
    pool.release()
    assert pool.mappings == []


def test_the_kernels_pool_is_the_module_functions_and_switches_off_in_a_block():
    assert memory.empty.__self__ is memory.DEFAULT_POOL and memory.release.__self__ is memory.DEFAULT_POOL
    pool = memory.BufferPool()
    with pool.huge_pages(False):
        assert not pool.on_huge_pages(memory.MIN_BYTES, CPU)
        assert memory.DEFAULT_POOL.enabled  # another pool's switch
    assert pool.enabled


def _address(m) -> int:
    return torch.frombuffer(m.block, dtype=torch.uint8, count=1).data_ptr()


def test_small_buffers_stay_on_torchs_allocator():
    x = memory.empty(10, CPU)
    x.resize_(1 << 16)  # torch's storage: resizable
    assert not memory.on_huge_pages(memory.MIN_BYTES - 1, CPU)
    assert not memory.on_huge_pages(memory.MIN_BYTES, torch.zeros((), device="meta"))


@pytest.mark.parametrize("variable", ["SPARSEATTN_HUGE_PAGES=0", "THP_MEM_ALLOC_ENABLE=1"])
def test_the_environment_switches_it_off(monkeypatch, variable):
    name, value = variable.split("=")
    monkeypatch.setenv(name, value)
    memory.huge_pages_available.cache_clear()
    try:
        assert not memory.huge_pages_available()
        assert not memory.on_huge_pages(memory.MIN_BYTES, CPU)
    finally:
        monkeypatch.undo()
        memory.huge_pages_available.cache_clear()


def test_a_refused_mapping_falls_back_to_torch(everything_mapped, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    z = memory.zeros(5, CPU)
    assert torch.equal(z, torch.zeros(5))
    z.resize_(1 << 16)  # torch's storage


def _graph():
    """A random graph with repeated edges and destinations without in-edges."""
    g = graphs.random(90, 70, 600, seed=3)
    keep = g.dst % 7 != 0  # every seventh destination gets no edges
    return graphs.Graph(torch.cat([g.edge_index[:, keep], g.edge_index[:, :5]], 1), 90, 70)


def _run(g, backend: str, clamp, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(g.num_dst, 4, 64, generator=gen).requires_grad_()
    k, v = (torch.randn(g.num_src, 4, 64, generator=gen).requires_grad_() for _ in range(2))
    out = edge_attention(q, k, v, g, clamp=clamp, backend=backend)
    out.backward(torch.randn(out.shape, generator=gen))
    return [out.detach(), q.grad, k.grad, v.grad], (q, k, v)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
@pytest.mark.parametrize("layout", ["interleaved", "head-major"])
def test_csr_on_mapped_buffers_and_chunked_bags_gives_the_same_numbers(monkeypatch, clamp, layout):
    g = _graph()
    with kernel_options(csr_layout=layout):
        plain, _ = _run(g, "csr", clamp)
        monkeypatch.setattr(memory, "MIN_BYTES", 1)
        monkeypatch.setattr(primitives, "BAG_CHUNK_BYTES", 3 * 64 * 4)
        mapped, (q, k, v) = _run(g, "csr", clamp)
        with torch.no_grad():
            inference = edge_attention(q, k, v, g, clamp=clamp, backend="csr")
    for a, b in zip(plain, mapped):
        assert torch.equal(a, b)
    assert torch.equal(inference, plain[0])
    dense = dense_attention(q.detach(), k.detach(), v.detach(), g.edge_index, clamp=clamp)
    torch.testing.assert_close(mapped[0].double(), dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("clamp", [(-5.0, 5.0), None])
def test_local_on_mapped_buffers_gives_the_same_numbers(monkeypatch, clamp):
    g = graphs.window(300, 40)
    plain, _ = _run(g, "local", clamp)
    monkeypatch.setattr(memory, "MIN_BYTES", 1)
    mapped, _ = _run(g, "local", clamp)
    for a, b in zip(plain, mapped):
        assert torch.equal(a, b)


def test_a_call_in_locality_order_takes_its_output_into_a_permuted_inputs_buffer():
    """Without gradients, the permuted copies of q, k and v are dropped once the inner call returns,
    so the output permuted back reuses one of their mappings: one mapping fewer at the call's peak
    (a 50K-node shuffled mesh, forward: 512 -> 414 MiB); values as before."""
    _needs_huge_pages()
    shuffle = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    g = graphs.relabel(graphs.window(4096, 4), shuffle)  # ids shuffled: the order pays
    q, k, v = (torch.randn(4096, 8, 64, generator=torch.Generator().manual_seed(s)) for s in range(3))
    assert q.numel() * 4 >= memory.MIN_BYTES  # on mappings
    gc.collect()
    memory.release()
    before = {id(m) for m in memory.DEFAULT_POOL.mappings}
    with torch.no_grad():
        out = edge_attention(q, k, v, g, kernel_options={"node_order": "locality"})
    new = [m for m in memory.DEFAULT_POOL.mappings if id(m) not in before]
    assert len(new) == 4, len(new)  # q, k, v permuted and the inner output; the output reused one
    assert sum(m.in_use() for m in new) == 1  # the output's
    torch.testing.assert_close(out, edge_attention(q, k, v, g))
