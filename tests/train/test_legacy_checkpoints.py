"""Checkpoints written before the redesign (flat config, tagger layers named attn/ffn; made with
`sparseattn train` at commit 10ee8d8) still load and evaluate to the metrics they gave then."""

import json
import shutil
from pathlib import Path

import pytest

from sparseattn.train import checkpoint as ckpt_io
from sparseattn.train.cli import main
from sparseattn.train.config import config_from_dict, with_overrides
from sparseattn.train.tasks import get_task

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"
METRICS = json.loads((LEGACY / "metrics.json").read_text())
# float32 evaluation: AVX2, AVX-512 and scalar kernels round differently (a loss moved 3e-8 relative
# between CPUs); accuracies and F1 of these small test sets move in steps of 1e-3 or more
RTOL = 1e-6


def test_old_copy_checkpoint_evaluates_as_before(tmp_path, capsys):
    path = tmp_path / "best.pt"
    shutil.copy(LEGACY / "copy-transformer.pt", path)
    assert main(["evaluate", "--checkpoint", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(METRICS["copy-transformer"], rel=RTOL, abs=1e-12)


def test_old_tagger_checkpoint_loads_its_renamed_layers(tmp_path):
    data = tmp_path / "data" / "conll2000"
    data.mkdir(parents=True)
    for split in ("train", "test"):
        shutil.copy(LEGACY.parent / "conll_sample.txt", data / f"{split}.txt")
    state = ckpt_io.load(LEGACY / "chunking-tagger.pt")
    assert any(".attn." in k for k in state["model"])  # the old names
    cfg = with_overrides(config_from_dict(state["config"]), {"data_dir": str(data.parent)})
    task = get_task(cfg.task)
    task.setup(cfg)
    task.load_state_dict(state["task_state"])
    model = cfg.model_cfg.build(task.model_info())
    model.load_state_dict(state["model"])  # strict: every old key found its new name
    metrics = task.evaluate(model.eval(), "test", cfg)
    assert metrics == pytest.approx(METRICS["chunking-tagger"], rel=RTOL, abs=1e-12)
