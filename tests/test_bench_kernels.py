"""benchmarks/bench_kernels.py: the power-law family, the physical limit's byte and flop counts,
thread settings run in processes of their own, and a quick run (one thread setting, two input
scales) whose JSON the kernels page renders with its thread and limit columns."""

import importlib.util
import json
import os
import shutil
import sys

import pytest
import torch

from benchmarks import pages
from benchmarks.bench_kernels import main
from benchmarks.families import families, powerlaw_edges
from benchmarks.harness import machine_tag
from benchmarks.kernels_report import KernelResult, ratio_table
from benchmarks.limits import limit_ms, must_move
from benchmarks.threads import setting_env, setting_label, thread_settings
from sparseattn import edge_attention, graphs


def test_powerlaw_edges_are_seeded_sorted_unique_and_heavy_tailed():
    n, degree = 5000, 16
    ei = powerlaw_edges(n, degree, seed=3)
    assert torch.equal(ei, powerlaw_edges(n, degree, seed=3)) and not torch.equal(ei, powerlaw_edges(n, degree))
    src, dst = ei
    key = dst * n + src
    assert torch.equal(key, torch.unique(key)), "destination-major, each pair once"
    assert 0.9 * n * degree < ei.shape[1] <= n * degree
    out_deg, in_deg = torch.bincount(src, minlength=n), torch.bincount(dst, minlength=n)
    assert out_deg.max() > 50 * degree, "hub sources feed many destinations"
    assert in_deg.max() > 10 * degree, "heavy-tailed in-degree"
    g = families(quick=True)["powerlaw-5k"].build()
    assert (g.num_src, g.num_dst) == (5000, 5000) and g.num_edges == powerlaw_edges(5000, 16).shape[1]


def test_must_move_counts_by_hand():
    """window(4, 1): 10 edges, 4 nodes; H=2, D=3, Dv=5."""
    g = graphs.window(4, 1)
    q, kv, o, s, index = 4 * 2 * 3, 4 * 2 * (3 + 5), 4 * 2 * 5, 4 * 2, 8 * (10 + 4 + 1)
    moved = must_move(g, heads=2, dim=3, dim_v=5)
    assert moved["bytes"] == {"fwd": 4 * (q + kv + o) + index, "fwd+bwd": 4 * (3 * (q + kv + o) + 2 * s) + 2 * index}
    assert moved["flops"] == {"fwd": 2 * 10 * 2 * 8, "fwd+bwd": 6 * 10 * 2 * 8}
    blocks = must_move(graphs.from_blocks([("causal", 4, 4)]), heads=2, dim=3, dim_v=5)
    assert blocks["bytes"]["fwd"] == 4 * (q + kv + o), "dense blocks read no per-edge index"
    assert blocks["flops"]["fwd"] == 2 * 10 * 2 * 8
    assert limit_ms(2e9, 1e9, copy_gb_per_s=10, gemm_gflop_per_s=100) == pytest.approx(200.0)
    assert limit_ms(1e9, 1e11, copy_gb_per_s=10, gemm_gflop_per_s=100) == pytest.approx(1000.0)


