"""The benchmark pages, rendered from the stored results: python -m benchmarks.pages [--check]

A benchmark is its script, `benchmarks/bench_<name>.py` (writing through `harness.Output`), and one
`Bench(name, title)` line in `registry.BENCHES`; the rest follows from that line. Each
`benchmarks/results/bench_<name>_<machine>[_<variant>].json` (machine: the harness's `machine_tag`,
variant: a run's `--tag`) goes on `docs/benchmarks/<name>.md`, its PNG into `docs/benchmarks/img/`;
`index.md` gets one headline per benchmark and machine and mkdocs.yml's nav one entry per benchmark
(the lines between its `# benchmark pages: begin` and `# benchmark pages: end` comments), both in the
registry's order. The tables are the line's renderer's, or by default (`generic.py`) each run's rows
and other stored values as they are. The prose is in `benchmarks/templates/<name>.md` (first line:
the title; `snippet(name)` reads one; none: the line's title and the runs) with placeholders
`{{ runs }}` (this package's tables), `{{ headlines }}` (index.md) and `{{ log:<stem> }}` (a kept probe
log, `probe_<name>_<machine>[_<variant>].log`, quoted). Every number, commit and command comes from the
JSON files. --check: exit 1 if a page, an image or the nav differs from what the renderer makes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..records import RESULTS, ROOT
from . import common, registry
from .common import RESULTS_REL, Run, join, machine_desc, sections
from .generic import run_tables
from .registry import Bench

__all__ = ["RESULTS", "RESULTS_REL", "Bench", "existing", "generate", "load_runs", "main", "parse_name", "preview"]
DOCS = os.path.join(ROOT, "docs", "benchmarks")
TEMPLATES = os.path.join(ROOT, "benchmarks", "templates")
MKDOCS = os.path.join(ROOT, "mkdocs.yml")
PLACEHOLDER = re.compile(r"\{\{ *([a-z_]+)(?::([^ }]+))? *\}\}")
NAV = re.compile(r"^([ \t]*)# benchmark pages: begin[^\n]*\n(.*?)^[ \t]*# benchmark pages: end", re.M | re.S)


def parse_name(filename: str) -> Optional[Dict[str, str]]:
    """bench, machine, variant ("" for the default run) and ext of a results file, or None (not a
    registered benchmark's run, nor a probe's log)."""
    return common.parse_name(filename, registry.names())


def load_runs(results: str = RESULTS) -> List[Run]:
    """The registered benchmarks' runs stored in `results`."""
    return common.load_runs(results, registry.names())


def snippet(name: str) -> str:
    """The text of `templates/<name>.md`."""
    return Path(TEMPLATES, name + ".md").read_text().strip("\n")


def template(page: str) -> str:
    """The page's template, or without one its registry title over its runs."""
    if os.path.exists(os.path.join(TEMPLATES, page + ".md")):
        return snippet(page)
    return f"# {registry.bench(page).title}\n\n{{{{ runs }}}}"


def title(page: str) -> str:
    return template(page).splitlines()[0].lstrip("# ")


def fill(text: str, values: Dict[str, str], results: str) -> str:
    """The template with each `{{ name }}` replaced by values[name] and each `{{ log:<stem> }}` by
    the quoted log `<results>/<stem>.log` (or a line saying it is not stored); an unknown
    placeholder is an error."""

    def one(m: re.Match) -> str:
        name, arg = m.group(1), m.group(2)
        if name == "log" and arg:
            if not os.path.exists(os.path.join(results, arg + ".log")):
                return f"`{RESULTS_REL}/{arg}.log`: not stored."
            return f"`{RESULTS_REL}/{arg}.log`:\n\n```text\n{Path(results, arg + '.log').read_text().rstrip()}\n```"
        if name not in values or arg:
            raise KeyError(f"template placeholder {m.group(0)} has no value (known: {sorted(values)}, log:<stem>)")
        return values[name].strip("\n")

    return join([PLACEHOLDER.sub(one, text)])


def render(page: str, runs: List[Run]) -> Tuple[List[str], Dict[str, str]]:
    """The page's parts made from its runs, and its headline per machine."""
    if not runs:
        return [
            f"No stored run yet. `python -m benchmarks.bench_{page}` writes"
            f" `{RESULTS_REL}/bench_{page}_<machine>.json`; `python -m benchmarks.pages` then fills this page."
        ], {}
    bench = registry.bench(page)
    if bench.page is not None:
        return bench.page(runs, snippet)
    return sections(runs, bench.tables or run_tables, bench.headline or (lambda group: ""))


