"""benchmarks/bench_triton_gpu.py on CPU: --smoke writes its JSON, PNG and log into --out, times the
contenders that apply, and marks a contender whose output is wrong or never written instead of timing
it; each row carries the bytes and rates of its pass; the FlexAttention block mask comes from the graph.
Seconds, on tiny graphs."""

import importlib.util
import json
import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # as tests/conftest.py: before anything imports triton (PyG does)
    os.environ["TRITON_INTERPRET"] = "1"

from benchmarks import bench_triton_gpu as bench
from benchmarks import harness, peers
from benchmarks.families import random_edges
from sparseattn import Graph, edge_attention, graphs


def forgets_the_last_destination(g, clamp, q, k, v):
    """A broken contender: the last row of its output is never written."""

    def fn():
        out = torch.empty(g.num_dst, q.shape[1], v.shape[2], dtype=q.dtype)
        out[:-1] = edge_attention(q, k, v, g, scale=bench.SCALE, clamp=clamp)[:-1]
        return out

    return bench.Run(fn)


def test_smoke_run_writes_results_and_flags_a_wrong_contender(tmp_path, monkeypatch):
    for name in harness._ENV_NOTED:  # a caller's OMP_NUM_THREADS=1 would lead the recorded command
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(bench.CONTENDERS, "broken", forgets_the_last_destination)
    cases = ["window8", "complete512"]
    status = bench.main(
        [
            "--smoke",
            "--out",
            str(tmp_path),
            "--cases",
            ",".join(cases),
            "--warmup",
            "0",
            "--rep",
            "1",
            "--contenders",
            "csr,reference,pyg,sdpa,broken",
            "--peak-gbs",
            "50",
        ]
    )
    assert status == 1  # the broken contender fails the run
    stems = {p.name.rsplit(".", 1)[0] for p in tmp_path.iterdir()}
    assert len(stems) == 1 and stems.pop().endswith("_smoke")
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".png", ".log"}
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert data["machine"]["torch"] == torch.__version__ and data["config"]["dtype"] == "torch.float32"
    assert data["command"].startswith("python -m benchmarks.bench_triton_gpu --smoke --out ")
    assert "commit" in data and data["machine"]["torch_threads"] == torch.get_num_threads()
    rows = {(r["family"], r["mode"], r["contender"]): r for r in data["results"]}
    has_pyg = importlib.util.find_spec("torch_geometric") is not None  # PyG is not a test dependency
    for case in cases:
        for mode in bench.CLAMPS:
            broken = rows[(case, f"fwd {mode}", "broken")]
            assert broken["note"].startswith("WRONG: 1 of") and broken["ms"] is None
            assert math.isinf(broken["max_err_vs_reference"])  # the unwritten row was NaN: memory was poisoned
            assert (case, f"fwd+bwd {mode}", "broken") not in rows
            for name in ["csr", "reference"] + ["pyg"] * has_pyg:
                for p in ("fwd", "fwd+bwd"):
                    assert rows[(case, f"{p} {mode}", name)]["ms"] > 0, (case, mode, name, p)
                assert rows[(case, f"fwd {mode}", name)]["max_err_vs_reference"] <= 1e-4
            if not has_pyg:
                assert rows[(case, f"fwd {mode}", "pyg")]["note"].startswith("skipped: torch_geometric")
    sdpa = {k: r for k, r in rows.items() if r["contender"] == "sdpa"}
    assert sdpa[("complete512", "fwd exact", "sdpa")]["note"].startswith("SDPA kernel: ")
    assert sdpa[("complete512", "fwd+bwd exact", "sdpa")]["ms"] > 0
    assert all(
        r["ms"] is None and r["note"].startswith("skipped")
        for k, r in sdpa.items()
        if k[0] == "window8" or "clamp" in k[1]
    )
    assert data["wrong"] == [f"{c} {m} broken" for c in cases for m in bench.CLAMPS]
    assert "wrong: window8 clamp broken" in next(tmp_path.glob("*.log")).read_text()
    assert_rates(data, cases, peak=50.0)
    assert "scale" not in data and len(data["targets"]) == 20


