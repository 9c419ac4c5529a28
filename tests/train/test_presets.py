"""Presets ship inside the package (sparseattn/train/presets, read with importlib.resources): each
file's name is its task and model, `--config NAME` picks one by name, a named preset that does not
exist is a one-line error naming the ones that do, and an install without them fails loudly instead
of training on the defaults. (tests/train/test_wheel.py checks them in an installed wheel.)"""

import sys
from importlib import resources
from pathlib import Path

import pytest

from sparseattn.train import config
from sparseattn.train.cli import main
from sparseattn.train.config import (
    RunConfig,
    list_presets,
    make_config,
    preset_file,
    preset_files,
    preset_path,
    read_toml,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESET_DIR = Path(__file__).resolve().parents[2] / "sparseattn" / "train" / "presets"
NAMES = sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def test_presets_are_read_from_the_package():
    assert NAMES, "sparseattn/train/presets/ holds the presets"
    assert list(preset_files()) == NAMES
    assert [name for name, _ in list_presets()] == [f"{n}.toml" for n in NAMES]
    assert str(config.presets_dir()) == str(resources.files("sparseattn.train").joinpath("presets"))


@pytest.mark.parametrize("name", NAMES)
def test_a_presets_file_name_is_its_task_and_model(name):
    data = tomllib.loads((PRESET_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    assert f"{data['task']['name']}-{data['model']['name']}" == name
    task, model = name.split("-")
    assert preset_path(task, model) is not None
    # the default preset of --task/--model, --config NAME and --config NAME.toml give the same config
    want = make_config({"task": task, "model": model}).to_dict()
    assert make_config({}, name).to_dict() == want
    assert make_config({}, f"{name}.toml").to_dict() == want


def test_the_default_preset_applies_and_flags_override_it():
    cfg = make_config({"task": "copy", "epochs": "2"})
    preset = read_toml("copy-transformer")
    assert cfg.run.batch_size == preset["batch_size"] != RunConfig().batch_size
    assert cfg.model_cfg.dropout == preset["dropout"] and cfg.run.epochs == 2


def test_a_pair_without_a_preset_runs_on_the_defaults():
    assert preset_path("copy", "ut") is None
    cfg = make_config({"task": "copy", "model": "ut"})
    assert cfg.run.epochs == RunConfig().epochs and cfg.run.batch_size == RunConfig().batch_size


def test_a_missing_named_preset_is_an_error_naming_the_presets(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"no preset 'nosuch'; presets: " + ", ".join(NAMES) + "$"):
        preset_file("nosuch")
    with pytest.raises(FileNotFoundError, match="--config nosuch: no such file, nor a preset"):
        make_config({}, "nosuch")
    assert main(["train", "--config", "sort-uut", f"--out={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sort-uut" in err and all(name in err for name in NAMES)
    assert not (tmp_path / "run").exists()
    # a path is a path: the old configs/ folder is not looked up as a preset name
    with pytest.raises(FileNotFoundError, match="configs/sort-ut.toml: no such file"):
        make_config({}, "configs/sort-ut.toml")


def test_a_file_beats_a_preset_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("sort-ut.toml").write_text('[task]\nname = "sort"\n[run]\nepochs = 3\n[model]\nname = "ut"\n')
    assert make_config({}, "sort-ut.toml").run.epochs == 3
    assert make_config({}, "sort-ut").run.epochs == read_toml(preset_file("sort-ut"))["epochs"]


def test_an_install_without_its_presets_fails_loudly(tmp_path, monkeypatch, capsys):
    """A wheel built without the package data used to list nothing (exit 0) and train on the
    defaults; now every command that reads presets says what is wrong."""
    monkeypatch.setattr(config, "presets_dir", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match="no presets in .*reinstall sparseattn"):
        make_config({"task": "copy"})
    assert main(["configs"]) == 2
    assert "reinstall sparseattn" in capsys.readouterr().err
    assert main(["train", "--task=copy", f"--out={tmp_path / 'run'}"]) == 2
    assert "no presets" in capsys.readouterr().err
    # a preset file given by path needs none of the shipped ones
    path = tmp_path / "mine.toml"
    path.write_text('[task]\nname = "copy"\n[run]\nepochs = 3\n')
    assert make_config({}, str(path)).run.epochs == 3
