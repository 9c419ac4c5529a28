"""Typed configs: flags to sections, presets from TOML files, help text for every key, checked
ranges, and the flat configs of checkpoints written before the sections existed."""

import dataclasses

import pytest

from sparseattn.train.cli import main
from sparseattn.train.config import (
    MODEL_CONFIGS,
    TASK_CONFIGS,
    RunConfig,
    build_config,
    config_from_dict,
    describe,
    list_presets,
    make_config,
    parse_clamp,
    parse_flags,
    with_overrides,
)


def test_flags_go_to_their_sections_with_their_types():
    cfg = make_config(
        parse_flags(
            [
                "--task=sort",
                "--model",
                "ut",
                "--epochs=3",
                "--num_train",
                "50",
                "--clamp=-3,4",
                "--progress=false",
                "--plots",
            ]
        ),
    )
    assert (cfg.task, cfg.model) == ("sort", "ut")
    assert cfg.run.epochs == 3 and cfg.run.progress is False and cfg.run.plots is True
    assert cfg.task_cfg.num_train == 50 and cfg.model_cfg.clamp == (-3.0, 4.0)


def test_unknown_and_mistyped_keys_are_errors_naming_them():
    with pytest.raises(ValueError, match=r"unknown config key 'epoch' .*; did you mean --epochs\?") as typo:
        make_config({"epoch": "3"})
    assert "batch_size" not in str(typo.value)  # a close match is named alone, not among every key
    with pytest.raises(ValueError, match="unknown config key 'zzz' .*valid keys: .*epochs"):
        make_config({"zzz": "3"})
    with pytest.raises(ValueError, match="--epochs expects int, got 'x'"):
        make_config({"epochs": "x"})
    with pytest.raises(ValueError, match="unknown config key 'd_model' for task 'chunking' and model 'bilstm'"):
        make_config({"task": "chunking", "model": "bilstm", "d_model": "8"})


@pytest.mark.parametrize(
    "text, want", [("none", None), ("exact", None), ("-5,5", (-5.0, 5.0)), ("3", (-3.0, 3.0)), ([-1, 2], (-1.0, 2.0))]
)
def test_clamp_is_a_pair_or_none_everywhere(text, want):
    assert parse_clamp("clamp", text) == want


@pytest.mark.parametrize("text", ["nan", "5,1", "1,2,3", "a,b", "inf", "0"])
def test_bad_clamps_are_rejected(text):
    with pytest.raises(ValueError, match="--clamp"):
        parse_clamp("clamp", text)


def test_a_preset_file_sets_values_and_flags_override_it(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        '# my preset\n[task]\nname = "reverse"\nnum_train = 77\n[run]\nepochs = 9\nwarmup = 50\n'
        '[model]\nname = "ut"\nd_ff = 96\nclamp = "none"\n'
    )
    cfg = make_config({"warmup": "60"}, str(path))
    assert (cfg.task, cfg.model) == ("reverse", "ut")
    assert cfg.task_cfg.num_train == 77 and cfg.run.epochs == 9 and cfg.run.warmup == 60
    assert cfg.model_cfg.d_ff == 96 and cfg.model_cfg.clamp is None
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nepochs = 'many'\n")
    with pytest.raises(ValueError, match="--epochs expects int"):
        make_config({}, str(bad))
    bad.write_text("epochs = 3\n")
    with pytest.raises(ValueError, match="unexpected entry 'epochs'"):
        make_config({}, str(bad))
    with pytest.raises(FileNotFoundError, match="nosuch.toml"):
        make_config({}, str(tmp_path / "nosuch.toml"))


def test_every_shipped_preset_loads_for_its_task_and_model():
    presets = list_presets()
    assert presets, "sparseattn/train/presets/ holds the presets"
    for name, about in presets:
        task, model = name[: -len(".toml")].split("-")
        cfg = make_config({"task": task, "model": model})
        assert about, f"{name} starts with a comment saying what it is"
        assert cfg.task == task and cfg.model == model


def test_every_key_has_help_text_type_and_default():
    for task in TASK_CONFIGS:
        for model in MODEL_CONFIGS:
            lines = describe(task, model)
            keys = [line.split("=")[0].strip() for line in lines if line.startswith("  --")]
            sections = [RunConfig, TASK_CONFIGS[task], MODEL_CONFIGS[model]]
            assert keys == [f"--{f.name}" for cls in sections for f in dataclasses.fields(cls)]
            for cls in sections:
                for f in dataclasses.fields(cls):
                    assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_train_help_lists_the_keys_of_the_chosen_task_and_model(capsys):
    assert main(["train", "--help", "--task", "chunking", "--model", "bilstm"]) == 0
    out = capsys.readouterr().out
    assert "--lstm_hidden=200" in out and "units per direction" in out and "--dev_fraction" in out
    assert "--act_max_steps" not in out


def test_configs_command_lists_the_presets(capsys):
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name, _ in list_presets())


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"epochs": "-1"}, "--epochs=-1: must be >= 0"),
        ({"num_train": "0"}, "--num_train=0: must be >= 1"),
        ({"max_steps": "-5"}, "--max_steps=-5: must be >= 0"),
        ({"lr_factor": "nan"}, "--lr_factor must be a number"),
        ({"lr_factor": "inf"}, "--lr_factor=inf: must be a finite number > 0"),
        ({"d_model": "0"}, "--d_model=0: must be in \\[1, 65536\\]"),
        ({"batch_size": "0"}, "--batch_size=0: must be >= 1"),
        ({"threads": "-3"}, "--threads=-3: must be >= 0"),
        ({"dropout": "1.5"}, r"--dropout=1.5: must be in \[0, 1\)"),
        ({"num_heads": "3"}, "--num_heads=3 must divide --d_model=128"),
        ({"backend": "fast"}, "--backend='fast': must be one of"),
    ],
)
def test_settings_out_of_range_are_rejected(flags, message):
    with pytest.raises(ValueError, match=message):
        make_config(flags)


def test_flat_configs_of_old_checkpoints_are_split_into_sections():
    flat = {
        "task": "chunking",
        "model": "tagger",
        "out": "runs/t",
        "d_model": 64,
        "num_heads": 4,
        "clamp": 0.0,
        "max_tokens": 500,
        "lstm_hidden": 99,
        "vocab_size": 8000,
        "dev_fraction": 0.2,
    }
    cfg = config_from_dict(flat)
    assert cfg.model_cfg.d_model == 64 and cfg.model_cfg.clamp is None  # 0 meant exact softmax
    assert cfg.run.max_tokens == 500 and cfg.task_cfg.dev_fraction == 0.2
    assert config_from_dict({"task": "copy", "model": "transformer", "clamp": 5.0}).model_cfg.clamp == (-5.0, 5.0)
    assert config_from_dict({"task": "chunking", "model": "bilstm", "d_model": 64}).run.lr_dim == 64
    assert config_from_dict(cfg.to_dict()) == cfg  # the sectioned form round-trips


def test_overrides_are_checked_again():
    cfg = build_config("copy", "transformer", {})
    assert with_overrides(cfg, {"epochs": "7"}).run.epochs == 7
    with pytest.raises(ValueError, match="--epochs=-2"):
        with_overrides(cfg, {"epochs": "-2"})
