"""The trainer on a CUDA device: a tiny run with plots, and resume after max_steps on the GPU
(checkpoint tensors, RNG states among them, are loaded onto the device). Skipped without CUDA."""

from pathlib import Path

import pytest
import torch

from sparseattn.train import checkpoint as ckpt_io
from sparseattn.train.plots import dense_weights
from sparseattn.train.trainer import Trainer

from .helpers import tiny_config, weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_rng_state_loaded_onto_the_gpu_restores():
    saved = ckpt_io.rng_state()
    want = (torch.rand(3), torch.rand(3, device="cuda"))
    on_gpu = {**saved, "torch": saved["torch"].cuda(), "cuda": [s.cuda() for s in saved["cuda"]]}
    on_gpu["numpy"] = {**saved["numpy"], "keys": saved["numpy"]["keys"].cuda()}
    ckpt_io.set_rng_state(on_gpu)
    assert torch.equal(torch.rand(3), want[0]) and torch.equal(torch.rand(3, device="cuda"), want[1])


def test_dense_weights_of_gpu_tensors():
    from sparseattn import graphs

    g = graphs.causal(3, device="cuda")
    w = torch.arange(1.0, g.num_edges + 1, device="cuda")[:, None]
    maps = dense_weights(g, w)
    assert maps.shape == (1, 3, 3) and maps[0, 2, 0] > 0 and maps[0, 0, 2] == 0


def test_run_then_resume_after_max_steps_matches_uninterrupted_and_plots(tmp_path):
    full = Trainer(tiny_config(tmp_path, "full", device="cuda", plots=True, dropout=0.0))
    full.fit()
    want = weights(full.model)
    Trainer(tiny_config(tmp_path, "cut", device="cuda", max_steps=5, dropout=0.0)).fit()
    resumed = Trainer(tiny_config(tmp_path, "cut", device="cuda", dropout=0.0), resume=True)
    resumed.fit()
    assert resumed.device.type == "cuda" and resumed.position["step"] == full.position["step"]
    got = weights(resumed.model)
    # CUDA kernels with atomics (embedding backward) may reorder sums: close, not bit-equal
    assert all(torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-4) for k in want)
    plots = full.finish()["plots"]  # attention maps of GPU tensors, the loss curve
    assert len(plots) >= 2 and all(Path(p).is_file() for p in plots)
