"""benchmarks/bench_triton_gpu.py on CPU: --smoke writes its JSON, PNG and log into --out, times the
contenders that apply, and marks a contender whose output is wrong or never written instead of timing
it; the FlexAttention block mask comes from the graph. A few seconds, on tiny graphs."""

import importlib.util
import json
import math

import pytest
import torch

from benchmarks import bench_triton_gpu as bench
from sparseattn import edge_attention, graphs


def forgets_the_last_destination(g, clamp, q, k, v):
    """A broken contender: the last row of its output is never written."""

    def fn():
        out = torch.empty(g.num_dst, q.shape[1], v.shape[2], dtype=q.dtype)
        out[:-1] = edge_attention(q, k, v, g, scale=bench.SCALE, clamp=clamp)[:-1]
        return out

    return bench.Run(fn)


def test_smoke_run_writes_results_and_flags_a_wrong_contender(tmp_path, monkeypatch):
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
        ]
    )
    assert status == 1  # the broken contender fails the run
    stems = {p.name.rsplit(".", 1)[0] for p in tmp_path.iterdir()}
    assert len(stems) == 1 and stems.pop().endswith("_smoke")
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".png", ".log"}
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert data["machine"]["torch"] == torch.__version__ and data["config"]["dtype"] == "torch.float32"
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


def test_poisoned_memory_fills_new_tensors_with_nan_and_restores_the_mode():
    with bench.poisoned_memory():
        assert torch.empty(5).isnan().all() and torch.empty_like(torch.ones(2, 3)).isnan().all()
    assert not torch.are_deterministic_algorithms_enabled()


def test_flex_block_mask_is_built_from_the_graph():
    mask, detail = bench.graph_block_mask(bench.complete((2, 256), "cpu"))  # each graph: 2 x 2 full blocks
    assert detail.startswith("0 partial + 8 full")
    assert torch.equal(mask.to_dense()[0, 0], torch.block_diag(torch.ones(2, 2), torch.ones(2, 2)).int())
    mask, detail = bench.graph_block_mask(graphs.window(512, 8))  # 4 x 4 blocks, a band: all partial
    band = torch.ones(4, 4).triu(-1).tril(1).int()
    assert detail.startswith("10 partial + 0 full") and torch.equal(mask.to_dense()[0, 0], band)
    with pytest.raises(bench.Skip, match="contiguous"):
        bench.graph_block_mask(graphs.random(64, 64, 300))


def test_flex_contender_with_the_graph_mask_matches_the_reference():
    """FlexAttention (eager on CPU: forward only) with the graph's mask, clamped and exact."""
    g = graphs.window(200, 8)
    q, k, v = (torch.randn(200, bench.H, bench.D) for _ in range(3))
    for mode, clamp in bench.CLAMPS.items():
        run = bench.make_flex(g, clamp, q, k, v)
        ref = bench.reference_output(q, k, v, g, clamp, chunk_edges=500)  # in chunks of destinations
        assert not run.backward and (run.fn() - ref).abs().max() < 1e-5, mode


def test_powerlaw_graph_has_hubs():
    g = bench.powerlaw(4096, 16 * 4096, "cpu")
    deg = g.in_degree()
    assert g.num_edges == 16 * 4096 and deg.max() > 50 * 16 and deg.min() < 16 / 2  # mean in-degree 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_cuda_it_exits_cleanly(capsys, tmp_path):
    assert bench.main(["--out", str(tmp_path)]) == 0 and "no CUDA device" in capsys.readouterr().out
