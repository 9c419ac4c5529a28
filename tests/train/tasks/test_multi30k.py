"""The multi30k task on the tiny sample: training, BLEU evaluation with a hypotheses file, the
translate command, the tokenizer travelling with the run; the shared
Multi30k files when present."""

import json
import os
import shutil

import numpy as np
import pytest

from sparseattn.train.cli import load_for_eval, main
from sparseattn.train.config import make_config, parse_flags
from sparseattn.train.trainer import Trainer

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(TESTS, "fixtures", "multi30k_sample")
SHARED = os.path.join(TESTS, "..", "..", "shared", "data", "multi30k")
TINY = [
    "--device=cpu",  # the recorded numbers and exact-resume checks are CPU runs
    "--task=multi30k",
    f"--data-dir={SAMPLE}",
    "--vocab_size=200",
    "--num_layers=1",
    "--d_model=32",
    "--d_ff=64",
    "--num_heads=2",
    "--max_tokens=64",
    "--epochs=2",
    "--progress=false",
    "--beam=2",
    "--warmup=10",
    "--checkpoint_every=0",
]


def test_train_evaluate_translate_on_sample(tmp_path, capsys):
    pytest.importorskip("tokenizers", reason="translation needs the 'translate' extra (tokenizers)")
    pytest.importorskip("sacrebleu", reason="BLEU needs the 'translate' extra (sacrebleu)")
    run = tmp_path / "run"
    assert main(["train", *TINY, f"--out={run}"]) == 0
    assert "test: BLEU" in capsys.readouterr().out
    assert (run / "tokenizer.json").is_file() and (run / "hyp.test.de").is_file()
    assert "bleu" in json.loads((run / "results.json").read_text())
    valid = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "valid"
    ]
    assert len(valid) == 2 and "bleu" in valid[0]["valid"]  # greedy BLEU on val after each epoch

    # evaluate on a copy of the checkpoint alone: the tokenizer comes from the checkpoint
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(run / "checkpoint.pt", moved / "checkpoint.pt")
    assert main(["evaluate", "--checkpoint", str(moved / "checkpoint.pt"), "--split", "val", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["bleu"] <= 100.0
    hyps = (moved / "hyp.val.de").read_text().splitlines()
    assert len(hyps) == 2

    assert main(["plot", "--checkpoint", str(run / "checkpoint.pt"), "--out", str(tmp_path / "plots")]) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "attention_cross.png",
        "attention_decoder.png",
        "attention_encoder.png",
        "loss.png",  # plot redraws the loss curve from the run's metrics.jsonl
    ]


def test_translate_prints_one_deterministic_translation_per_sentence(tmp_path, capsys):
    pytest.importorskip("tokenizers", reason="translation needs the 'translate' extra (tokenizers)")
    run = tmp_path / "run"
    assert main(["train", *TINY, f"--out={run}", "--plots=false"]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "translate",
                "--checkpoint",
                str(run / "checkpoint.pt"),
                "A dog runs on the beach.",
                "A man throws a ball.",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # one translation per input sentence
    cfg, task, model, _ = load_for_eval(str(run / "checkpoint.pt"), "cpu")
    # the printed lines are the model's beam-2 translations (the run's --beam), detokenized
    assert lines == task.translate(model, ["A dog runs on the beach.", "A man throws a ball."], cfg)
    assert all(line.strip() and task.vocab.decode(task.vocab.encode(line)) == line for line in lines), lines
    assert main(["translate", "--checkpoint", str(run / "checkpoint.pt"), "A man throws a ball."]) == 0
    assert capsys.readouterr().out.splitlines() == lines[1:]  # deterministic, independent of the other input


def test_resume_reuses_the_runs_tokenizer(tmp_path):
    pytest.importorskip("tokenizers", reason="translation needs the 'translate' extra (tokenizers)")
    cfg = make_config({**parse_flags(TINY), "out": str(tmp_path / "run"), "max_steps": 2})
    first = Trainer(cfg)
    assert first.fit() == "max_steps"
    before = (tmp_path / "run" / "tokenizer.json").read_text()
    resumed = Trainer(make_config({**parse_flags(TINY), "out": str(tmp_path / "run")}), resume=True)
    assert resumed.position["step"] == 2
    assert (tmp_path / "run" / "tokenizer.json").read_text() == before
    assert resumed.task.vocab.tokenizer.to_str() == first.task.vocab.tokenizer.to_str()


def test_missing_data_dir_is_explained(tmp_path, capsys):
    assert main(["train", "--task=multi30k", f"--out={tmp_path / 'x'}", "--progress=false"]) == 2
    err = capsys.readouterr().err
    assert "sparseattn train: task multi30k needs --data-dir" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not os.path.isdir(SHARED), reason=f"shared Multi30k files absent ({SHARED})")
def test_shared_multi30k_files():
    pytest.importorskip("tokenizers", reason="translation needs the 'translate' extra (tokenizers)")
    from sparseattn.train.tasks.parallel_text import SubwordVocab, read_parallel

    sizes = {split: len(read_parallel(SHARED, split)[0]) for split in ("train", "val", "test")}
    assert sizes == {"train": 29000, "val": 1014, "test": 1000}
    src, tgt = read_parallel(SHARED, "train")
    vocab = SubwordVocab.train(src + tgt, vocab_size=8000)
    test_src, test_tgt = read_parallel(SHARED, "test")
    exact = [vocab.decode(vocab.encode(line)) == line for line in test_src + test_tgt]
    assert np.mean(exact) > 0.99  # characters never seen in training map to <unk> and are lost
