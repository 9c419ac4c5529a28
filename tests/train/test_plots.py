"""plots: attention maps from AttentionRecords, ACT step maps and the per-epoch step distribution."""

import numpy as np
import pytest
import torch

from sparseattn import AttentionRecord, graphs, record_attention
from sparseattn.models import GraphPool, GraphTransformer, UniversalTransformer
from sparseattn.train.config import make_config
from sparseattn.train.plots import attention_kind, attention_maps, dense_weights, layer_of, seq2seq_plots
from sparseattn.train.tasks import get_task


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
    assert names == {
        "attention_encoder.png",
        "attention_decoder.png",
        "attention_cross.png",
        "act_steps_per_position.png",
        "act_steps_by_epoch.png",
    }
    assert all(p.stat().st_size > 1000 for p in paths)


def test_loss_curve_needs_losses(tmp_path):
    from sparseattn.train.plots import loss_curve

    records = [{"kind": "train", "step": 10, "loss": 2.0}, {"kind": "valid", "step": 20, "valid": {"loss": 1.5}}]
    assert loss_curve(records, tmp_path / "a" / "loss.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no training or validation losses"):
        loss_curve([{"kind": "test", "step": 3}], tmp_path / "b.png")


def test_records_are_sorted_into_kinds_and_layers():
    w = torch.zeros(1, 1)
    g = graphs.complete(1)
    assert [
        attention_kind(n)
        for n in (
            "encoder.0.self_attn",
            "decoder.1.self_attn",
            "decoder.1.cross_attn",
            "enc_layer.self_attn",
            "dec_layer.cross_attn",
        )
    ] == ["encoder", "decoder", "cross", "encoder", "cross"]
    assert layer_of(AttentionRecord("decoder.2.self_attn", 0, g, w)) == 2  # a stack: the layer index
    assert layer_of(AttentionRecord("enc_layer.self_attn", 3, g, w)) == 3  # a shared (ACT) layer: the call


def test_attention_maps_of_recorded_transformer_weights(tmp_path):
    model = GraphTransformer(10, 10, d_model=16, num_heads=2, d_ff=16, num_layers=2).eval()
    batch = GraphPool().batch([[3, 4, 5]], [[6, 7]], bos=1, eos=2)
    with record_attention(model) as records:
        model(batch)
    assert sorted({(attention_kind(r.name), layer_of(r)) for r in records}) == [
        ("cross", 0),
        ("cross", 1),
        ("decoder", 0),
        ("decoder", 1),
        ("encoder", 0),
        ("encoder", 1),
    ]
    labels = {"src": ["c", "d", "e", "</s>"][: batch.src.numel()], "tgt_in": ["<s>", "f", "g"]}
    paths = attention_maps(records, labels, tmp_path)
    assert [p.name for p in paths] == ["attention_encoder.png", "attention_decoder.png", "attention_cross.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
