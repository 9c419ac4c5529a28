"""The benchmark pages (docs/benchmarks/) are what benchmarks/tables.py makes of the stored results,
every stored result is on a page, and every results file is named by the convention."""

import json
import os
import re
import shutil

from benchmarks import tables
from benchmarks.harness import machine_tag


def test_committed_pages_and_images_equal_the_generator():
    made, _ = tables.generate()
    have = tables.existing()
    assert sorted(have) == sorted(made), "run `python -m benchmarks.tables`: pages or images missing or stale"
    differ = [path for path in made if have[path] != made[path]]
    assert not differ, f"run `python -m benchmarks.tables`: {differ} differ from the stored results"


def test_every_result_is_on_a_page():
    made, stems = tables.generate()
    pages = b"".join(text for path, text in made.items() if path.endswith(".md")).decode()
    files = os.listdir(tables.RESULTS)
    for name in files:
        stem = name.rsplit(".", 1)[0]
        if name.endswith(".json"):
            assert stem in stems and f"{tables.RESULTS_REL}/{stem}.json" in pages, f"{name} is on no page"
        elif stem.startswith("probe_"):
            assert stem in tables.PROBES and f"{tables.RESULTS_REL}/{stem}.log" in pages, f"{name} is on no page"
        else:  # a run's plot or log comes with its JSON
            assert stem + ".json" in files, f"{name} has no JSON beside it"
    for stem in tables.PROBES:
        assert stem + ".log" in files, f"tables.PROBES names {stem}.log, which is not stored"


def test_results_follow_the_naming_convention():
    for name in sorted(os.listdir(tables.RESULTS)):
        parsed = tables.parse_name(name)
        assert parsed is not None, f"{name}: not <bench>_<machine>[_<variant>].{{json,png,log}}"
        assert parsed["ext"] == "log" or parsed["bench"].startswith("bench_"), f"{name}: a probe keeps a log only"
        history = {"rerun", "earlier", "old", "new", "current", "targeted", "recheck", "final", "final2", "run"}
        words = set(parsed["variant"].split("-")) | set(parsed["machine"].split("-"))
        assert "torch" not in name and not words & history, f"{name}: versions and history stay out of names"
        if parsed["ext"] == "json":
            with open(os.path.join(tables.RESULTS, name)) as f:
                info = json.load(f)["machine"]
            assert machine_tag(info) == parsed["machine"], f"{name}: its JSON says machine {machine_tag(info)}"


def test_recorded_commits_belong_to_stored_runs():
    """A KNOWN entry names the commit of one run: a new run under the same name needs its own."""
    for stem, known in tables.KNOWN.items():
        path = os.path.join(tables.RESULTS, stem + ".json")
        assert os.path.exists(path), f"tables.KNOWN names {stem}, which is not stored"
        with open(path) as f:
            date = json.load(f)["machine"]["date"]
        assert date == known.date, f"{stem} was run again ({date}): record its commit in tables.KNOWN"


def test_links_resolve():
    made, _ = tables.generate()
    for path, text in made.items():
        if not path.endswith(".md"):
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text.decode()):
            assert not target.startswith(("/", "..")), f"{path} links outside docs/benchmarks: {target}"
            assert target in made, f"{path} links to {target}, which the generator does not make"


def test_a_new_distributed_run_fills_its_page(tmp_path):
    """bench_distributed's JSON (per-rank rows and a summary) becomes a section of distributed.md."""
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
    with open(tmp_path / f"{stem}.json", "w") as f:
        json.dump({"machine": info, "config": {}, "summary": summary, "results": results}, f)
    shutil.copy(os.path.join(tables.RESULTS, "bench_layers_amd-epyc-1t-cpu.json"), tmp_path)
    made, stems = tables.generate(str(tmp_path))
    page = made["distributed.md"].decode()
    assert stem in stems and f"{tables.RESULTS_REL}/{stem}.json" in page
    assert "`window-contiguous-P4`" in page and "0.40x" in page and "no stored run" not in page
    assert "distributed.md), AMD EPYC" in made["index.md"].decode()
