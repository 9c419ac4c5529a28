"""The chunking task on the shared training CLI (`train --task chunking --model tagger|bilstm`) and its
chunk metrics (conlleval-style, via seqeval)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from sparseattn.train.cli import main
from sparseattn.train.config import make_config
from sparseattn.train.tasks import get_task
from sparseattn.train.tasks.chunking import chunk_f1, chunk_scores

SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "conll_sample.txt"
GOLD = [["B-NP", "I-NP", "O", "B-VP", "I-VP", "B-NP"], ["B-PP", "B-NP", "I-NP"]]

TINY = [
    "--device=cpu",  # the recorded numbers and exact-resume checks are CPU runs
    "--word_dim",
    "8",
    "--pos_dim",
    "4",
    "--caps_dim",
    "2",
    "--char_out",
    "4",
    "--dev_fraction",
    "0.25",
    "--max_tokens",
    "20",
    "--progress",
    "false",
]
TINY_MODEL = {
    "tagger": ["--d_model", "8", "--num_heads", "2", "--num_layers", "1", "--d_ff", "16"],
    "bilstm": ["--lstm_hidden", "8"],
}  # each model rejects the other's keys


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data" / "conll2000"
    d.mkdir(parents=True)
    shutil.copy(SAMPLE, d / "train.txt")
    shutil.copy(SAMPLE, d / "test.txt")
    return str(tmp_path / "data")


def test_task_batches_and_loss(data_dir):
    cfg = make_config({"task": "chunking", "model": "tagger", "data_dir": data_dir, "dev_fraction": 0.25})
    task = get_task("chunking")
    task.setup(cfg)
    assert task.num_examples("train") == 6 and task.num_examples("valid") == 2 and task.num_examples("test") == 8
    batch = task.make_batch("test", [0, 1])
    assert batch.lengths.tolist() == [7, 3]
    assert cfg.task_cfg.data_dir == data_dir and cfg.task_cfg.dev_fraction == 0.25
    groups = task.batch_indices("train", cfg, 0)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(sum(len(task.splits["train"][i]) for i in g) <= cfg.run.max_tokens or len(g) == 1 for g in groups)
    loss, stats = task.loss(cfg.model_cfg.build(task.model_info()), task.make_batch("train", groups[0]), cfg)
    assert torch.isfinite(loss) and loss.item() > 0


@pytest.mark.parametrize("model", ["tagger", "bilstm"])
def test_train_evaluate_resume_on_the_sample(data_dir, tmp_path, capsys, model):
    out = str(tmp_path / "run")
    args = [
        "train",
        "--task",
        "chunking",
        "--model",
        model,
        "--data_dir",
        data_dir,
        "--out",
        out,
        *TINY,
        *TINY_MODEL[model],
    ]
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
    assert (
        main(
            [
                "train",
                "--task",
                "chunking",
                "--model",
                model,
                "--data_dir",
                data_dir,
                "--out",
                out_b,
                *TINY,
                *TINY_MODEL[model],
                "--epochs",
                "1",
            ]
        )
        == 0
    )
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


def test_chunking_without_a_data_dir_is_a_one_line_error(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--task",
                "chunking",
                "--model",
                "bilstm",
                "--out",
                str(tmp_path / "x"),
                *TINY,
                *TINY_MODEL["bilstm"],
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "task chunking needs --data-dir" in err and len(err.strip().splitlines()) == 1


def test_perfect_prediction_scores_one():
    assert chunk_f1(GOLD, GOLD) == 1.0
    scores = chunk_scores(GOLD, GOLD)
    assert scores["overall"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 5}
    assert scores["NP"]["support"] == 3


def test_known_wrong_prediction_matches_hand_computed_scores():
    # gold chunks: NP[0:2] VP[3:5] NP[5] | PP[0] NP[1:3]                         -> 5
    pred = [["B-NP", "B-NP", "O", "B-VP", "I-VP", "O"], ["B-PP", "I-VP", "I-NP"]]
    # pred chunks (conlleval: an I-X that does not continue an X chunk starts one):
    #   NP[0] NP[1] VP[3:5] | PP[0] VP[1] NP[2]                                 -> 6
    # correct: VP[3:5], PP[0]                                                    -> 2
    p, r = 2 / 6, 2 / 5
    assert chunk_f1(GOLD, pred) == pytest.approx(2 * p * r / (p + r))  # 4/11
    scores = chunk_scores(GOLD, pred)
    assert scores["overall"]["precision"] == pytest.approx(p)
    assert scores["overall"]["recall"] == pytest.approx(r)
    assert scores["NP"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 3}
    assert scores["VP"]["precision"] == pytest.approx(0.5) and scores["VP"]["recall"] == 1.0
    assert set(scores) == {"overall", "NP", "VP", "PP"}


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="sentence 1"):
        chunk_f1(GOLD, [GOLD[0], GOLD[1][:2]])
    with pytest.raises(ValueError, match="gold has 2 sentences but pred has 1"):
        chunk_scores(GOLD, GOLD[:1])
