"""Optional dependencies in the tests: a case that needs a missing one is collected and skipped with
the reason, so `pytest -ra` prints a SKIPPED line for it; nothing vanishes from the collection.

    @pytest.mark.parametrize("backend", backend_params())           # every backend that takes CPU tensors
    @pytest.mark.parametrize("backend", backend_params(["csr", "scatter"]))
    @needs_module("pymetis")

Backends are judged by the registry's own probe (`Backend.unavailable_reason`), modules by whether
they can be found. OPTIONAL names, once, every package outside torch and numpy that tests and
documented code may import, with the extra that installs it; a docs block failing to import anything
else fails (tests/doc_blocks.py)."""

from __future__ import annotations

import importlib.util
from typing import Dict, Iterable, Optional

import pytest

from sparseattn.kernels import _BACKENDS

# import name -> the extra of pyproject.toml that installs it
OPTIONAL: Dict[str, str] = {
    "torch_scatter": "scatter",
    "triton": "triton",
    "pymetis": "metis",
    "torch_geometric": "examples",
    "matplotlib": "plots",
    "tqdm": "train",
    "seqeval": "tagging",
    "tokenizers": "translate",
    "sacrebleu": "translate",
    "sklearn": "examples",
    "networkx": "examples",
    "datamol": "examples",
    "rdkit": "examples",
    "jupytext": "tutorial",
    "nbformat": "tutorial",
    "nbconvert": "tutorial",
    "nbclient": "tutorial",
    "mkdocs": "docs",
    "mkdocstrings": "docs",
}


def module_missing(name: str) -> Optional[str]:
    """Why the optional module `name` (a key of OPTIONAL) cannot be imported here, or None."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module entry set to None
        found = False
    return None if found else f"{name} is not installed (extra sparseattn[{OPTIONAL[name]}])"


def backend_missing(name: str) -> Optional[str]:
    """Why the registered backend `name` cannot run here (its probe's answer), or None; "auto" always runs."""
    if name == "auto":
        return None
    reason = _BACKENDS[name].unavailable_reason()
    return None if reason is None else f"backend {name!r} is not available: {reason}"


def needs_module(name: str) -> pytest.MarkDecorator:
    """Skip, with the reason, where the optional module `name` is missing."""
    reason = module_missing(name)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def needs_backend(name: str) -> pytest.MarkDecorator:
    """Skip, with the reason, where backend `name` cannot run."""
    reason = backend_missing(name)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def backend_param(name: str, *marks: pytest.MarkDecorator):
    """One backend as a pytest parameter (id = its name), skipped where it cannot run."""
    return pytest.param(name, marks=[needs_backend(name), *marks], id=name)


def backend_params(
    names: Optional[Iterable[str]] = None,
    *,
    device: str = "cpu",
    exclude: Iterable[str] = (),
    skip: Optional[Dict[str, str]] = None,
) -> list:
    """`names` (default: every registered backend that takes tensors on `device`, available here or
    not) as pytest parameters, each skipped where its dependencies are missing; `skip` maps names to
    a reason to skip them whatever is installed."""
    if names is None:
        names = [name for name, b in _BACKENDS.items() if device in b.devices]
    skip = skip or {}
    return [
        backend_param(n, *([pytest.mark.skip(reason=skip[n])] if n in skip else [])) for n in names if n not in exclude
    ]
