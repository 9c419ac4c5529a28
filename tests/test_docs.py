"""The documentation: the site builds with `mkdocs build --strict` (warnings, such as a broken link or
a docstring the API reference cannot parse, are errors); the API reference pages name every public
object; every public function, class and method has a docstring; and the guide's Python blocks run
as they stand, each on its own (blocks marked `<!-- docs-test: skip (reason) -->` excepted; the
pages other people own, docs/guide/distributed.md and docs/benchmarks/, are theirs to test)."""

import importlib
import inspect
import subprocess
import sys
import time

import pytest

from tests.doc_blocks import ROOT, blocks, missing_optional, run_python

DOCS = ROOT / "docs"
PUBLIC_MODULES = [
    "sparseattn",
    "sparseattn.graphs",
    "sparseattn.nn",
    "sparseattn.models",
    "sparseattn.kernels",
    "sparseattn.distributed",
]
GUIDE_PAGES = [DOCS / "index.md", *sorted(p for p in (DOCS / "guide").glob("*.md") if p.name != "distributed.md")]
GUIDE_BLOCKS = [b for page in GUIDE_PAGES for b in blocks(page, "python")]


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="building the docs needs the docs (or test) extra: mkdocs")
    pytest.importorskip("mkdocstrings", reason="building the docs needs the docs (or test) extra: mkdocstrings")
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml")]
        + ["--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - start
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    assert (tmp_path / "site" / "api" / "sparseattn" / "index.html").is_file()
    html = (tmp_path / "site" / "api" / "sparseattn" / "index.html").read_text(encoding="utf-8")
    assert "edge_attention" in html and "N_dst" in html, "the API reference lacks edge_attention's docstring"
    print(f"mkdocs build --strict: {seconds:.1f} s")


def _public_objects():
    """(qualified name, object) of every name in the public modules' __all__, submodules and
    constants excepted."""
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or name.startswith("__"):
                continue
            yield f"{modname}.{name}", obj


def _resolve(dotted):
    """The object a `::: a.b.c` identifier names."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_api_reference_covers_the_public_api():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    documented = {line.split(":::", 1)[1].strip() for line in pages.splitlines() if line.startswith(":::")}
    documented_ids = {id(_resolve(name)) for name in documented}  # also checks every entry resolves
    missing = [name for name, obj in _public_objects() if name not in documented and id(obj) not in documented_ids]
    assert not missing, f"docs/api/*.md has no `::: name` entry for {missing}"


def _own_callables(cls):
    """Public methods and properties a class defines itself, as (name, function)."""
    for name, attr in vars(cls).items():
        if name.startswith("_"):
            continue
        fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
        fn = fn.fget if isinstance(fn, property) else fn
        if inspect.isfunction(fn):
            yield name, fn


def test_public_api_has_docstrings():
    missing, seen = [], set()
    for qualname, obj in _public_objects():
        if id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # constants and type aliases: described where they are defined
        seen.add(id(obj))
        if not inspect.getdoc(obj) or (inspect.isclass(obj) and vars(obj).get("__doc__") is None):
            missing.append(qualname)
        if inspect.isclass(obj):
            missing += [f"{qualname}.{name}" for name, fn in _own_callables(obj) if fn.__doc__ is None]
    assert not missing, f"public callables without a docstring: {missing}"


@pytest.mark.parametrize("block", GUIDE_BLOCKS, ids=[b.id for b in GUIDE_BLOCKS])
def test_guide_python_block_runs_on_its_own(block, tmp_path):
    if block.skip is not None:
        pytest.skip(block.skip)
    res = run_python(block, tmp_path)
    if res.returncode and missing_optional(res.stderr):
        pytest.skip(f"{block.id}: {missing_optional(res.stderr)}")
    assert res.returncode == 0, f"{block.id} failed run on its own:\n{res.stderr[-3000:]}"
