"""The package's shape, read from its source: no module over 500 lines (benchmarks/: 600), no import
cycle among sparseattn's modules nor among benchmarks/' (function-level imports included), and no
module that imports or reads another sub-package's underscore names."""

import ast
import pathlib
from typing import Dict, List, Set, Tuple

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = REPO / "sparseattn"
MAX_LINES = {"sparseattn": 500, "benchmarks": 600}


def _modules(root: pathlib.Path) -> Dict[str, pathlib.Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules(ROOT)
BENCHMARKS = _modules(REPO / "benchmarks")
MODULES_OF = {"sparseattn": MODULES, "benchmarks": BENCHMARKS}


def _package(module: str, modules: Dict[str, pathlib.Path]) -> str:
    """The package a module belongs to (a package's __init__ belongs to itself)."""
    return module if modules[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _resolve(module: str, node: ast.ImportFrom, modules: Dict[str, pathlib.Path]) -> str:
    if not node.level:
        return node.module or ""
    base = _package(module, modules).split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.AST, modules: Dict[str, pathlib.Path] = MODULES) -> List[Tuple[str, str]]:
    """(imported module, imported name or "") for every import statement at any depth."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, modules)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, "") if sub in modules else (target, alias.name))
    return [(m, n) for m, n in out if m in modules]


def _defined_private(tree: ast.AST) -> Set[str]:
    """Underscore (not dunder) names a module defines: functions, classes, names and self/cls attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)  # (an attribute set on another object is that object's)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


TREES = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}


@pytest.mark.parametrize("package", list(MODULES_OF))
def test_no_module_over_the_line_limit(package):
    limit = MAX_LINES[package]
    long = {m: n for m, p in MODULES_OF[package].items() if (n := len(p.read_text().splitlines())) > limit}
    assert not long, f"modules over {limit} lines: {long}"


@pytest.mark.parametrize("package", list(MODULES_OF))
def test_no_import_cycle(package):
    modules = MODULES_OF[package]
    trees = TREES if package == "sparseattn" else {m: ast.parse(p.read_text()) for m, p in modules.items()}
    graph = {m: sorted({t for t, _ in _imports(m, tree, modules) if t != m}) for m, tree in trees.items()}
    # a package's __init__ importing its own modules is how a package is built, not a cycle through them
    edges = {
        m: [t for t in ts if not (modules[m].name == "__init__.py" and t.startswith(m + "."))]
        for m, ts in graph.items()
    }
    cycles: List[List[str]] = []
    state: Dict[str, int] = {}

    def visit(m: str, stack: List[str]) -> None:
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _external_names(tree: ast.AST) -> Set[str]:
    """Names a module binds to other libraries (`import torch`, `from torch import nn`): attributes
    read from them are theirs (torch._check), not another sub-package's."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("sparseattn")}
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("sparseattn"):
            names |= {a.asname or a.name for a in node.names}
    return names


def test_no_underscore_names_across_packages():
    private_of: Dict[str, Set[str]] = {}
    for m, tree in TREES.items():
        private_of.setdefault(_package(m, MODULES), set()).update(_defined_private(tree))
    offences = []
    for m, tree in TREES.items():
        own, external = private_of[_package(m, MODULES)], _external_names(tree)
        for target, name in _imports(m, tree):
            if name.startswith("_") and _package(target, MODULES) != _package(m, MODULES):
                offences.append(f"{m} imports {target}.{name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in external:
                    continue
                owners = [p for p, names in private_of.items() if node.attr in names and p != _package(m, MODULES)]
                if owners and node.attr not in own:
                    offences.append(f"{m}:{node.lineno} reads .{node.attr} (defined in {', '.join(owners)})")
    assert not offences, "\n".join(offences)


BACKENDS = ("csr", "dense", "local", "triton", "small", "scatter")  # kernels/<name>.py or kernels/<name>/


def _backend_of(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "kernels" and parts[2] in BACKENDS else ""


def test_no_backend_imports_another():
    """What two backends share lives in a module of kernels/ that is no backend (triton_common, guard,
    contract, op_spec, and the reference, the definition every backend may recompute through); the
    registry (kernels/__init__.py) wires them together, as the guard's fallback to csr."""
    offences = [
        f"{m} imports {t}"
        for m, tree in TREES.items()
        if _backend_of(m)
        for t, _ in _imports(m, tree)
        if _backend_of(t) and _backend_of(t) != _backend_of(m)
    ]
    assert not offences, "\n".join(offences)