def index_page(heads: Dict[str, Dict[str, str]], runs: List[Run], results: str) -> str:
    items = []
    for page in registry.names():
        for machine, line in heads.get(page, {}).items():
            run = next(r for r in runs if r.page == page and r.machine == machine)
            date = run.info["date"].split(" ")[0]
            items.append(f"- [{title(page)}]({page}.md), {machine_desc(run.info)}, {date}: {line or 'see the page'}")
        if not heads.get(page):
            items.append(f"- [{title(page)}]({page}.md): no stored run yet")
    return fill(snippet("index"), {"headlines": "\n".join(items)}, results)


def generate(results: str = RESULTS) -> Tuple[Dict[str, bytes], List[str]]:
    """{path relative to docs/benchmarks: content} for every page and image, and the stems of the
    JSON files the pages use."""
    runs = load_runs(results)
    out: Dict[str, bytes] = {}
    heads: Dict[str, Dict[str, str]] = {}
    for page in registry.names():
        parts, heads[page] = render(page, [r for r in runs if r.page == page])
        out[f"{page}.md"] = fill(template(page), {"runs": join(parts)}, results).encode()
    out["index.md"] = index_page(heads, runs, results).encode()
    out.update({f"img/{run.stem}.png": Path(results, run.stem + ".png").read_bytes() for run in runs if run.png})
    return out, [r.stem for r in runs]


def _yaml(text: str) -> str:
    """A nav title as a YAML scalar: quoted where plain YAML would read it otherwise."""
    plain = re.fullmatch(r"[A-Za-z0-9(][^:#{}\[\],&*!|>'\"%@`]*", text) and text == text.strip()
    return text if plain else json.dumps(text)


def nav_entries() -> List[str]:
    """mkdocs.yml's nav entry of each benchmark page, in the registry's order."""
    return [f"- {_yaml(b.title)}: benchmarks/{b.name}.md" for b in registry.benches()]


def with_nav(config: str) -> str:
    """mkdocs.yml's text with the lines between its `# benchmark pages: begin` and `end` comments
    replaced by `nav_entries()`, indented as the begin comment is."""
    m = NAV.search(config)
    if m is None:
        raise ValueError("mkdocs.yml: no `# benchmark pages: begin` ... `# benchmark pages: end` block in its nav")
    block = "".join(f"{m.group(1)}{line}\n" for line in nav_entries())
    return config[: m.start(2)] + block + config[m.end(2) :]


def preview(path: str) -> str:
    """The page's section for one results JSON, `<out>/bench_<bench>_....json` (a run just written):
    what a benchmark prints at its end, the tables its page will show."""
    stem = os.path.basename(path)[: -len(".json")]
    bench = max((b for b in registry.names() if stem.startswith(f"bench_{b}_")), key=len)
    run = Run(stem, bench, "", "", json.loads(Path(path).read_text()), png=False, log=False)
    return join(render(run.page, [run])[0])


def existing(docs: str = DOCS) -> Dict[str, bytes]:
    """What is in docs/benchmarks now: its pages and images."""
    files = [p for p in sorted(Path(docs).glob("*.md")) + sorted(Path(docs, "img").glob("*")) if p.is_file()]
    return {str(p.relative_to(docs)): p.read_bytes() for p in files}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 if a page, image or the nav differs")
    args = ap.parse_args(argv)
    pages, _ = generate(RESULTS)
    have = existing(DOCS)
    stale = sorted(set(have) - set(pages))
    changed = sorted(p for p in pages if have.get(p) != pages[p])
    config = Path(MKDOCS).read_text()
    nav = with_nav(config)
    if args.check:
        for p in changed + stale:
            print(f"docs/benchmarks/{p}: {'differs from' if p in pages else 'not made by'} the renderer")
        if nav != config:
            old, new = config.splitlines(), nav.splitlines()
            diff = [f"missing `{x.strip()}`" for x in new if x not in old]
            diff += [f"not registered `{x.strip()}`" for x in old if x not in new] or ["out of order"] * (not diff)
            print(f"mkdocs.yml: benchmark nav not the registry's ({', '.join(diff)}): run python -m benchmarks.pages")
        return 1 if changed or stale or nav != config else 0
    os.makedirs(os.path.join(DOCS, "img"), exist_ok=True)
    for p in changed:
        Path(DOCS, p).write_bytes(pages[p])
    for p in stale:
        os.remove(os.path.join(DOCS, p))
    if nav != config:
        Path(MKDOCS).write_text(nav)
    print(
        f"docs/benchmarks: {len(changed)} written, {len(stale)} removed, {len(pages) - len(changed)} unchanged;"
        f" mkdocs.yml nav {'rewritten' if nav != config else 'unchanged'}"
    )
    return 0
