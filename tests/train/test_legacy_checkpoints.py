"""Checkpoints written before the redesign (flat config, tagger layers named attn/ffn; made with
`sparseattn train` at commit 10ee8d8) still load and evaluate to the metrics they gave then, and a
checkpoint.pt of the WeightEMA before AveragedModel (5a781c3) resumes."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from sparseattn.train import checkpoint as ckpt_io
from sparseattn.train.cli import main
from sparseattn.train.config import config_from_dict, with_overrides
from sparseattn.train.tasks import get_task
from sparseattn.train.trainer import Trainer

from .helpers import assert_same_weights

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


def test_old_ema_checkpoint_resumes_with_its_average(tmp_path):
    """copy-transformer-ema-checkpoint.pt: checkpoint.pt of a tiny copy run with --ema_decay=0.95
    stopped at max_steps=5, written by the WeightEMA that kept its own averages."""
    state = ckpt_io.load(LEGACY / "copy-transformer-ema-checkpoint.pt")
    old = state["ema"]
    assert old.keys() == {"decay", "num_updates", "average"} and old["num_updates"] == 5
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(LEGACY / "copy-transformer-ema-checkpoint.pt", run / "checkpoint.pt")
    cfg = with_overrides(config_from_dict(state["config"]), {"out": str(run), "max_steps": 0})
    t = Trainer(cfg, resume=True)
    assert t.ema.num_updates == 5
    assert not t.optimizer.param_groups[0]["fused"]  # the run goes on with the Adam it started with
    assert_same_weights(t.ema.average(), old["average"])
    assert t.fit() == "finished" and t.position["step"] == 6  # the last step of the two epochs
    d = min(0.95, 5 / 6)
    weights = dict(t.model.named_parameters())
    for k, average in t.ema.average().items():
        torch.testing.assert_close(average, d * old["average"][k] + (1 - d) * weights[k].detach())
    saved = ckpt_io.load(run / "checkpoint.pt")["ema"]
    assert saved["num_updates"] == 6 and saved["average"].keys() == old["average"].keys()
