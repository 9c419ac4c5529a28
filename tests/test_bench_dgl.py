"""benchmarks/bench_dgl.py: without a DGL environment it lists DGL as skipped (no crash) and still
times sparseattn; with one ($DGL_PYTHON) the DGL recipes must match the reference."""

import json
import os

import pytest

from benchmarks import bench_dgl


def _run(tmp_path, *extra):
    bench_dgl.main(
        [
            "--quick",
            "--families",
            "bipartite-8x40x40",
            "--rounds",
            "1",
            "--reps",
            "1",
            "--warmup",
            "1",
            "--out",
            str(tmp_path),
            *extra,
        ]
    )
    (path,) = tmp_path.glob("*.json")
    return path, json.loads(path.read_text())


def test_dgl_missing_is_listed_as_skipped(tmp_path):
    path, data = _run(tmp_path, "--dgl-python", str(tmp_path / "no-such-python"))
    assert "nodgl" in path.name and not any(str(tmp_path) in v for v in map(str, data["config"].values()))
    rows = {(r["contender"], r["mode"]): r for r in data["results"]}
    for mode in ("fwd", "fwd+bwd"):
        assert rows["dgl fused", mode]["ms"] is None and "skipped" in rows["dgl fused", mode]["note"]
        assert rows["auto exact", mode]["ms"] > 0 and rows["auto exact", mode]["max_err_vs_reference"] < 1e-5
    assert (tmp_path / (path.stem + ".log")).exists()


@pytest.mark.skipif(not os.environ.get("DGL_PYTHON"), reason="set DGL_PYTHON to a Python with dgl 2.1 to run DGL")
def test_dgl_recipes_match_reference(tmp_path):
    _, data = _run(tmp_path, "--dgl-python", os.environ["DGL_PYTHON"])
    dgl_rows = [r for r in data["results"] if r["contender"].startswith("dgl")]
    assert len(dgl_rows) == 4 and all(r["ms"] > 0 and r["max_err_vs_reference"] < 1e-5 for r in dgl_rows)