def assert_rates(data, cases, peak):
    """Every timed row's bytes are moved_bytes of its graph, its rates its bytes over its time."""
    rows = {(r["family"], r["mode"], r["contender"]): r for r in data["results"]}
    backward_rates = 0
    for (case, mode, name), r in rows.items():
        if r["ms"] is None or case not in cases:
            continue
        build, _, size = bench.CASES[case]
        g = build(size, "cpu")
        fwd_bytes, bwd_bytes = bench.moved_bytes(g.num_dst, g.num_src, g.num_edges, bench.H, bench.D, 4)
        assert bwd_bytes > fwd_bytes
        if mode.startswith("fwd+bwd"):
            fwd = rows[(case, mode.replace("fwd+bwd", "fwd"), name)]
            assert r["bwd_bytes"] == bwd_bytes and r["gb_per_s"] is None and r["fwd_bytes"] is None
            assert r["bwd_ms"] == pytest.approx(r["ms"] - fwd["ms"])
            if r["bwd_ms"] > 0:  # a difference of medians: not guaranteed positive on a loaded CPU
                backward_rates += 1
                assert r["bwd_gb_per_s"] == pytest.approx(bwd_bytes / r["bwd_ms"] / 1e6)
                assert r["bwd_peak_fraction"] == pytest.approx(r["bwd_gb_per_s"] / peak)
        else:
            assert r["fwd_bytes"] == fwd_bytes and r["bwd_bytes"] is None
            assert r["gb_per_s"] == pytest.approx(fwd_bytes / r["ms"] / 1e6)
            assert r["fwd_peak_fraction"] == pytest.approx(r["gb_per_s"] / peak)
        assert r["peak_extra_mib"] is None  # CPU
    assert backward_rates > 0


def test_moved_bytes_on_a_tiny_case():
    # 2 destinations, 3 sources, 5 edges, H=1, D=Dv=2, 2-byte elements
    fwd = 2 * 2 * 2 * 2 + 5 * 2 * 2 * 2 + 8 * 5  # q, out per destination; k, v, index per edge: 96
    dq_pass = 2 * 3 * 2 * 2 + 5 * 2 * 2 * 2 + 2 * 2 * 2 + 8 * 5  # q, out, grad_out; k, v; dq; index: 112
    dkdv_pass = 3 * 2 * 2 * 2 + 5 * 2 * 2 * 2 + 5 * 1 * 8 + 3 * 2 * 2 * 2 + 8 * 5  # k, v; q, do; lse, delta: 168
    assert bench.moved_bytes(2, 3, 5, 1, 2, 2) == (fwd, dq_pass + dkdv_pass) == (96, 280)


def test_targets_from_rows():
    row = bench.Row
    rows = [
        row("random", 1, "triton", "fwd clamp", ms=10.0, fwd_peak_fraction=0.85),
        row("random", 1, "triton", "fwd+bwd clamp", ms=35.0, bwd_ms=25.0),
        row("random", 1, "pyg", "fwd+bwd clamp", ms=140.0),
        row("random", 1, "pyg-compiled", "fwd+bwd clamp", ms=105.0),
        row("window8", 1, "triton", "fwd+bwd clamp", ms=11.0),
        row("window8", 1, "flex", "fwd+bwd clamp", ms=10.0),
        row("window64", 1, "triton", "fwd+bwd clamp", ms=5.0),
        row("window64", 1, "flex", "fwd+bwd clamp", note="out of memory"),  # no time: no ratio
        row("window8", 1, "local-triton", "fwd+bwd clamp", ms=8.0),
    ]
    goals = bench.targets(rows)
    assert goals == {
        "random clamp: triton fwd GB/s / peak (>= 0.8)": 0.85,
        "random clamp: triton fwd+bwd ms (<= 40)": 35.0,
        "random clamp: triton bwd / fwd time (<= 2)": 2.5,
        "random clamp: pyg / triton fwd+bwd time": 4.0,
        "random clamp: pyg-compiled / triton fwd+bwd time (>= 3)": 3.0,
        "window8 clamp: triton / flex fwd+bwd time (<= 1.1)": 1.1,
        "window64 clamp: triton / flex fwd+bwd time (<= 1.1)": None,
        "window8 clamp: local-triton / flex fwd+bwd time (<= 1.1)": 0.8,
        "window64 clamp: local-triton / flex fwd+bwd time (<= 1.1)": None,
        "complete512 clamp: auto / sdpa fwd+bwd time (<= 1.3)": None,
        **{k: None for k in bench.targets([]) if " exact: " in k},
    }
    assert len(bench.targets([])) == 20 and all(v is None for v in bench.targets([]).values())


def test_chunked_reference_and_compare_find_bad_rows_and_the_device_random_graph_is_sorted():
    g = Graph(random_edges(50, 400), 50, 50)
    assert g.num_edges == 400 and g.is_sorted_by_dst and bool((g.dst.diff() >= 0).all())
    q, k, v = (torch.randn(50, 2, bench.D) for _ in range(3))
    clamp = bench.CLAMPS["clamp"]
    out = edge_attention(q, k, v, g, scale=bench.SCALE, clamp=clamp)
    for chunk in (500, 60):  # one range, several
        assert (bench.reference_output(q, k, v, g, clamp, chunk_edges=chunk) - out).abs().max() < 1e-5
    ref = bench.reference_output(q, k, v, g, clamp, chunk_edges=60)
    assert bench.compare(out, ref, 1e-4)[1] == 0 and bench.compare(out, ref, 1e-4)[0] < 1e-5
    out[7, 1, 3] += 1.0
    out[9] = float("nan")
    err, bad = bench.compare(out, ref, 1e-4)
    assert bad == 2 and math.isinf(err)


