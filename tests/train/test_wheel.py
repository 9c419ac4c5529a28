"""The wheel a user installs. Built from a copy of the source files (not the checkout, whose build/
folder could leak stale modules into it), installed into a fresh venv and run from a folder away
from the source tree: it holds the presets, py.typed, LICENSE and the `sparseattn` launcher; the
installed package, not the editable checkout, is what runs; `sparseattn configs` lists every preset;
and a one-epoch copy run trains with the preset's values, not the dataclass defaults.

The venv reuses this interpreter's site-packages as plain path entries (torch, numpy, ... are not
installed again; the editable install's finder is not loaded) and pip installs the wheel into it
with `--ignore-installed`, so a sparseattn installed outside is neither used nor touched. About
15 s on 2 cores."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparseattn.train.config import RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "sparseattn" / "train" / "presets").glob("*.toml"))
# what setuptools reads to build the wheel (MANIFEST.in only if there is one)
SOURCES = ["sparseattn", "sparseattn_launcher.py", "pyproject.toml", "setup.cfg", "README.md", "LICENSE", "MANIFEST.in"]
TIMEOUT = 300


def _env():
    """The caller's environment without anything that would put the source tree on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(argv, cwd, **kw):
    res = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, **kw
    )
    assert res.returncode == 0, f"{argv} exited {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """sparseattn-*.whl built without build isolation (no network: the installed setuptools)."""
    pytest.importorskip("setuptools", minversion="77", reason="building the wheel needs setuptools >= 77 (PEP 639)")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        elif path.is_file():
            shutil.copy2(path, src / name)
    dist = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, src], src
    )
    (whl,) = dist.glob("sparseattn-*.whl")
    return whl


def _outer_site_dirs():
    """The site-packages folders this interpreter imports torch, numpy, pip, ... from. Named in a
    .pth file of the new venv they are plain path entries: their own .pth files, the editable
    install's finder among them, are not run there. (`venv --system-site-packages` would instead
    give the base interpreter's folders, not those of a venv the tests may run in, and load the
    editable finder.)"""
    dirs = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.name in ("site-packages", "dist-packages") and path.is_dir() and not path.is_relative_to(ROOT):
            dirs.append(str(path))
    return list(dict.fromkeys(dirs))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """(python, sparseattn command, site-packages) of a fresh venv with the wheel installed."""
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", root], root)
    bindir = root / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", code], root).stdout.strip())
    (site / "_outer_site_packages.pth").write_text("\n".join(_outer_site_dirs()) + "\n")
    # the outer pip, run by the venv's python, installs into the venv; --ignore-installed: a
    # sparseattn installed outside it is left as it is
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", wheel], root)
    return python, bindir / ("sparseattn.exe" if os.name == "nt" else "sparseattn"), site


def test_the_wheel_holds_the_presets_py_typed_license_and_launcher(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert PRESETS, "sparseattn/train/presets/ holds the presets"
    shipped = sorted(n for n in names if n.startswith("sparseattn/train/presets/"))
    assert shipped == [f"sparseattn/train/presets/{p.name}" for p in PRESETS]
    assert "sparseattn/py.typed" in names and "sparseattn_launcher.py" in names
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as z:
        assert "MIT License" in z.read(license_file).decode()
        metadata = z.read(meta).decode()
        assert "sparseattn = sparseattn_launcher:main" in z.read(entry).decode()
    assert "License-Expression: MIT" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/", "docs/"))]


def test_the_installed_wheel_runs_not_the_checkout(venv, tmp_path):
    python, _, site = venv
    code = (
        "import json, sparseattn, sparseattn_launcher, sparseattn.train.config as c;"
        "print(json.dumps([sparseattn.__file__, sparseattn_launcher.__file__, str(c.presets_dir())]))"
    )
    files = json.loads(_run([python, "-c", code], tmp_path).stdout)
    for file in files:
        assert Path(file).resolve().is_relative_to(site.resolve()), f"{file} is not from the wheel ({site})"
        assert not Path(file).resolve().is_relative_to(ROOT), file


def test_configs_lists_every_preset(venv, tmp_path):
    _, command, _ = venv
    out = _run([command, "configs"], tmp_path).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert listed == [p.name for p in PRESETS]


def test_a_copy_run_trains_with_the_presets_values(venv, tmp_path):
    _, command, _ = venv
    preset = tomllib.loads((ROOT / "sparseattn" / "train" / "presets" / "copy-transformer.toml").read_text())
    assert preset["run"]["batch_size"] != RunConfig().batch_size, "the preset must differ from the defaults"
    flags = ["--epochs=1", "--num_train=48", "--num_valid=8", "--num_test=8", "--seq_mean=5", "--seq_std=1"]
    flags += ["--device=cpu", "--progress=false", "--plots=false"]  # no preset sets these
    _run([command, "train", "--task", "copy", "--out", tmp_path / "run", *flags], tmp_path)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["task"], saved["model"]) == ("copy", "transformer")
    assert saved["run"]["epochs"] == 1  # the flag over the preset's 6
    for key, value in preset["run"].items():
        if key != "epochs":
            assert saved["run"][key] == value, key
    for key, value in preset["model"].items():
        if key != "name":
            assert saved["model_config"][key] == value, key
    assert (tmp_path / "run" / "checkpoint.pt").is_file()
