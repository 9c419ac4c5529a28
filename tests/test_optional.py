"""The tests' handling of optional dependencies (tests/optional.py, tests/doc_blocks.py): a missing
backend, module or docs import shows as a SKIPPED line with its reason, only on the cases that need
it, and leaves the number of collected tests unchanged; any other failed import fails."""

import re
import subprocess
import sys

from sparseattn.kernels import _BACKENDS

from . import optional
from .doc_blocks import ROOT, Block, missing_optional, run_python

# the files whose cases depend on optional backends or modules, and the packages hidden from them
FILES = [
    "tests/test_equivalence.py",
    "tests/kernels/test_index_layouts.py",
    "tests/kernels/test_gqa.py",
    "tests/kernels/test_edge_terms.py",
    "tests/kernels/test_double_backward.py",
    "tests/kernels/test_sharp_bf16.py",
    "tests/distributed/test_sharded.py",
]
HIDDEN = ("torch_scatter", "triton", "pymetis")
# pytest with the named packages hidden: `import torch_scatter` raises and find_spec finds nothing
HIDING_PYTEST = (
    "import sys; [sys.modules.__setitem__(m, None) for m in sys.argv[1].split(',') if m]; "
    "import pytest; sys.exit(pytest.main(sys.argv[2:]))"
)


def _pytest(*args, hide=()):
    cmd = [sys.executable, "-c", HIDING_PYTEST, ",".join(hide), "-p", "no:cacheprovider", *args]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode in (0, 5), res.stdout[-3000:] + res.stderr[-3000:]  # 5: nothing selected
    return res.stdout


def _hide_scatter(monkeypatch):
    """torch_scatter missing, for the registry's own probe (asked again, restored after the test)."""
    monkeypatch.setitem(sys.modules, "torch_scatter", None)
    monkeypatch.setattr(_BACKENDS["scatter"], "_probed", False)
    monkeypatch.setattr(_BACKENDS["scatter"], "_unavailable", None)


def test_a_missing_backend_is_kept_and_skipped_with_the_probes_reason(monkeypatch):
    _hide_scatter(monkeypatch)
    params = optional.backend_params(["reference", "scatter"])
    assert [p.id for p in params] == ["reference", "scatter"]
    (mark,) = params[1].marks
    assert mark.name == "skipif" and mark.args == (True,)
    assert re.match(r"backend 'scatter' is not available: torch_scatter is not importable", mark.kwargs["reason"])
    assert params[0].marks[0].args == (False,)


def test_every_backend_taking_the_device_is_listed_whether_or_not_it_runs(monkeypatch):
    _hide_scatter(monkeypatch)
    names = [p.id for p in optional.backend_params()]
    assert "scatter" in names and "csr" in names and "triton" not in names  # triton takes CUDA tensors only
    assert [p.id for p in optional.backend_params(device="cuda")][-1] == "triton"
    (skip,) = [p for p in optional.backend_params(skip={"csr": "why"}) if p.id == "csr"][0].marks[1:]
    assert skip.name == "skip" and skip.kwargs == {"reason": "why"}


def test_a_missing_module_skips_with_the_extra_that_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)
    assert optional.module_missing("pymetis") == "pymetis is not installed (extra sparseattn[metis])"
    mark = optional.needs_module("pymetis")
    assert mark.args == (True,) and mark.kwargs["reason"] == optional.module_missing("pymetis")


def test_docs_blocks_skip_only_for_a_known_optional_package_that_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_scatter", None)
    error = "Traceback ...\nModuleNotFoundError: No module named '{}'\n"
    assert missing_optional(error.format("torch_scatter")) == optional.module_missing("torch_scatter")
    assert missing_optional(error.format("torhc")) is None  # a misspelled import fails
    assert missing_optional(error.format("sparseattn.graph")) is None
    monkeypatch.setitem(optional.OPTIONAL, "json", "none")
    assert missing_optional(error.format("json.nosuch")) is None  # installed: the block is wrong
    assert missing_optional("ValueError: bad\n") is None


def test_a_docs_block_with_a_misspelled_import_fails(tmp_path):
    res = run_python(Block(ROOT / "README.md", 1, "python", "import torhc\n", None), tmp_path)
    assert res.returncode != 0 and "torhc" in res.stderr and missing_optional(res.stderr) is None


def test_hidden_dependencies_skip_with_reasons_and_collect_the_same_tests():
    """The files that list backends, run with torch_scatter, triton and pymetis hidden: as many tests
    as with them (a case used to vanish from the list, or test_sharded.py skip as one module); the
    cases that need them report SKIPPED with the reason (only those selected here run)."""
    (collected,) = re.findall(r"(\d+) tests? collected", _pytest("--collect-only", "-q", *FILES))
    selection = (
        "test_eps_gives or metis_parts or test_destination_major_pairs_in_every_layout and triton"
        " or test_equal_to_one_process and window-contiguous-scatter-clamp-float64-terms_none"
    )
    out = _pytest("-q", "-rs", "-k", selection, *FILES, hide=HIDDEN)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|deselected|failed|error)", out)}
    assert "failed" not in counts and "error" not in counts, out[-3000:]
    assert sum(counts.values()) == int(collected), out[-3000:]
    for reason in (
        r"test_edge_terms\.py:\d+: backend 'scatter' is not available: torch_scatter is not importable",
        r"test_index_layouts\.py:\d+: backend 'triton' is not available: triton is not importable",
        r"test_sharded\.py:\d+: pymetis is not installed \(extra sparseattn\[metis\]\)",
        r"test_sharded\.py:\d+: backend 'scatter' is not available",
    ):
        assert re.search(r"SKIPPED \[\d+\] tests/\S*" + reason, out), f"no SKIPPED line for {reason}:\n{out[-3000:]}"
    assert counts["passed"] == 2  # the eps test on reference and csr; every other selected case needs what is hidden
