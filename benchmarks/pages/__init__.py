"""The benchmark pages, rendered from the stored results: python -m benchmarks.pages [--check]

Each `benchmarks/results/<bench>_<machine>[_<variant>].json` (machine: the harness's `machine_tag`,
variant: a run's `--tag`) goes on `docs/benchmarks/<page>.md`, its PNG into `docs/benchmarks/img/`, and
`index.md` gets one headline per benchmark and machine. The prose is in `benchmarks/templates/<page>.md`
(first line: the title; `snippet(name)` reads one) with placeholders `{{ runs }}` (this package's tables),
`{{ headlines }}` (index.md) and `{{ log:<stem> }}` (a kept probe log, `probe_<name>_<machine>[_<variant>].log`,
quoted). Every number, commit and command comes from the JSON files. --check: exit 1 if a page differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

from ..records import RESULTS, ROOT
from .common import BENCHES, RESULTS_REL, Run, join, load_runs, machine_desc, parse_name, sections
from .gpu_dist import distributed_headline, distributed_tables, page_triton_gpu
from .kernels import dgl_headline, dgl_table, page_kernels
from .models import layers_headline, layers_tables, page_compile, train_headline, train_table

__all__ = ["RESULTS", "RESULTS_REL", "existing", "generate", "load_runs", "main", "parse_name", "preview"]
DOCS = os.path.join(ROOT, "docs", "benchmarks")
TEMPLATES = os.path.join(ROOT, "benchmarks", "templates")
# page -> its renderer, (runs, snippet) -> (parts, headline per machine), or the (body, headline) of `sections`
PAGES: Dict[str, Union[Callable, Tuple[Callable, Callable]]] = {  # in the index's order
    "kernels": page_kernels,
    "layers": (layers_tables, layers_headline),
    "train": (train_table, train_headline),
    "compile": page_compile,
    "dgl": (dgl_table, dgl_headline),
    "triton_gpu": page_triton_gpu,
    "distributed": (distributed_tables, distributed_headline),
}
PLACEHOLDER = re.compile(r"\{\{ *([a-z_]+)(?::([^ }]+))? *\}\}")


def snippet(name: str) -> str:
    """The text of `templates/<name>.md`."""
    return Path(TEMPLATES, name + ".md").read_text().strip("\n")


def title(page: str) -> str:
    return snippet(page).splitlines()[0].lstrip("# ")


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
    how = PAGES[page]
    return sections(runs, *how) if isinstance(how, tuple) else how(runs, snippet)


def index_page(heads: Dict[str, Dict[str, str]], runs: List[Run], results: str) -> str:
    items = []
    for page in PAGES:
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
    for page in PAGES:
        parts, heads[page] = render(page, [r for r in runs if r.page == page])
        out[f"{page}.md"] = fill(snippet(page), {"runs": join(parts)}, results).encode()
    out["index.md"] = index_page(heads, runs, results).encode()
    out.update({f"img/{run.stem}.png": Path(results, run.stem + ".png").read_bytes() for run in runs if run.png})
    return out, [r.stem for r in runs]


def preview(path: str) -> str:
    """The page's section for one results JSON, `<out>/bench_<bench>_....json` (a run just written):
    what a benchmark prints at its end, the tables its page will show."""
    stem = os.path.basename(path)[: -len(".json")]
    bench = next(b for b in BENCHES if stem.startswith(f"bench_{b}_"))
    run = Run(stem, bench, "", "", json.loads(Path(path).read_text()), png=False, log=False)
    return join(render(run.page, [run])[0])


def existing(docs: str = DOCS) -> Dict[str, bytes]:
    """What is in docs/benchmarks now: its pages and images."""
    files = [p for p in sorted(Path(docs).glob("*.md")) + sorted(Path(docs, "img").glob("*")) if p.is_file()]
    return {str(p.relative_to(docs)): p.read_bytes() for p in files}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 if a page or image differs")
    args = ap.parse_args(argv)
    pages, _ = generate()
    have = existing()
    stale = sorted(set(have) - set(pages))
    changed = sorted(p for p in pages if have.get(p) != pages[p])
    if args.check:
        for p in changed + stale:
            print(f"docs/benchmarks/{p}: {'differs from' if p in pages else 'not made by'} the renderer")
        return 1 if changed or stale else 0
    os.makedirs(os.path.join(DOCS, "img"), exist_ok=True)
    for p in changed:
        Path(DOCS, p).write_bytes(pages[p])
    for p in stale:
        os.remove(os.path.join(DOCS, p))
    print(f"docs/benchmarks: {len(changed)} written, {len(stale)} removed, {len(pages) - len(changed)} unchanged")
    return 0
