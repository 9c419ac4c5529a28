import json
import shutil

import pytest
import torch

from sparseattn.__main__ import main
from sparseattn.tagging_train import TaggingConfig, load_checkpoint, parse_overrides, train

from .models.tagging_helpers import SAMPLE

TINY = ["--word_dim", "8", "--pos_dim", "4", "--caps_dim", "2", "--char_out", "4", "--dim", "8", "--heads", "2",
        "--layers", "1", "--ffn_dim", "16", "--hidden", "8", "--dev_fraction", "0.25", "--max_tokens", "20"]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data" / "conll2000"
    d.mkdir(parents=True)
    shutil.copy(SAMPLE, d / "train.txt")
    shutil.copy(SAMPLE, d / "test.txt")
    return str(tmp_path / "data")


def tiny_config(data_dir, out, model="tagger", **kw):
    return TaggingConfig(**{**parse_overrides(TINY), "model": model, "data_dir": data_dir, "out": str(out), **kw})


def test_parse_overrides_types_and_rejects_unknown_keys():
    assert parse_overrides(["--lr=0.01", "--use-chars", "false", "--window", "3", "--model", "bilstm"]) == \
        {"lr": 0.01, "use_chars": False, "window": 3, "model": "bilstm"}
    with pytest.raises(SystemExit, match="unknown config key 'lrr'"):
        parse_overrides(["--lrr", "1"])
    with pytest.raises(SystemExit, match="expects int"):
        parse_overrides(["--epochs", "two"])
    with pytest.raises(ValueError, match="model must be one of"):
        TaggingConfig(model="crf")


@pytest.mark.parametrize("model", ["tagger", "bilstm"])
def test_cli_trains_checkpoints_and_evaluates(data_dir, tmp_path, capsys, model):
    out = tmp_path / "run"
    assert main(["train-tagger", "--model", model, "--data-dir", data_dir, "--out", str(out), "--epochs", "2",
                 *TINY]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and 0.0 <= records[-1]["dev_f1"] <= 1.0
    assert (out / "last.pt").is_file() and (out / "best.pt").is_file()
    assert not list(out.glob("*.tmp"))
    scores = tmp_path / "scores.json"
    assert main(["evaluate-tagger", "--checkpoint", str(out / "last.pt"), "--data-dir", data_dir,
                 "--output", str(scores)]) == 0
    assert "overall" in capsys.readouterr().out
    assert set(json.loads(scores.read_text())["overall"]) == {"precision", "recall", "f1", "support"}
    png = tmp_path / "dev_f1.png"
    assert main(["plot-tagger", "--run", f"{model}={out}", "--output", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_resumed_equals_uninterrupted(data_dir, tmp_path):
    train(tiny_config(data_dir, tmp_path / "a", epochs=3))
    train(tiny_config(data_dir, tmp_path / "b", epochs=1))
    assert main(["train-tagger", "--resume", "--out", str(tmp_path / "b"), "--epochs", "3"]) == 0
    _, _, a, state_a = load_checkpoint(str(tmp_path / "a" / "last.pt"))
    _, _, b, state_b = load_checkpoint(str(tmp_path / "b" / "last.pt"))
    assert state_a["epoch"] == state_b["epoch"] == 3 and state_a["step"] == state_b["step"]
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


def test_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        train(tiny_config(str(tmp_path), tmp_path / "run"))
