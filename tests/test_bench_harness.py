"""The benchmark harness names what changes CPU timings: the vector ISA and the settings that matter."""

import pytest
import torch

from benchmarks.harness import machine_header, machine_info, openmp_settings, time_interleaved


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


def test_op_overhead_probe_writes_its_log(tmp_path):
    from benchmarks.probe_op_overhead import main

    main(["--reps", "1", "--nodes", "16", "--out", str(tmp_path)])
    (log,) = tmp_path.glob("probe_op_overhead_*.log")
    lines = log.read_text().splitlines()
    assert lines[0] == "$ python -m benchmarks.probe_op_overhead --reps 1 --nodes 16 --out " + str(tmp_path)
    timed = [line.split() for line in lines if line.strip().startswith(("fwd ", "fwd+bwd "))]
    assert [t[0] for t in timed] == ["fwd", "fwd+bwd"] and all(float(t[-2]) > 0 for t in timed)
