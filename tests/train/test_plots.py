"""plots: attention maps from recorded weights, ACT step maps and the per-epoch step distribution."""
import numpy as np
import pytest
import torch

from sparseattn import graphs
from sparseattn.config import make_config
from sparseattn.data.tasks import get_task
from sparseattn.models import UniversalTransformer
from sparseattn.plots import dense_weights, seq2seq_plots
from tests.single_thread import one_thread  # noqa: F401  (autouse)


def test_dense_weights_scatters_edges_into_dst_by_src_maps():
    g = graphs.causal(3)
    w = torch.arange(g.num_edges * 2, dtype=torch.float32).reshape(-1, 2)
    maps = dense_weights(g, w)
    assert maps.shape == (2, 3, 3)
    assert maps[1, 2, 0] == w[3, 1] and maps[0, 0, 2] == 0  # edge (0 -> 2) is 4th; no edge 2 -> 0


def test_ut_plots_write_attention_and_act_figures(tmp_path):
    cfg = make_config(dict(task="sort", model="ut", num_train=8, num_valid=4, num_test=12, seq_mean=5.0))
    task = get_task("sort")
    task.setup(cfg)
    model = UniversalTransformer(29, 29, d_model=16, num_heads=2, d_ff=16, max_steps=4)
    hist = [{"train": {"act_steps_hist": np.bincount([1, 2, 2, 3, 4], minlength=5).tolist()}}] * 3
    paths = seq2seq_plots(task, model, cfg, tmp_path, hist)
    names = {p.name for p in paths}
    assert names == {"attention_encoder.png", "attention_decoder.png", "attention_cross.png",
                     "act_steps_per_position.png", "act_steps_by_epoch.png"}
    assert all(p.stat().st_size > 1000 for p in paths)


def test_loss_curve_needs_losses(tmp_path):
    from sparseattn.plots import loss_curve
    records = [{"kind": "train", "step": 10, "loss": 2.0}, {"kind": "valid", "step": 20, "valid": {"loss": 1.5}}]
    assert loss_curve(records, tmp_path / "a" / "loss.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no training or validation losses"):
        loss_curve([{"kind": "test", "step": 3}], tmp_path / "b.png")
