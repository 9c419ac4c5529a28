import pytest

from sparseattn.train.cli import main

from .cli_helpers import CLI_M30K, CLI_TINY


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs with one torch thread (tests/conftest.py, `one_thread`)."""


@pytest.fixture(scope="session")
def copy_run(tmp_path_factory):
    """A finished tiny copy run (checkpoint.pt, best.pt)."""
    out = tmp_path_factory.mktemp("copy") / "run"
    assert main(["train", "--task=copy", f"--out={out}", *CLI_TINY]) == 0
    return out


@pytest.fixture(scope="session")
def m30k_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("m30k") / "run"
    assert main(["train", f"--out={out}", *CLI_M30K]) == 0
    return out
