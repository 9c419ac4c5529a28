"""The benchmark harness names what changes CPU timings (the vector ISA and the settings that
matter) and what reproduces a result (commit, command, thread settings) in every file it writes."""

import json
import os
import subprocess

import pytest
import torch

from benchmarks import harness
from benchmarks.harness import machine_header, machine_info, machine_tag, openmp_settings, time_interleaved


def test_header_names_the_cpu_capability_and_timing_settings(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    info = machine_info()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"({info['cpu_capability']})" in machine_header(info)
    assert "THP_MEM_ALLOC_ENABLE" not in machine_header(info)
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    info = machine_info()
    assert info["env"]["THP_MEM_ALLOC_ENABLE"] == "1"
    assert "THP_MEM_ALLOC_ENABLE=1" in machine_header(info)


def test_openmp_settings_name_the_environment_and_torch_threads(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    found = openmp_settings()
    assert found["env"]["OMP_WAIT_POLICY"] == "PASSIVE" and found["env"]["GOMP_SPINCOUNT"] == "1000"
    assert found["parallel_info"]["at::get_num_threads()"] == str(torch.get_num_threads())
    assert "backend" in found["parallel_info"] and not any(k.startswith("OMP_") for k in found["parallel_info"])
    assert "OMP_WAIT_POLICY=PASSIVE" in machine_header(machine_info())


def test_interleaved_rounds_alternate_the_order_and_keep_failures():
    """One timed run of each contender per round, every other round in reverse order (so none
    always follows the same neighbour); a contender that raises keeps its exception."""
    order = []

    def contender(name):
        return lambda: order.append(name)

    def fails():
        raise RuntimeError("boom")

    times = time_interleaved([contender("a"), contender("b"), fails], warmup=1, reps=4, budget_s=60)
    assert [len(t) for t in times[:2]] == [4, 4] and isinstance(times[2], RuntimeError)
    timed = order[2:]  # after one warm-up call each of a and b
    assert timed == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_compile_plot_draws_the_ratios(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.bench_compile import plot_ratios

    cases = {"x": {"ratio_fwd": 0.9, "ratio_fwd+bwd": 1.2}, "y": {"ratio_fwd": 1.0, "ratio_fwd+bwd": 0.8}}
    assert plot_ratios(str(tmp_path / "c.png"), "title", cases)
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_every_json_records_commit_command_and_thread_settings(tmp_path, monkeypatch):
    """write_json puts the run's provenance first (taken at its start: commit, dirty, command with
    the timing-relevant environment, repository paths relative) and the thread settings and the
    load at the end into the machine record."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("MKL_DYNAMIC", "FALSE")
    argv = ["--out", os.path.join(harness.ROOT, "benchmarks", "results"), "--contenders", "auto,auto (raw)"]
    prov = harness.provenance("benchmarks.bench_kernels", argv)
    assert prov["command"] == (
        "OMP_NUM_THREADS=3 python -m benchmarks.bench_kernels --out benchmarks/results --contenders 'auto,auto (raw)'"
    )
    head = subprocess.run(["git", "-C", harness.ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert prov["commit"] == head.stdout.strip() and isinstance(prov["dirty"], bool)
    info = harness.machine_info()
    assert info["torch_threads"] == torch.get_num_threads() and info["thread_env"]["MKL_DYNAMIC"] == "FALSE"
    harness.write_json(
        str(tmp_path / "r.json"), prov, info, {"reps": 1}, [harness.Result("f", 1, "auto", "fwd", ms=1.0)]
    )
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data)[:5] == ["commit", "dirty", "command", "machine", "config"]
    assert data["results"][0]["ms"] == 1.0 and data["machine"]["load_average_end"] is not None


def test_output_names_its_files_and_logs_command_and_commit_first_and_the_page_last(tmp_path, capsys, monkeypatch):
    for name in harness._ENV_NOTED:  # a caller's OMP_NUM_THREADS=1 would lead the command line
        monkeypatch.delenv(name, raising=False)
    info = machine_info()
    out = harness.Output("benchmarks.bench_layers", ["--nodes", "16"], str(tmp_path), info, tag="x")
    out.log("a line")
    out.save({}, [harness.Result("random-16", 256, "csr, no edge term", "fwd+bwd", ms=1.5)])
    out.close()
    stem = f"bench_layers_{machine_tag(info)}_x"
    lines = (tmp_path / f"{stem}.log").read_text().splitlines()
    assert lines[0] == "$ python -m benchmarks.bench_layers --nodes 16" and lines[1].startswith("# commit ")
    assert lines[2] == out.header and lines[3] == "a line"  # the header before the first line
    assert capsys.readouterr().out.startswith(out.header + "\na line\n")
    assert "- Command: `python -m benchmarks.bench_layers --nodes 16`" in lines  # the page's section, at the end
    assert "| `random-16` | 1.50 | – | – | – | – | – | – | – |" in lines
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["command"] == lines[0][2:] and data["machine"]["cpu"] == info["cpu"]


def test_measure_times_into_rows_and_notes_failures():
    def fails():
        raise ValueError("bad input\nsecond line")

    rows = [harness.Result("f", 1, name, "fwd") for name in ("ok", "fails")]
    harness.measure(rows, [lambda: torch.ones(4).sum(), fails], warmup=1, reps=3, budget_s=10)
    assert len(rows[0].times_ms) == 3 and rows[0].ms == sorted(rows[0].times_ms)[1]
    assert rows[1].ms is None and rows[1].note == "failed: ValueError: bad input"


def test_without_a_checkout_the_commit_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "ROOT", str(tmp_path))  # no .git here
    monkeypatch.setenv("SPARSEATTN_COMMIT", "0" * 40)
    harness.git_state.cache_clear()
    try:
        assert harness.git_state() == ("0" * 40, None)
    finally:
        harness.git_state.cache_clear()


def test_bars_nest_rows_by_field_and_draw_each_panel(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [harness.Result("a", 1, "csr", "fwd", ms=2.0), harness.Result("a", 1, "auto", "fwd+bwd", ms=5.0)]
    rows += [{"family": "b", "mode": "fwd", "contender": "csr", "ms": 3.0}, harness.Result("b", 1, "pyg", "fwd")]
    panels = harness.nest(rows, "mode", "family", "contender", "ms")
    assert panels == {"fwd": {"a": {"csr": 2.0}, "b": {"csr": 3.0}}, "fwd+bwd": {"a": {"auto": 5.0}}}  # no pyg: no ms
    assert harness.write_bars(str(tmp_path / "b.png"), "title", panels, "ms", log=True)
    assert (tmp_path / "b.png").stat().st_size > 1000


def test_a_plot_without_timed_rows_is_not_drawn(tmp_path):
    """bench_layers --skip-layers plots no row (its edge-term rows are left out): no figure, no crash."""
    pytest.importorskip("matplotlib")
    untimed = [harness.Result("a", 1, "pyg", "fwd", note="failed: x")]
    assert not harness.write_times(str(tmp_path / "p.png"), "title", []) and not (tmp_path / "p.png").exists()
    assert not harness.write_times(str(tmp_path / "p.png"), "title", untimed)
    timed = [*untimed, harness.Result("a", 1, "csr", "fwd", ms=2.0)]
    assert harness.write_times(str(tmp_path / "p.png"), "title", timed) and (tmp_path / "p.png").exists()
