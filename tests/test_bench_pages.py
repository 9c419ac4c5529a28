"""The benchmark pages (docs/benchmarks/) are what benchmarks/pages renders from the stored results
and the templates, every stored result is on a page and records its commit and command, and every
results file is named by the convention."""

import json
import os
import re
import shutil
import subprocess

import pytest

from benchmarks import pages
from benchmarks.harness import ROOT, machine_tag

RESULTS = pages.RESULTS


def test_committed_pages_and_images_equal_the_renderer():
    made, _ = pages.generate()
    have = pages.existing()
    assert sorted(have) == sorted(made), "run `python -m benchmarks.pages`: pages or images missing or stale"
    differ = [path for path in made if have[path] != made[path]]
    assert not differ, f"run `python -m benchmarks.pages`: {differ} differ from the stored results"


def test_every_result_is_on_a_page():
    made, stems = pages.generate()
    text = b"".join(page for path, page in made.items() if path.endswith(".md")).decode()
    files = os.listdir(RESULTS)
    for name in files:
        stem = name.rsplit(".", 1)[0]
        if name.endswith(".json"):
            assert stem in stems and f"{pages.RESULTS_REL}/{stem}.json" in text, f"{name} is on no page"
        elif stem.startswith("probe_"):  # a template quotes it with {{ log:<stem> }}
            assert f"`{pages.RESULTS_REL}/{stem}.log`:\n\n```text\n" in text, f"{name} is on no page"
        else:  # a run's plot or log comes with its JSON
            assert stem + ".json" in files, f"{name} has no JSON beside it"


def test_results_follow_the_naming_convention():
    for name in sorted(os.listdir(RESULTS)):
        parsed = pages.parse_name(name)
        assert parsed is not None, f"{name}: not <bench>_<machine>[_<variant>].{{json,png,log}}"
        assert parsed["ext"] == "log" or parsed["bench"].startswith("bench_"), f"{name}: a probe keeps a log only"
        history = {"rerun", "earlier", "old", "new", "current", "targeted", "recheck", "final", "final2", "run"}
        words = set(parsed["variant"].split("-")) | set(parsed["machine"].split("-"))
        assert "torch" not in name and not words & history, f"{name}: versions and history stay out of names"
        if parsed["ext"] == "json":
            with open(os.path.join(RESULTS, name)) as f:
                info = json.load(f)["machine"]
            assert machine_tag(info) == parsed["machine"], f"{name}: its JSON says machine {machine_tag(info)}"


def test_every_stored_result_records_its_commit_and_command():
    """The commit a run measured (a commit of this repository) and the command that reproduces it
    are in its JSON, and its page shows both."""
    made, _ = pages.generate()
    text = b"".join(page for path, page in made.items() if path.endswith(".md")).decode()
    for name in sorted(n for n in os.listdir(RESULTS) if n.endswith(".json")):
        with open(os.path.join(RESULTS, name)) as f:
            data = json.load(f)
        commit, command = data.get("commit"), data.get("command")
        assert isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit), f"{name}: no commit"
        assert isinstance(command, str) and re.match(r"^([A-Z_]+=\S+ )*python (-m benchmarks\.|benchmarks/)", command)
        if shutil.which("git") and os.path.isdir(os.path.join(ROOT, ".git")):
            known = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", commit + "^{commit}"], capture_output=True)
            assert known.returncode == 0, f"{name}: commit {commit} is not in this repository"
        assert f"Command: `{command}`" in text and f"commit {commit[:7]}" in text, name


def test_links_resolve():
    made, _ = pages.generate()
    for path, text in made.items():
        if not path.endswith(".md"):
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text.decode()):
            assert not target.startswith(("/", "..")), f"{path} links outside docs/benchmarks: {target}"
            assert target in made, f"{path} links to {target}, which the renderer does not make"


def test_templates_fill_their_placeholders(tmp_path):
    (tmp_path / "probe_x_amd-1t-cpu.log").write_text("line 1\nline 2\n")
    text = pages.fill("# T\n\n{{ runs }}\n\n{{ log:probe_x_amd-1t-cpu }}\n", {"runs": "\nbody\n"}, str(tmp_path))
    assert text == "# T\n\nbody\n\n`benchmarks/results/probe_x_amd-1t-cpu.log`:\n\n```text\nline 1\nline 2\n```\n"
    with pytest.raises(KeyError, match="headlines"):
        pages.fill("{{ headlines }}", {"runs": ""}, str(tmp_path))
    assert pages.title("kernels") == "Kernels: edge attention per graph family"
    made, _ = pages.generate()
    assert not [p for p, text in made.items() if p.endswith(".md") and b": not stored." in text], (
        "a template quotes a missing log"
    )


