"""csr's choice between its interleaved and head-major layouts, and head-major inputs read in place.
(Both layouts run every csr test in test_csr.py and, as "csr-head-major", tests/test_equivalence.py.)"""

import pytest
import torch

from sparseattn import edge_attention, graphs
from sparseattn.functional import as_graph
from sparseattn.kernels import KernelOptions, kernel_options
from sparseattn.kernels.csr.head_major import (
    HEAD_MAJOR_MIN_BYTES,
    HEAD_MAJOR_MIN_TRAINING_SLOTS,
    prefers_head_major,
    source_spread,
)

HEAD_MAJOR = KernelOptions(csr_layout="head-major")


def _keys(n: int, heads: int = 8, d: int = 64) -> torch.Tensor:
    return torch.zeros(1, 1, 1).expand(n, heads, d)  # only shape and dtype matter to the rule


def test_source_spread_tells_random_edges_from_local_ones():
    assert source_spread(graphs.random(4000, 4000, 40_000, seed=0)) == pytest.approx(1 / 3, abs=0.02)
    assert source_spread(graphs.window(4000, 8)) < 0.002
    assert source_spread(graphs.from_blocks([("full", 40, 40)] * 100)) < 0.01


@pytest.fixture
def avx512(monkeypatch):
    """The CPU as one whose kernels favour head-major reads on graphs without locality."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")


def test_head_major_only_for_large_graphs_without_locality(avx512):
    big, small = graphs.random(20_000, 20_000, 40_000, seed=0), graphs.random(10_000, 10_000, 20_000, seed=0)
    # a third of 20K sources of 8 * 64 floats is 13 MiB; of 10K, 6.8 MiB
    assert 20_000 * 8 * 64 * 4 / 3 > HEAD_MAJOR_MIN_BYTES > 10_000 * 8 * 64 * 4 / 3
    assert prefers_head_major(big, _keys(20_000))
    assert not prefers_head_major(small, _keys(10_000))
    assert not prefers_head_major(big, _keys(20_000, heads=1))  # one head: the layouts coincide
    assert not prefers_head_major(graphs.window(65_536, 8), _keys(65_536))  # large, but local
    meta = torch.empty(20_000, 8, 64, device="meta")  # not a CPU tensor: the rule is about CPU caches
    assert not prefers_head_major(big, meta)


def test_graphs_without_locality_stay_interleaved_where_the_cpu_favours_it(monkeypatch):
    """On AVX2 (measured: interleaved 1.4-1.5x faster forward on random and shuffled graphs) a kept
    Graph stays interleaved however spread its reads; a one-call graph still trains head-major."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    big = graphs.random(20_000, 20_000, 40_000, seed=0)
    assert not prefers_head_major(big, _keys(20_000))
    assert not prefers_head_major(big, _keys(20_000), training=True)
    assert prefers_head_major(as_graph(big.edge_index, 20_000, 20_000), _keys(20_000), training=True)


def test_training_on_a_one_call_graph_takes_head_major_from_a_size_on(avx512):
    """With gradients wanted on a graph made for one call (a raw edge_index), head-major from
    HEAD_MAJOR_MIN_TRAINING_SLOTS (edge, head) slots on, local or not: its backward builds no
    (H * E) transposed index. A Graph the caller keeps trains in the layout the locality rule picks."""
    window, tiny = graphs.window(65_536, 8), graphs.window(256, 8)
    assert window.num_edges * 8 >= HEAD_MAJOR_MIN_TRAINING_SLOTS > tiny.num_edges * 8
    one_call = as_graph(window.edge_index, 65_536, 65_536)
    assert prefers_head_major(one_call, _keys(65_536), training=True)
    assert not prefers_head_major(one_call, _keys(65_536))  # inference keeps the interleaved layout
    assert not prefers_head_major(window, _keys(65_536), training=True)  # kept: its index is reused
    assert not prefers_head_major(as_graph(tiny.edge_index, 256, 256), _keys(256), training=True)
    assert not prefers_head_major(one_call, _keys(65_536, heads=1), training=True)
    assert not prefers_head_major(one_call, torch.empty(65_536, 8, 64, device="meta"), training=True)
    big = graphs.random(20_000, 20_000, 40_000, seed=0)
    assert prefers_head_major(big, _keys(20_000), training=True)  # no locality: head-major either way


