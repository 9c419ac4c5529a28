"""README.md as a newcomer meets it: every ```python block runs as it stands, on its own, in a fresh
interpreter; the two marked commands keep the shape a newcomer and `.ci/run` rely on (their pip
lines are not run here); every extra the README names exists; every local link resolves. The
"Learn" command runs in tests/test_tutorial.py."""

import re
import shlex
import subprocess
import sys

import pytest

from tests.doc_blocks import ROOT, blocks, missing_optional, run_python

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
PYTHON_BLOCKS = blocks(README, "python")


def marked_command(marker: str) -> str:
    """The one-line command in the code block right after `<!-- marker -->`."""
    lines = TEXT.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == f"<!-- {marker} -->"]
    assert lines[at + 1] == "```bash", f"{marker}: expected a ```bash fence on the line after the marker"
    end = lines.index("```", at + 2)
    body = [line for line in lines[at + 2 : end] if line.strip()]
    assert len(body) == 1, f"{marker}: expected one command line, got {body}"
    return body[0]


def steps(command: str):
    """`a && b && c` -> [argv of a, argv of b, argv of c]."""
    return [shlex.split(part) for part in command.split(" && ")]


def test_readme_is_short():
    assert len(TEXT.splitlines()) <= 250, "README.md is for a five-minute read: move detail to docs/"


def test_readme_has_python_blocks():
    assert PYTHON_BLOCKS, "README.md lost its tour"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block_runs_on_its_own(block, tmp_path):
    assert block.skip is None, "README's Python blocks all run: no docs-test skip marker here"
    res = run_python(block, tmp_path)
    if res.returncode and missing_optional(res.stderr):
        pytest.skip(f"README.md:{block.line}: {missing_optional(res.stderr)}")
    assert res.returncode == 0, f"README.md:{block.line} failed run on its own:\n{res.stderr[-3000:]}"


def test_main_command():
    install_torch, install, train = steps(marked_command("main-command"))
    assert install_torch[:3] == ["pip", "install", "torch==2.13.0"]
    assert install[:3] == ["pip", "install", "-e"] and install[3] == ".[train]"
    assert train[:2] == ["sparseattn", "train"], "the main command trains with the installed `sparseattn` command"
    assert "sparseattn" in PYPROJECT["project"]["scripts"]
    args = dict(zip(train[2::2], train[3::2]))
    assert args.get("--task") == "copy" and args.get("--out")
    presets = ROOT / "sparseattn" / "train" / "presets"
    assert (presets / f"{args['--task']}-transformer.toml").is_file(), "the main command's task has a preset"


def test_test_command_is_what_ci_runs():
    command = marked_command("test-command")
    parsed = subprocess.run(
        ["bash", "-c", "source <(sed -n '/^cmd=/p' .ci/run) && printf %s \"$cmd\""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert parsed == command, ".ci/run extracts another command than README's test command"
    argvs = steps(command)
    assert argvs[0][:3] == ["pip", "install", "torch==2.13.0"]
    assert ["pip", "install", "-e", ".[test,lint]"] in argvs
    checks = [a for a in argvs if a[0] != "pip"]
    assert checks == [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"], ["python", "-m", "pytest"]]
    pinned = {a[2] for a in argvs if a[:2] == ["pip", "install"] and a[2].startswith("torch==")}
    main_pin = steps(marked_command("main-command"))[0][2]
    assert pinned == {main_pin}, "the main and test commands install the same torch"


def test_slow_tests_have_a_documented_command():
    """The tests marked slow, which the default run leaves out (setup.cfg's `-m "not slow"`), run with
    the command README gives (a `-m` on the command line overrides the one in addopts: the last wins)."""
    (argv,) = steps(marked_command("slow-test-command"))
    assert argv == ["python", "-m", "pytest", "-m", "slow"], argv
    setup = (ROOT / "setup.cfg").read_text(encoding="utf-8")
    assert '-m "not slow"' in setup and re.search(r"^\s+slow:", setup, re.M), "setup.cfg changed: update README"
    marked = re.compile(r"^@pytest\.mark\.slow$|^pytestmark\b.*\bslow\b", re.M)
    assert any(marked.search(p.read_text(encoding="utf-8")) for p in (ROOT / "tests").rglob("test_*.py")), (
        "no test is marked slow any more: drop README's command"
    )


def test_extras_named_in_readme_exist():
    named = set()
    for group in re.findall(r"(?:\.|sparseattn)\[([a-z_,]+)\]", TEXT):
        named.update(group.split(","))
    assert named, "README names no extras?"
    missing = sorted(named - set(EXTRAS))
    assert not missing, f"README names extras pyproject.toml lacks: {missing}"


def test_cpu_torch_note():
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in TEXT
    assert "torch>=2.4" in TEXT and any(d.startswith("torch>=2.4") for d in PYPROJECT["project"]["dependencies"])


def test_local_links_resolve():
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", TEXT):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (ROOT / target.split("#")[0]).exists():
            missing.append(target)
    assert not missing, f"README.md links to missing files: {missing}"
