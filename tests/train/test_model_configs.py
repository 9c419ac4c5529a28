"""model_configs: every registered model builds from its config, the BiLSTM's Noam dimension, and
that the registries are filled whatever module of sparseattn.train a user imports first."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparseattn.models import GraphTransformer, UniversalTransformer
from sparseattn.train.config import MODEL_CONFIGS, make_config
from sparseattn.train.model_configs import lr_dim
from sparseattn.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "task, model, cls", [("copy", "transformer", GraphTransformer), ("sort", "ut", UniversalTransformer)]
)
def test_seq2seq_configs_build_their_models(task, model, cls):
    cfg = make_config(
        {
            "task": task,
            "model": model,
            "d_model": 16,
            "d_ff": 16,
            "num_heads": 2,
            "num_train": 8,
            "num_valid": 4,
            "num_test": 4,
        }
    )
    t = get_task(task)
    t.setup(cfg)
    built = cfg.model_cfg.build(t.model_info())
    assert type(built) is cls and built.src_embed.lut.weight.shape[1] == 16


def test_lr_dim_is_d_model_unless_set_and_the_bilstm_has_none():
    cfg = make_config({"task": "copy", "model": "transformer", "d_model": 48})
    assert lr_dim(cfg) == 48
    assert lr_dim(make_config({"task": "copy", "model": "transformer", "d_model": 48, "lr_dim": 64})) == 64
    assert {"tagger", "bilstm"} <= set(MODEL_CONFIGS) and not hasattr(MODEL_CONFIGS["bilstm"](), "d_model")
    assert lr_dim(make_config({"task": "chunking", "model": "bilstm", "lr_dim": 32})) == 32
    with pytest.raises(ValueError, match="unknown config key 'd_model'"):
        make_config({"task": "chunking", "model": "bilstm", "d_model": "8"})


def test_make_config_knows_every_task_and_model_when_only_config_is_imported():
    code = textwrap.dedent("""
        from sparseattn.train.config import make_config
        cfg = make_config({"task": "sort", "model": "ut"})
        print(cfg.task, cfg.model)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["sort", "ut"]
