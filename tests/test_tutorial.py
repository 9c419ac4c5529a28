"""docs/tutorial.ipynb: its code is the code of its jupytext source docs/tutorial.py; README's "Learn"
command, exactly as README gives it, runs the source top to bottom at the small sizes
(SPARSEATTN_TUTORIAL_SMALL=1) without a cell raising; and the `[tutorial]` extra holds everything
that command and the tutorial import (a venv with only that extra runs it)."""

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTEBOOK, SOURCE = DOCS / "tutorial.ipynb", DOCS / "tutorial.py"
README = ROOT / "README.md"
TIMEOUT = 900  # small mode takes about 2 minutes on 2 busy cores


def code_cells(nb):
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def learn_command() -> str:
    """README's line that executes the tutorial headless (in its "Learn" section)."""
    section = README.read_text(encoding="utf-8").split("## Learn", 1)[1].split("\n## ", 1)[0]
    (line,) = [ln for ln in section.splitlines() if "jupytext" in ln and "--execute" in ln]
    return line.split("#", 1)[0].strip()


def test_notebook_matches_its_source():
    nbformat = pytest.importorskip("nbformat", reason="the tutorial test needs the test extra (nbformat)")
    jupytext = pytest.importorskip("jupytext", reason="the tutorial test needs the test extra (jupytext)")
    stored = nbformat.read(NOTEBOOK, as_version=4)
    source = jupytext.read(SOURCE)
    assert code_cells(stored) == code_cells(source), (
        "docs/tutorial.ipynb and docs/tutorial.py differ: edit the .py, then "
        "`jupytext --sync docs/tutorial.py` and re-execute the notebook"
    )
    assert all(c.get("outputs") is not None for c in stored.cells if c.cell_type == "code")


def test_readme_learn_command_runs_in_small_mode(tmp_path):
    pytest.importorskip("jupytext", reason="README's Learn command needs the tutorial extra (jupytext)")
    pytest.importorskip("nbconvert", reason="README's Learn command needs the tutorial extra (nbconvert)")
    nbformat = pytest.importorskip("nbformat", reason="README's Learn command needs the tutorial extra (nbformat)")
    command = learn_command()
    assert command.startswith("python -m jupytext --to ipynb --execute docs/tutorial.py -o "), command
    output = tmp_path / re.search(r"-o (\S+)", command).group(1)
    # the command as written, run from a folder holding docs/tutorial.py, so its notebook lands there
    (tmp_path / "docs").mkdir()
    shutil.copy(SOURCE, tmp_path / "docs" / "tutorial.py")
    env = dict(os.environ, SPARSEATTN_TUTORIAL_SMALL="1")
    env.pop("MPLBACKEND", None)  # the kernel's inline backend: figures become PNG outputs
    # `python` is this interpreter, and so is the notebook's kernel ("python3"): a kernelspec found
    # first on JUPYTER_PATH, whatever other kernels the machine has installed
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    env["JUPYTER_PATH"] = str(tmp_path / "jupyter")
    res = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert res.returncode == 0, f"README's Learn command failed:\n{command}\n{res.stdout[-2000:]}\n{res.stderr[-6000:]}"
    nb = nbformat.read(output, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"cells raised: {[e.ename for e in errors]}"
    assert any("SMALL" in o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    images = sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert images >= 8, f"expected the tutorial's figures as PNG outputs, got {images}"


def _requirement_names(requirements):
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_tutorial_extra_holds_what_the_learn_command_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = _requirement_names(project["optional-dependencies"]["tutorial"])
    base = _requirement_names(project["dependencies"])
    # `python -m jupytext --execute` runs nbconvert's ExecutePreprocessor in an ipykernel
    assert {"jupytext", "nbconvert", "ipykernel"} <= extra, f"the tutorial extra lacks the executor: {extra}"
    imported = set()
    for node in ast.walk(ast.parse(SOURCE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    distributions = importlib.metadata.packages_distributions()
    third_party = imported - set(sys.stdlib_module_names) - {"sparseattn"}
    needed = {d.lower().replace("_", "-") for m in third_party for d in distributions.get(m, [m])}
    missing = needed - extra - base
    assert not missing, f"docs/tutorial.py imports {sorted(missing)}, which the tutorial extra does not install"