def _info(**extra):
    info = {
        "sparseattn": "0.1.0",
        "torch": "2.13.0+cpu",
        "cpu": "AMD EPYC",
        "threads": 1,
        "cpu_capability": "AVX512",
        "env": {},
        "gpu": "no GPU",
        "python": "3.11.7",
        "date": "2026-11-24 09:00 UTC",
        "load_average": 1.5,
    }
    return {**info, **extra}


def test_a_new_distributed_run_fills_its_page(tmp_path):
    """bench_distributed's JSON (per-rank rows and a summary) becomes a section of distributed.md,
    with the provenance the harness wrote: a dirty tree and the load at the end show."""
    info = _info(load_average_end=2.5)

    def rank(config, world, r, loss=0.5):
        family, partition, _ = config.split("-")
        return {
            "config": config,
            "family": family,
            "partition": partition,
            "world": world,
            "rank": r,
            "nodes": 1000 // world,
            "edges": 17000 // world,
            "halo": 0 if world == 1 else 16,
            "train_peak_mib": 400.0 / world + 100,
            "setup_peak_mib": 300.0,
            "step_s": 0.5,
            "exchange_share": 0.0 if world == 1 else 0.05,
            "wait_share": 0.0 if world == 1 else 0.1,
            "losses": [loss],
            "load_average": 2.0,
            "note": "",
        }

    results = [rank("window-whole-P1", 1, 0)] + [rank("window-contiguous-P4", 4, r) for r in range(4)]
    summary = {"window-contiguous-P4": {"peak_ratio": 0.4, "setup_peak_ratio": 1.0, "exchange_share": 0.05}}
    stem = f"bench_distributed_{machine_tag(info)}"
    head = {"commit": "a" * 40, "dirty": True, "command": "python -m benchmarks.bench_distributed --quick"}
    with open(tmp_path / f"{stem}.json", "w") as f:
        json.dump({**head, "machine": info, "config": {}, "summary": summary, "results": results}, f)
    shutil.copy(os.path.join(RESULTS, "bench_layers_amd-epyc-1t-cpu.json"), tmp_path)
    made, stems = pages.generate(str(tmp_path))
    page = made["distributed.md"].decode()
    assert stem in stems and f"{pages.RESULTS_REL}/{stem}.json" in page
    assert "`window-contiguous-P4`" in page and "0.40x" in page and "no stored run" not in page
    assert "commit aaaaaaa with uncommitted changes, load average 1.5-2.5" in page
    assert "Command: `python -m benchmarks.bench_distributed --quick`" in page
    assert "distributed.md), AMD EPYC" in made["index.md"].decode()
    assert "no stored run yet" in made["index.md"].decode()  # kernels, among others


def test_layer_rows_pair_every_sparseattn_form_with_pygs():
    """bench_layers' layer table: sparseattn's layer eager, compiled, and given another input
    (" (edge_index)") each against PyG's eager and compiled times of the same layer, faster one."""
    from benchmarks.pages.models import _layer_rows

    def row(contender, ms):
        return dict(family="molecules", contender=contender, mode="fwd+bwd", ms=ms, peak_extra_mib=4.0)

    rows = [row("sparseattn.nn.TransformerConv", 5.0), row("sparseattn.nn.TransformerConv (edge_index) compiled", 2.0)]
    rows += [row("PyG TransformerConv", 6.0), row("PyG TransformerConv compiled", 3.0)]
    table = {r[1]: r for r in _layer_rows(rows)}
    assert set(table) == {"TransformerConv", "TransformerConv (edge_index) compiled"}
    assert table["TransformerConv"][-2] == "0.60x"  # compiled PyG (3 ms) over 5 ms
    assert table["TransformerConv (edge_index) compiled"][4:8] == ["6.00", "4", "3.00", "4"]
    assert table["TransformerConv (edge_index) compiled"][-2] == "1.50x"