def test_poisoned_memory_fills_new_tensors_with_nan_and_restores_the_mode():
    with bench.poisoned_memory():
        assert torch.empty(5).isnan().all() and torch.empty_like(torch.ones(2, 3)).isnan().all()
    assert not torch.are_deterministic_algorithms_enabled()


def test_flex_block_mask_is_built_from_the_graph():
    mask, detail = peers.graph_block_mask(bench.complete((2, 256), "cpu"))  # each graph: 2 x 2 full blocks
    assert detail.startswith("0 partial + 8 full")
    assert torch.equal(mask.to_dense()[0, 0], torch.block_diag(torch.ones(2, 2), torch.ones(2, 2)).int())
    mask, detail = peers.graph_block_mask(graphs.window(512, 8))  # 4 x 4 blocks, a band: all partial
    band = torch.ones(4, 4).triu(-1).tril(1).int()
    assert detail.startswith("10 partial + 0 full") and torch.equal(mask.to_dense()[0, 0], band)
    with pytest.raises(ValueError, match="contiguous"):
        peers.graph_block_mask(graphs.random(64, 64, 300))
    with pytest.raises(bench.Skip, match="contiguous"):
        bench.make_flex(graphs.random(64, 64, 300), None, *(torch.randn(64, 1, 8) for _ in range(3)))


def test_flex_contender_with_the_graph_mask_matches_the_reference():
    """FlexAttention (eager on CPU: forward only) with the graph's mask, clamped and exact."""
    g = graphs.window(200, 8)
    q, k, v = (torch.randn(200, bench.H, bench.D) for _ in range(3))
    for mode, clamp in bench.CLAMPS.items():
        run = bench.make_flex(g, clamp, q, k, v)
        ref = bench.reference_output(q, k, v, g, clamp, chunk_edges=500)  # in chunks of destinations
        assert not run.backward and (run.fn() - ref).abs().max() < 1e-5, mode


def test_powerlaw_case_has_hub_destinations_and_uniform_sources():
    """The power-law case is families.powerlaw_edges with uniform sources and hub destinations."""
    build, _, _ = bench.CASES["powerlaw"]
    g = build(4096, "cpu")
    deg, out_deg = g.in_degree(), torch.bincount(g.src, minlength=4096)
    assert 0.9 * 16 * 4096 < g.num_edges <= 16 * 4096  # repeated pairs kept once
    assert deg.max() > 50 * 16 and deg.min() < 16 / 2 and out_deg.max() < 3 * 16  # mean degrees about 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_cuda_it_exits_cleanly(capsys, tmp_path):
    assert bench.main(["--out", str(tmp_path)]) == 0 and "no CUDA device" in capsys.readouterr().out


def test_backward_sweep_covers_both_layouts_and_each_setting_reaches_the_kernels(monkeypatch):
    """--sweep-backward's contenders: the default, then every SWEEP_BACKWARD setting of each backward
    layout; a contender's settings reach the backward launch (read when its forward ran)."""
    from sparseattn.kernels import triton as tk
    from sparseattn.kernels.triton import launch

    contenders = bench.sweep_contenders(backward=True)
    layouts = {name.split()[1] for name in contenders if name != "triton"}
    assert set(bench.SWEEP_BACKWARD) == layouts == set(tk.BACKWARD_LAYOUTS)
    sizes = [math.prod(len(v) for v in axes.values()) for axes in bench.SWEEP_BACKWARD.values()]
    assert len(contenders) == 1 + sum(sizes)
    launched = []
    real = launch.backward
    monkeypatch.setattr(launch, "backward", lambda *a, **kw: launched.append(kw["tiles"]) or real(*a, **kw))
    g = graphs.window(12, radius=2)
    q, k, v = (torch.randn(12, 3, 8, requires_grad=True) for _ in range(3))
    contenders["bwd heads E2 w8 s1"](g, (-5.0, 5.0), q, k, v).fn().sum().backward()
    assert (launched[0]["BLOCK_H"], launched[0]["BLOCK_E"], launched[0]["num_warps"]) == (4, 2, 8)
    assert launched[0]["NUM_STAGES"] == 1
