"""The chunking task on the shared training CLI: `train --task chunking --model tagger|bilstm`."""
import json
import shutil

import pytest
import torch

from sparseattn.__main__ import main
from sparseattn.config import make_config
from sparseattn.data.chunking import token_batches
from sparseattn.data.tasks import get_task

from .models.tagging_helpers import SAMPLE

TINY = ["--word_dim", "8", "--pos_dim", "4", "--caps_dim", "2", "--char_out", "4", "--d_model", "8",
        "--num_heads", "2", "--num_layers", "1", "--d_ff", "16", "--lstm_hidden", "8", "--dev_fraction", "0.25",
        "--max_tokens", "20", "--progress", "false"]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data" / "conll2000"
    d.mkdir(parents=True)
    shutil.copy(SAMPLE, d / "train.txt")
    shutil.copy(SAMPLE, d / "test.txt")
    return str(tmp_path / "data")


def test_token_batches_cover_every_sentence_within_budget():
    lengths = [5, 9, 3, 12, 1, 7]
    for seed in (None, 0, 1):
        groups = token_batches(lengths, 10, seed)
        assert sorted(i for g in groups for i in g) == list(range(6))
        assert all(sum(lengths[i] for i in g) <= 10 or len(g) == 1 for g in groups)
    assert token_batches(lengths, 10, 3) == token_batches(lengths, 10, 3)


def test_task_batches_and_loss(data_dir):
    cfg = make_config({"task": "chunking", "model": "tagger", "data_dir": data_dir, "dev_fraction": 0.25})
    task = get_task("chunking")
    task.setup(cfg)
    assert task.num_examples("train") == 6 and task.num_examples("valid") == 2 and task.num_examples("test") == 8
    batch = task.make_batch("test", [0, 1])
    assert batch.lengths.tolist() == [7, 3]
    assert cfg.window == 4 and cfg.ffn == "conv"  # the chunking preset


@pytest.mark.parametrize("model", ["tagger", "bilstm"])
def test_train_evaluate_resume_on_the_sample(data_dir, tmp_path, capsys, model):
    out = str(tmp_path / "run")
    args = ["train", "--task", "chunking", "--model", model, "--data_dir", data_dir, "--out", out, *TINY]
    assert main([*args, "--epochs", "2"]) == 0
    records = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    valid = [r for r in records if r["kind"] == "valid"]
    assert len(valid) == 2 and 0.0 <= valid[-1]["valid"]["f1"] <= 1.0
    test = json.load(open(f"{out}/results.json"))
    assert {"precision", "recall", "f1", "NP_f1", "token_accuracy"} <= set(test)
    assert f"test: chunk F1 {100 * test['f1']:.2f}" in capsys.readouterr().out
    # results.json holds the best validation epoch's test scores: evaluate those weights
    assert main(["evaluate", "--checkpoint", f"{out}/best.pt", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["f1"] == pytest.approx(test["f1"]) and "VP_precision" in scores
    # resumed == uninterrupted: train 1 epoch, resume to 2, same weights as the 2-epoch run
    out_b = str(tmp_path / "run_b")
    assert main(["train", "--task", "chunking", "--model", model, "--data_dir", data_dir, "--out", out_b, *TINY,
                 "--epochs", "1"]) == 0
    assert main(["train", "--out", out_b, "--resume", "--epochs", "2"]) == 0
    a = torch.load(f"{out}/checkpoint.pt", weights_only=False)["model"]
    b = torch.load(f"{out_b}/checkpoint.pt", weights_only=False)["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_chunking_needs_a_token_budget(data_dir):
    cfg = make_config({"task": "chunking", "model": "bilstm", "data_dir": data_dir, "max_tokens": 0})
    task = get_task("chunking")
    task.setup(cfg)
    with pytest.raises(ValueError, match="--max_tokens must be > 0"):
        task.batch_indices("train", cfg, 0)
