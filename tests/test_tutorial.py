"""docs/tutorial.ipynb: its code is the code of its jupytext source docs/tutorial.py, and it runs top
to bottom at the small sizes (SPARSEATTN_TUTORIAL_SMALL=1) without a cell raising."""

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the tutorial test needs the test extra (nbformat)")
nbclient = pytest.importorskip("nbclient", reason="the tutorial test needs the test extra (nbclient)")
jupytext = pytest.importorskip("jupytext", reason="the tutorial test needs the test extra (jupytext)")
pytest.importorskip("ipykernel", reason="the tutorial test needs the test extra (ipykernel)")
pytest.importorskip("matplotlib", reason="the tutorial draws figures")
pytest.importorskip("tqdm", reason="the tutorial shows progress bars")

DOCS = Path(__file__).resolve().parent.parent / "docs"
NOTEBOOK, SOURCE = DOCS / "tutorial.ipynb", DOCS / "tutorial.py"
KERNEL = "sparseattn-tutorial-python"


def code_cells(nb):
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def test_notebook_matches_its_source():
    stored = nbformat.read(NOTEBOOK, as_version=4)
    source = jupytext.read(SOURCE)
    assert code_cells(stored) == code_cells(source), (
        "docs/tutorial.ipynb and docs/tutorial.py differ: edit the .py, then "
        "`jupytext --sync docs/tutorial.py` and re-execute the notebook"
    )
    assert all(c.get("outputs") is not None for c in stored.cells if c.cell_type == "code")


def test_notebook_runs_in_small_mode(monkeypatch, tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("SPARSEATTN_TUTORIAL_SMALL", "1")
    # a kernelspec for this interpreter, so the notebook runs where sparseattn is installed, whatever
    # kernels the machine has (an installed "python3" spec may name another python)
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "sparseattn tutorial",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the cell if any cell fails
    images = sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert images >= 8, f"expected the tutorial's figures as PNG outputs, got {images}"
