"""The benchmark harness names what changes CPU timings: the vector ISA and the settings that matter."""

import torch

from benchmarks.harness import machine_header, machine_info


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
