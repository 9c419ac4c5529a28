"""The benchmark pages (docs/benchmarks/) and mkdocs.yml's benchmark nav are what benchmarks/pages
renders from the stored results, the registry and the templates, every stored result is on a page and
records its commit and command, every results file is named by the convention, and a new benchmark is
its script plus one registry line."""

import json
import os
import re
import shutil
import subprocess

import pytest

from benchmarks import harness, pages
from benchmarks.harness import ROOT, machine_tag
from benchmarks.pages import registry
from benchmarks.pages.registry import Bench
from benchmarks.records import Result

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
        assert parsed is not None, (
            f"{name}: not bench_<name>_<machine>[_<variant>].{{json,png,log}} of a benchmark in"
            " benchmarks/pages/registry.py, nor a probe's log"
        )
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


def test_the_nav_lists_the_registered_pages():
    with open(pages.MKDOCS) as f:
        config = f.read()
    for line in pages.nav_entries():
        assert f"      {line}\n" in config, f"mkdocs.yml: nav line `{line}` missing: run `python -m benchmarks.pages`"
    assert pages.with_nav(config) == config, "mkdocs.yml: benchmark nav out of order: run `python -m benchmarks.pages`"


def test_registry_lines_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="lowercase"):
        Bench("Foo-bar", "Foo")
    monkeypatch.setattr(registry, "BENCHES", (*registry.BENCHES, Bench("layers", "Layers again")))
    with pytest.raises(ValueError, match="registered twice"):
        pages.generate()


def test_a_new_benchmark_is_its_script_and_one_registry_line(tmp_path, monkeypatch, capsys):
    """bench_foo's run, written through the harness as a script writes it, and one registry line
    make its page (the run's header, its rows as a table, its other stored table and its plot), its
    index line and its nav entry: no template, renderer or other file."""
    results, docs, mkdocs = tmp_path / "results", tmp_path / "docs", tmp_path / "mkdocs.yml"
    mkdocs.write_text(open(pages.MKDOCS).read())
    monkeypatch.setattr(pages, "RESULTS", str(results))
    monkeypatch.setattr(pages, "DOCS", str(docs))
    monkeypatch.setattr(pages, "MKDOCS", str(mkdocs))
    monkeypatch.setattr(registry, "BENCHES", (*registry.BENCHES, Bench("foo", "Foo")))
    assert not os.path.exists(os.path.join(pages.TEMPLATES, "foo.md"))

    out = harness.Output("benchmarks.bench_foo", ["--quick"], str(results), _info())
    rows = [
        Result("windows", 17000, "csr", "fwd", ms=1.234, times_ms=[1.2, 1.234, 1.3, 1.25, 1.22], peak_extra_mib=12.5),
        Result("windows", 17000, "dense", "fwd", note="out of memory"),
    ]
    out.log("a line of the log")
    out.save({"reps": 5, "families": ["windows"] * 9}, rows, summary={"csr": {"speedup": 3.25, "note": ""}})
    with open(out.png, "wb") as f:
        f.write(b"\x89PNG not really")
    out.close()  # prints the page's section: the tables the renderer will show
    table = "| windows | 17,000 | csr | fwd | 1.23 | 12.5 |  |\n"
    table += "| windows | 17,000 | dense | fwd | – | – | out of memory |"
    assert table in capsys.readouterr().out

    assert pages.main([]) == 0
    stem = f"bench_foo_{machine_tag(_info())}"
    page = (docs / "foo.md").read_text()
    assert page.startswith("# Foo\n\n## AMD EPYC (AVX512), 1 thread, no GPU\n")
    assert re.search(r"\n- Command: `([A-Z_]+=\S+ )*python -m benchmarks\.bench_foo --quick`\n", page)
    assert re.search(r"\n- Measured: 2026-11-24 09:00 UTC, commit .+, load average [0-9.-]+\n", page)
    assert f"\n- Files: `{pages.RESULTS_REL}/{stem}.json`, `.log`, `.png`\n" in page
    assert "Settings: `reps=5`." in page  # a long list stays out, as the times per rep do
    assert "| `family` | `edges` | `contender` | `mode` | `ms` | `peak_extra_mib` | `note` |" in page
    assert "| --- | ---: | --- | --- | ---: | ---: | --- |\n" + table in page
    assert "`summary`:\n\n|  | `speedup` |\n| --- | ---: |\n| `csr` | 3.25 |" in page
    assert f"![{stem}](img/{stem}.png)" in page and (docs / "img" / f"{stem}.png").read_bytes() == b"\x89PNG not really"
    index = (docs / "index.md").read_text()
    assert "- [Foo](foo.md), AMD EPYC (AVX512), 1 thread, no GPU, 2026-11-24: see the page\n" in index
    assert "- [Kernels: edge attention per graph family](kernels.md): no stored run yet" in index
    nav = "\n      - Several processes: benchmarks/distributed.md\n      - Foo: benchmarks/foo.md\n"
    assert nav + "      # benchmark pages: end\n" in mkdocs.read_text()
    assert pages.main(["--check"]) == 0


def test_a_registry_line_may_name_its_tables_and_headline(tmp_path, monkeypatch, capsys):
    """A line's `tables` and `headline` replace the default ones; a stale nav fails --check, naming the line."""
    info = _info()
    stem = f"bench_foo_bar_{machine_tag(info)}_small"
    with open(tmp_path / f"{stem}.json", "w") as f:
        json.dump({"commit": "c" * 40, "command": "python -m benchmarks.bench_foo_bar", "machine": info}, f)
    line = Bench("foo_bar", "Foo: bar", lambda run: [f"{run.variant} tables"], lambda group: "2x faster")
    monkeypatch.setattr(registry, "BENCHES", (line, *registry.BENCHES))
    made, stems = pages.generate(str(tmp_path))
    assert stems == [stem] and pages.parse_name(stem + ".json")["bench"] == "bench_foo_bar"
    page = made["foo_bar.md"].decode()
    assert page.startswith("# Foo: bar\n") and "### Variant `small`" in page and "\nsmall tables\n" in page
    assert "](foo_bar.md), AMD EPYC (AVX512), 1 thread, no GPU, 2026-11-24: 2x faster" in made["index.md"].decode()
    monkeypatch.setattr(pages, "MKDOCS", str(tmp_path / "mkdocs.yml"))
    with open(pages.MKDOCS, "w") as f:
        f.write(open(os.path.join(ROOT, "mkdocs.yml")).read())
    assert pages.main(["--check"]) == 1
    assert 'missing `- "Foo: bar": benchmarks/foo_bar.md`' in capsys.readouterr().out