def test_csr_layout_follows_whether_gradients_are_wanted_on_a_raw_edge_index(head_major_calls):
    g = graphs.window(4096, 8)
    q, k, v = (torch.randn(4096, 8, 16) for _ in range(3))
    out = edge_attention(q, k, v, g.edge_index, backend="csr")
    assert head_major_calls == []
    k.requires_grad_()
    trained = edge_attention(q, k, v, g.edge_index, backend="csr")
    assert head_major_calls == [1] and torch.allclose(out, trained, atol=1e-6)
    edge_attention(q, k, v, g, backend="csr")  # the Graph itself: interleaved, trained or not
    assert head_major_calls == [1]


def test_csr_takes_the_head_major_path_where_the_rule_says(head_major_calls, avx512):
    g = graphs.random(20_000, 20_000, 40_000, seed=0)
    q, k, v = (torch.randn(20_000, 8, 64) for _ in range(3))
    out = edge_attention(q, k, v, g, backend="csr")
    assert head_major_calls == [1]
    inter = edge_attention(q, k, v, g, backend="csr", kernel_options={"csr_layout": "interleaved"})
    assert head_major_calls == [1]
    assert torch.allclose(out, inter, atol=1e-5)


def test_head_major_memory_is_read_in_place_with_the_same_results():
    g = graphs.random(50, 40, 300, seed=3)
    heads, d = 3, 8
    base = [torch.randn(n, heads, d, dtype=torch.float64) for n in (40, 50, 50)]
    grad_out = torch.randn(40, heads, d, dtype=torch.float64)
    results = []
    for head_major in (False, True):
        q, k, v = (
            (t.transpose(0, 1).contiguous().transpose(0, 1) if head_major else t.clone()).requires_grad_() for t in base
        )
        assert q.transpose(0, 1).is_contiguous() == head_major
        out = edge_attention(q, k, v, g, scale=0.3, clamp=None, backend="csr", kernel_options=HEAD_MAJOR)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        if head_major:  # gradients keep the inputs' memory layout
            assert all(gr.transpose(0, 1).is_contiguous() for gr in grads)
        results.append((out, *grads))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-12)


def test_unknown_layout_is_rejected_by_name():
    g = graphs.window(8, 1)
    q = torch.randn(8, 2, 4)
    with pytest.raises(ValueError, match="csr_layout must be one of .* got 'rows'"):
        edge_attention(q, q, q, g, backend="csr", kernel_options={"csr_layout": "rows"})
    with pytest.raises(ValueError, match=r"kernel_options has unknown names \['layout'\]"):
        edge_attention(q, q, q, g, backend="csr", kernel_options={"layout": "head-major"})


def test_kernel_options_default_comes_from_the_context_manager_and_a_call_overrides_it(head_major_calls):
    """`kernels.kernel_options(...)` sets the default for calls that pass none; a call's own
    kernel_options wins; the default is restored on exit."""
    g = graphs.window(64, 2)
    q = torch.randn(64, 2, 4)
    with kernel_options(csr_layout="head-major"):
        edge_attention(q, q, q, g, backend="csr")
        assert head_major_calls == [1]
        edge_attention(q, q, q, g, backend="csr", kernel_options=KernelOptions(csr_layout="interleaved"))
        assert head_major_calls == [1]
    edge_attention(q, q, q, g, backend="csr")
    assert head_major_calls == [1]  # a window graph: interleaved by csr's own rule


def test_prepare_with_the_head_dim_builds_only_the_layout_csr_will_take(avx512):
    from sparseattn.kernels import prepare

    random_graph, window = graphs.random(20_000, 20_000, 40_000, seed=0), graphs.window(300, 2)
    prepare(random_graph, 8, head_dim=64)
    prepare(window, 8, head_dim=64)
    assert set(random_graph._cache) >= {"csr_head_major"} and "csr_pattern_h8" not in random_graph._cache
    assert "csr_pattern_h8" in window._cache and "csr_head_major" not in window._cache
    both = graphs.window(300, 2)
    prepare(both, 8)  # head_dim unknown: both layouts
    assert {"csr_pattern_h8", "csr_head_major"} <= set(both._cache)