def test_thread_settings_and_their_environment(monkeypatch):
    assert thread_settings([1, 2], ["default", "passive"]) == [(1, "default"), (2, "default"), (2, "passive")]
    assert [setting_label(*s) for s in thread_settings([2], ["passive", "active"])] == ["2 passive", "2 active"]
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert setting_env(2, "passive")["OMP_WAIT_POLICY"] == "PASSIVE"
    env = setting_env(1, "default")
    assert env["OMP_NUM_THREADS"] == "1" and "OMP_WAIT_POLICY" not in env


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run: a power-law and a block family, inputs N(0, 0.25) and N(0, 4) (the clamp
    binds), one thread, in a process of its own."""
    out = tmp_path_factory.mktemp("bench_kernels")
    args = ["--quick", "--families", "powerlaw-5k,complete-16x32", "--contenders", "csr,auto,sdpa"]
    main(args + ["--threads", "1", "--input-scale", "0.5,2", "--reps", "1", "--warmup", "1", "--out", str(out)])
    (path,) = out.glob("*.json")
    return path, json.loads(path.read_text())


def test_quick_run_records_settings_scales_and_limits(quick_run):
    path, data = quick_run
    config, rows = data["config"], data["results"]
    assert config["format"] == 2 and config["input_scales"] == [0.5, 2.0]
    (setting,) = config["settings"]
    assert setting["env"]["OMP_NUM_THREADS"] == "1" and setting["torch_threads"] == 1
    assert setting["parallel_info"]["omp_get_max_threads()"] == "1" and "error" not in setting
    assert setting["copy_gb_per_s"] > 0 and setting["gemm_gflop_per_s"] > 0
    timed = [r for r in rows if r["ms"] is not None]
    assert {(r["family"], r["input_scale"]) for r in timed} == {
        (f, s) for f in ("powerlaw-5k", "complete-16x32") for s in (0.5, 2.0)
    }
    for r in timed:
        assert r["threads"] == 1 and r["omp_wait_policy"] == "default"
        assert r["limit_fraction"] == pytest.approx(r["limit_ms"] / r["ms"]) and r["limit_fraction"] > 0
        assert r["max_err_vs_reference"] < 1e-3
    from benchmarks.harness import _reset_cpu_peak

    if _reset_cpu_peak():  # peak memory where the kernel lets VmHWM reset (it was measured, then dropped)
        assert all(r["peak_extra_mib"] is not None for r in timed)
    fi = config["family_info"]["powerlaw-5k"]
    assert fi["max_out_degree"] > fi["max_in_degree"] > 16 and fi["bytes"]["fwd+bwd"] > fi["bytes"]["fwd"]
    ratios = {(r["family"], r["input_scale"], r["ratio"]) for r in config["ratios"]}
    assert ("complete-16x32", 2.0, "auto/sdpa") in ratios and ("powerlaw-5k", 0.5, "csr fwd+bwd/fwd") in ratios
    assert ("powerlaw-5k", 2.0, "auto limit share") in ratios
    # the pages recompute the records from the stored rows, with the same result
    assert ratio_table([KernelResult(**r) for r in rows]) == config["ratios"]
    assert machine_tag(data["machine"]) in path.name


def test_exact_peers_are_checked_against_exact_softmax(quick_run):
    """At N(0, 4) the clamp binds, so SDPA (exact softmax) differs from the clamp-mode reference;
    the run checked it against the exact one and timed it."""
    g = families(quick=True)["complete-16x32"].build()
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, 8, 64) * 2 for n in (g.num_dst, g.num_src, g.num_src))
    clamped = edge_attention(q, k, v, g, backend="reference")
    exact = edge_attention(q, k, v, g, clamp=None, backend="reference")
    assert (clamped - exact).abs().max() > 1e-2
    sdpa = [r for r in quick_run[1]["results"] if r["contender"] == "sdpa" and r["input_scale"] == 2.0]
    assert len(sdpa) == 2 and all(r["ms"] is not None and r["max_err_vs_reference"] < 1e-4 for r in sdpa)


def test_kernels_page_shows_threads_scales_and_limits(quick_run, tmp_path):
    path, data = quick_run
    stem = f"bench_kernels_{machine_tag(data['machine'])}"
    shutil.copy(path, tmp_path / f"{stem}.json")
    shutil.copy(os.path.join(pages.RESULTS, "bench_layers_amd-epyc-1t-cpu.json"), tmp_path)
    made, stems = pages.generate(str(tmp_path))
    page = made["kernels.md"].decode()
    assert stem in stems and f"{pages.RESULTS_REL}/{stem}.json" in page
    assert "| family | threads | input σ | csr | auto |" in page
    assert "| `powerlaw-5k` | 1 | 2 |" in page and "| `complete-16x32` | 1 | 0.5 |" in page
    assert "Physical limit, ms (fwd / fwd+bwd)" in page and "`OMP_NUM_THREADS=1`" in page


HAVE_COMPILER = shutil.which("c++") is not None or shutil.which("g++") is not None
needs_compiler = pytest.mark.skipif(not HAVE_COMPILER, reason="torch.compile needs a C++ compiler on the CPU")


def test_gather_floor_times_both_layouts():
    from benchmarks.limits import gather_floor

    floors = gather_floor(graphs.random(300, 300, 300 * 16, seed=0), heads=2, dim=8, reps=2)
    assert floors["interleaved"] > 0 and floors["head_major"] > 0
    assert floors["floor"] == min(floors["interleaved"], floors["head_major"])


def test_quick_run_reports_the_gather_floor(quick_run, tmp_path):
    path, data = quick_run
    (setting,) = data["config"]["settings"]
    assert set(setting["floors"]) == {"powerlaw-5k", "complete-16x32"}
    for r in data["results"]:
        if r["mode"] == "fwd" and r["ms"] is not None:
            assert r["floor_ms"] == setting["floors"][r["family"]]["floor"] > 0
            assert r["floor_fraction"] == pytest.approx(r["floor_ms"] / r["ms"])
        elif r["mode"] == "fwd+bwd":
            assert r["floor_ms"] is None
    shutil.copy(path, tmp_path / f"bench_kernels_{machine_tag(data['machine'])}.json")
    page = pages.generate(str(tmp_path))[0]["kernels.md"].decode()
    assert "Gather floor, ms" in page and "| family | threads | input σ | floor ms | csr | auto |" in page


def test_structured_families_have_local_twins():
    fams = families(quick=True)
    assert {"window-2048-r64", "knn-2k-shuffled", "knn-2k-local", "mesh-48-shuffled", "mesh-48-local"} <= set(fams)
    for name in ("knn-2k", "mesh-48"):
        shuffled, local = fams[f"{name}-shuffled"].build(), fams[f"{name}-local"].build()
        assert (local.num_dst, local.num_edges) == (shuffled.num_dst, shuffled.num_edges)
        assert sorted(torch.bincount(local.dst).tolist()) == sorted(torch.bincount(shuffled.dst).tolist())
    assert fams["mesh-48-shuffled"].build().num_edges == (3 * 48 - 2) ** 2  # sum over 9 offsets of (48-|di|)(48-|dj|)


@needs_compiler
def test_compiled_pyg_forward_is_not_skipped_for_eager_pygs_memory():
    """Compiled PyG's forward keeps no (E, H, D) tensor: its estimate lets a window of 8.4M edges
    run forward within 8 GiB, while its fwd+bwd (and eager PyG's forward) stay above it."""
    from benchmarks.contenders import compiled_pyg_bytes, estimate_bytes, needed_bytes

    g = graphs.window(65536, 64)
    gib = 1 << 30
    assert needed_bytes(compiled_pyg_bytes(g), "fwd") < 8 * gib < needed_bytes(compiled_pyg_bytes(g), "fwd+bwd")
    assert needed_bytes(estimate_bytes("pyg", g), "fwd") > 8 * gib
    assert needed_bytes(estimate_bytes("auto", g), "fwd") == estimate_bytes("auto", g) / 2


def test_compiled_pyg_contender_is_checked_and_reports_its_compile_time(tmp_path):
    pytest.importorskip("torch_geometric")
    args = ["--quick", "--families", "window-2048", "--contenders", "auto,pyg (compiled)", "--threads", "1"]
    main(args + ["--reps", "1", "--warmup", "1", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("*.json")
    rows = [r for r in json.loads(path.read_text())["results"] if r["contender"] == "pyg (compiled)"]
    assert {r["mode"] for r in rows} == {"fwd", "fwd+bwd"}
    for r in rows:
        assert r["ms"] > 0 and r["compile_s"] > 0 and r["max_err_vs_reference"] < 1e-4
    assert "Compile time of `pyg (compiled)`" in pages.preview(str(path))


@needs_compiler
def test_stream_mode_times_two_passes_of_each_contender(tmp_path):
    pytest.importorskip("torch_geometric")
    main(["--stream", "--quick", "--threads", "1", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("*stream.json")
    rows = json.loads(path.read_text())["stream"]
    contenders = ("auto", "pyg", "pyg (compiled)")
    assert {(r["contender"], r["pass"]) for r in rows} == {(c, p) for c in contenders for p in (1, 2)}
    assert all(r["s"] > 0 and r["graphs"] == 2 and r["note"] == "" for r in rows)
    shutil.copy(path, tmp_path / path.name.replace("_quick", ""))
    page = pages.generate(str(tmp_path))[0]["kernels.md"].decode()
    assert "### Variant `stream`" in page and "| contender | first pass, s | second pass, s |" in page


def test_knn_graph_without_scipy_finds_the_same_neighbours(monkeypatch):
    from benchmarks.families import knn_graph

    with_scipy = knn_graph(500, k=4) if importlib.util.find_spec("scipy") else None
    monkeypatch.setitem(sys.modules, "scipy.spatial", None)  # the import fails: the torch path
    g = knn_graph(500, k=4)
    assert torch.equal(g.dst, torch.arange(500).repeat_interleave(4)) and bool(
        (g.src.view(-1, 4)[:, 0] == torch.arange(500)).all()
    )
    if with_scipy is not None:
        assert torch.equal(g.src.view(-1, 4).sort(1).values, with_scipy.src.view(-1, 4).sort(1).values)


def test_issue_44_ratios_and_their_targets_per_family():
    """ratio_table derives compiled PyG over auto, its memory ratio, auto over the gather floor and
    shuffled over local order from the rows; target_of gives each family its issue 44 bound."""
    from benchmarks.kernels_report import KernelResult, ratio_table, target_of

    def row(fam, contender, mode, ms, mib=None, floor=None):
        return KernelResult(fam, 10, contender, mode, ms=ms, peak_extra_mib=mib, floor_ms=floor)

    rows = [
        row("knn-2k-shuffled", "auto", "fwd", 30.0, floor=10.0),
        row("knn-2k-shuffled", "auto", "fwd+bwd", 90.0, 40),
    ]
    rows += [
        row("knn-2k-shuffled", "pyg (compiled)", "fwd", 45.0),
        row("knn-2k-shuffled", "pyg (compiled)", "fwd+bwd", 180.0, 100),
    ]
    rows += [row("knn-2k-local", "auto", "fwd", 20.0), row("knn-2k-local", "auto", "fwd+bwd", 60.0, 40)]
    got = {(r["family"], r["ratio"]): r["values"] for r in ratio_table(rows)}
    assert got["knn-2k-shuffled", "compiled pyg/auto"] == [1.5, 2.0]
    assert got["knn-2k-shuffled", "compiled pyg/auto memory"] == [2.5]
    assert got["knn-2k-shuffled", "auto/floor"] == [3.0]
    assert got["knn-2k-shuffled", "shuffled/local"] == [1.5, 1.5]
    assert ("knn-2k-local", "shuffled/local") not in got
    assert target_of("compiled pyg/auto", "window-65536-r64") == (">=", 3.0)
    assert target_of("compiled pyg/auto", "random-50k") == (">=", 1.5)
    assert target_of("compiled pyg/auto", "mesh-224-shuffled") == (">=", 2.0)
    assert target_of("compiled pyg/auto", "complete-32x128") is None
    assert target_of("auto/floor", "powerlaw-50k") == ("<=", 1.2) and target_of("auto/floor", "window-8192") is None
    assert target_of("csr fwd+bwd/fwd", "anything") == ("<=", 3.2)


@pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="torch_geometric is not installed")
def test_standalone_script_times_compiled_pyg_and_auto_in_its_own_process(capsys):
    """benchmarks/standalone.py, the harness's check against a user's own script: one JSON line with
    both contenders' medians per pass and compiled PyG's first calls (its compile) apart."""
    from benchmarks import standalone

    standalone.main(["bipartite-8x40x40", "--reps", "1"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["family"] == "bipartite-8x40x40" and report["threads"] == 1
    for name in ("pyg (compiled)", "auto"):
        times = report["contenders"][name]
        assert times["fwd"] > 0 and times["fwd+bwd"] > 0 and times["first_s fwd"] > 0
