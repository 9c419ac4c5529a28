"""`sparseattn train --help`: the values the run would use (the preset's, then the flags'), the
preset named, what a run folder holds, in aligned columns; `sparseattn --help` says it too."""

import dataclasses
import re

import pytest

from sparseattn.train.config import list_presets, make_config

from .cli_helpers import CLI_TINY, run_cli

ROW = re.compile(r"  --(\w+)=(\S*) +(\w+) +(?:(preset|flag|saved) +)?")


def rows(out):
    """{key: (value text, type, source or None)} of the help's key lines, and the lines themselves."""
    lines = [line for line in out.splitlines() if line.startswith("  --")]
    parsed = {}
    for line in lines:
        m = ROW.match(line)
        assert m, line
        parsed[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return parsed, lines


def flag_text(value):
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return str(value)


def preset_changes(task, model):
    """{key: (preset value, default)} of the keys the task/model preset sets to a non-default value."""
    cfg = make_config({"task": task, "model": model})
    return {
        f.name: (getattr(section, f.name), f.default)
        for section in cfg.sections().values()
        for f in dataclasses.fields(section)
        if getattr(section, f.name) != f.default
    }


def test_help_shows_the_values_of_the_preset_and_names_it(capsys):
    code, out, err = run_cli(["train", "--help", "--task", "sort", "--model", "ut"], capsys)
    assert code == 0 and not err
    changed = preset_changes("sort", "ut")
    # the examples: the preset runs 8 heads, d_ff 1024, exact softmax, 40 epochs
    assert {"num_heads", "d_ff", "clamp", "epochs"} <= set(changed)
    assert re.search(r"^preset: sort-ut\b", out, re.M), out
    shown, _ = rows(out)
    for key, (value, default) in changed.items():
        assert shown[key][0] == flag_text(value), (key, shown[key], value, default)
        assert shown[key][2] == "preset", (key, shown[key])
    assert shown["num_heads"][0] != "4" and shown["clamp"][0] == "none" and shown["epochs"][0] != "4"
    assert "[default: 4]" in next(line for line in out.splitlines() if line.startswith("  --num_heads="))
    untouched = shown["seed"]
    assert untouched == ("0", "int", None)  # a default: no source


@pytest.mark.parametrize("name, about", list_presets())
def test_help_of_every_preset_shows_its_values(capsys, name, about):
    task, model = name[: -len(".toml")].split("-")
    code, out, _ = run_cli(["train", "--help", "--task", task, "--model", model], capsys)
    assert code == 0 and f"preset: {task}-{model}" in out
    shown, _ = rows(out)
    for key, (value, _default) in preset_changes(task, model).items():
        assert shown[key][:3:2] == (flag_text(value), "preset"), key


def test_help_shows_flags_over_the_preset_and_a_config_file(tmp_path, capsys):
    code, out, _ = run_cli(["train", "--help", "--task=sort", "--model=ut", "--epochs=3", "--d_ff", "96"], capsys)
    shown, _ = rows(out)
    assert code == 0 and shown["epochs"] == ("3", "int", "flag") and shown["d_ff"] == ("96", "int", "flag")
    assert shown["num_heads"][2] == "preset"
    preset = tmp_path / "mine.toml"
    preset.write_text('[task]\nname = "reverse"\n[run]\nwarmup = 7\n[model]\nname = "transformer"\nclamp = "-4,3"\n')
    code, out, _ = run_cli(["train", "--help", "--config", preset, "--epochs=2"], capsys)
    shown, _ = rows(out)
    assert code == 0 and f"preset: {preset} (--config), task reverse, model transformer" in out
    assert shown["warmup"] == ("7", "int", "preset") and shown["clamp"] == ("-4,3", "clamp", "preset")
    assert shown["epochs"] == ("2", "int", "flag")


def test_help_without_a_preset_says_so(capsys):
    code, out, _ = run_cli(["train", "--help", "--task", "reverse"], capsys)
    shown, _ = rows(out)
    assert code == 0 and "preset: none for task reverse and model transformer" in out
    assert shown["epochs"] == ("4", "int", None) and shown["clamp"][0] == "-5,5"


def test_help_of_a_resume_shows_the_saved_values(copy_run, capsys):
    code, out, _ = run_cli(["train", "--help", f"--out={copy_run}", "--resume", "--epochs=5"], capsys)
    shown, _ = rows(out)
    assert code == 0 and f"resumes: {copy_run / 'checkpoint.pt'}" in out
    assert shown["d_model"] == ("16", "int", "saved") and shown["epochs"] == ("5", "int", "flag")


def test_help_columns_are_aligned_and_long_help_wraps_under_its_column(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    code, out, _ = run_cli(["train", "--help", "--task", "chunking", "--model", "bilstm"], capsys)
    assert code == 0
    _, lines = rows(out)
    type_at = {re.match(r"  \S+ +", line).end() for line in lines}
    help_at = {ROW.match(line).end() for line in lines}
    assert len(type_at) == 1 and len(help_at) == 1, (type_at, help_at)
    indent = help_at.pop()
    table = out[out.index("config keys:") :].splitlines()[1:]
    continued = [line for line in table if line.startswith(" ") and not line.startswith("  --")]
    assert continued and all(re.match(rf" {{{indent}}}\S", line) for line in continued), continued
    assert max(len(line) for line in table) <= 90


def test_help_says_what_a_run_folder_holds(capsys):
    for argv in (["train", "--help"], ["--help"]):
        code, out, _ = run_cli(argv, capsys)
        assert code == 0 and "run folder" in out and "trainer.py" not in out
        for name in ("config.json", "checkpoint.pt", "best.pt", "metrics.jsonl", "results.json", "plots/"):
            assert re.search(rf"^  {re.escape(name)} +\S", out, re.M), name


def test_help_with_a_bad_flag_is_one_line(capsys):
    code, _, err = run_cli(["train", "--help", "--task=copy", *CLI_TINY, "--epoch=3"], capsys)
    assert code == 2 and "did you mean --epochs?" in err and len(err.strip().splitlines()) == 1
