"""The prose a reader meets first: the guide (docs/guide/), the home page (docs/index.md) and the
README.

- No process words: issue or pull-request numbers, "this round", "closing note", "session", "target
  ratios" and the like belong in commit messages and the changelog, not in the docs.
- No hand-typed timings in the guide (milliseconds, speed ratios such as 1.6x): a measured figure
  lives in benchmarks/results/ and reaches the reader through the pages `python -m benchmarks.pages`
  generates in docs/benchmarks/, which the guide links, so it cannot drift from its run. Code spans
  and code blocks are exempt (a comment there is not a claim about a run); thresholds that are code
  constants are sizes, not timings, and do not match.
- docs/index.md is current: it links every guide page and API page and names every registered
  backend and every `sparseattn.nn` export; the backends guide's table has a row per backend and the
  nn guide names every export.
"""

import re

import pytest

import sparseattn.kernels
import sparseattn.nn
from tests.doc_blocks import ROOT

DOCS = ROOT / "docs"
GUIDE = sorted((DOCS / "guide").glob("*.md"))
INDEX = DOCS / "index.md"
README = ROOT / "README.md"
PROSE = [*GUIDE, INDEX, README]

PROCESS_WORDS = [
    r"\bissues?\s*#?\d+",  # "issue 46", "issues #12"
    r"(?<![\w&/#])#\d{2,}\b",  # "#57" (an issue or pull-request number; not "&#123;" or a URL)
    r"\b(?:PR|pull request)\s*#?\d+",
    r"\bclosing notes?\b",
    r"\bthis (?:round|session)\b",
    r"\bsessions?\b",
    r"\btarget ratios?\b",
]

TIMINGS = [
    r"\b\d+(?:[.,]\d+)*\s?(?:ms|µs|us)\b",  # 2.75 ms, 1,565 ms
    r"\b\d+\.\d+\s?[x×](?![\w(])",  # 1.6x, 0.92×, 1.2-1.8x
    r"\b\d+(?:\.\d+)?\s?(?:[x×]|times) (?:faster|slower)\b",  # 10x slower, 3 times faster
]

# (page name, exact text) pairs a check may let through, each with its reason; keep it short.
ALLOWED = {
    # e.g. ("backends.md", "..."): "a code constant written out",
}


def _strip_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked out (each keeps its line
    breaks, or becomes one space), so line numbers still hold."""

    def blank(m):
        return "\n" * m.group(0).count("\n") or " "

    text = re.sub(r"^(```|~~~).*?^\1[ \t]*$", blank, text, flags=re.M | re.S)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", blank, text, flags=re.S)


def _hits(path, patterns, text):
    """'page:line: match' for every match of `patterns` in `text` (line numbers of `text`) not allowed."""
    found = []
    for pattern in patterns:
        for m in re.finditer(pattern, text, flags=re.I):
            if (path.name, m.group(0)) in ALLOWED:
                continue
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    return found


def _without_urls(text: str) -> str:
    return re.sub(r"https?://\S+", " ", text)


@pytest.mark.parametrize("path", PROSE, ids=[str(p.relative_to(ROOT)) for p in PROSE])
def test_no_process_words(path):
    hits = _hits(path, PROCESS_WORDS, _without_urls(path.read_text(encoding="utf-8")))
    assert not hits, "process words belong in commit messages and CHANGELOG.md, not the docs:\n" + "\n".join(hits)


@pytest.mark.parametrize("path", GUIDE, ids=[p.name for p in GUIDE])
def test_guide_links_measured_figures_instead_of_typing_them(path):
    hits = _hits(path, TIMINGS, _strip_code(path.read_text(encoding="utf-8")))
    assert not hits, (
        "a measured figure typed into the guide drifts from its run: state the finding in words and link "
        "the benchmark page (docs/benchmarks/, generated from benchmarks/results/) where the figure lives:\n"
        + "\n".join(hits)
    )


def test_timing_patterns_catch_typed_figures_and_spare_code():
    """The checks above are only as good as their patterns: these must (not) match."""
    typed = "local ran 2.81x faster (555 ms), 1.2-1.8x in fwd+bwd; 10x slower under load; 1,565 ms"
    kept = "a 128×128 block, 2^18 values, 65,536 gathered values, 8 MiB, `took 1.5x` in code, 25% extra"
    assert len(re.findall("|".join(TIMINGS), typed, flags=re.I)) == 5
    assert not re.findall("|".join(TIMINGS), _strip_code(kept), flags=re.I)
    assert re.search("|".join(PROCESS_WORDS), "see issue 46 (#57), this round's closing note", flags=re.I)
    assert not re.search("|".join(PROCESS_WORDS), "[the math](math.md#edge-terms), &#123; 2^18 (E, H)", flags=re.I)


def _index_text():
    return INDEX.read_text(encoding="utf-8")


def test_index_links_every_guide_and_api_page():
    text = _index_text()
    missing = [f"guide/{p.name}" for p in GUIDE if f"(guide/{p.name})" not in text]
    missing += [f"api/{p.name}" for p in sorted((DOCS / "api").glob("*.md")) if f"(api/{p.name})" not in text]
    assert not missing, f"docs/index.md does not link {missing}"


def registered_by_the_library(backend) -> bool:
    """Not a backend the tests register for themselves (tests/conftest.py's "csr-head-major")."""
    return backend.fn.__module__.startswith("sparseattn")


def test_index_and_guides_name_every_backend():
    backends = [
        name
        for name in sparseattn.kernels.backend_names()
        if name != "auto" and registered_by_the_library(sparseattn.kernels.registered_backend(name))
    ]
    text = _index_text()
    rows = (DOCS / "guide" / "backends.md").read_text(encoding="utf-8")
    missing = [name for name in backends if f"`{name}`" not in text]
    assert not missing, f"docs/index.md does not name the backends {missing}"
    missing = [name for name in backends if f"\n| `{name}` |" not in rows]
    assert not missing, f"docs/guide/backends.md's table has no row for {missing}"


def test_index_and_nn_guide_name_every_layer():
    names = list(sparseattn.nn.__all__)
    guide = (DOCS / "guide" / "nn.md").read_text(encoding="utf-8")
    missing = [name for name in names if f"`{name}" not in _index_text()]
    assert not missing, f"docs/index.md does not name the sparseattn.nn exports {missing}"
    missing = [name for name in names if f"`{name}" not in guide]
    assert not missing, f"docs/guide/nn.md does not name the sparseattn.nn exports {missing}"
