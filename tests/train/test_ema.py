"""WeightEMA and --ema_decay: the average's arithmetic, swapping weights in and out, exact resume,
best.pt and evaluate using the averaged weights."""

import json
import re

import pytest
import torch
from torch import nn

from sparseattn.train.cli import load_for_eval, main
from sparseattn.train.ema import WeightEMA
from sparseattn.train.trainer import Trainer

from .helpers import assert_same_weights, tiny_config


def test_average_follows_the_warmed_up_decay():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ema = WeightEMA(model, decay=0.9)
    expected = {k: p.detach().clone() for k, p in model.named_parameters()}
    for n in range(30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        d = min(0.9, n / (n + 1))
        for k, p in model.named_parameters():
            expected[k] = d * expected[k] + (1 - d) * p.detach()
        ema.update()
    for k in expected:
        torch.testing.assert_close(ema.average[k], expected[k])
    assert ema.current_decay() == 0.9


def test_the_average_starts_as_the_plain_mean_of_the_weights_so_far():
    model = nn.Linear(2, 1, bias=False)
    ema = WeightEMA(model, decay=0.99)
    seen = []
    for step in range(5):
        with torch.no_grad():
            model.weight.fill_(float(step + 1) ** 2)
        seen.append(model.weight.detach().clone())
        ema.update()
        torch.testing.assert_close(ema.average["weight"], torch.stack(seen).mean(0))


def test_applied_swaps_the_average_in_and_restores_the_weights():
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    model[1].weight = model[0].weight  # tied: averaged once
    ema = WeightEMA(model, decay=0.5)
    assert len(ema.average) == 2
    ema.update()  # the first update: the average is the current weights
    with torch.no_grad():
        model[0].weight.add_(1.0)  # the weights move on; the average stays
    own = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.applied():
        torch.testing.assert_close(model[0].weight, ema.average["0.weight"])
        assert model[1].weight is model[0].weight
        assert not torch.equal(model[0].weight, own["0.weight"])
    assert_same_weights(own, model.state_dict())


def test_decay_outside_0_1_is_an_error():
    with pytest.raises(ValueError, match="ema decay must be in"):
        WeightEMA(nn.Linear(2, 2), decay=1.0)


@pytest.mark.parametrize("model", ["transformer", "ut"])
def test_resume_with_ema_is_exact_and_best_holds_the_average(tmp_path, model):
    kw = dict(model=model, num_heads=2, ema_decay=0.95, dropout=0.1)
    full = Trainer(tiny_config(tmp_path, "full", **kw))
    assert full.fit() == "finished"
    part = Trainer(tiny_config(tmp_path, "part", max_steps=9, **kw))
    assert part.fit() == "max_steps"
    resumed = Trainer(tiny_config(tmp_path, "part", **kw), resume=True)
    assert resumed.fit() == "finished"
    assert_same_weights(full.model.state_dict(), resumed.model.state_dict())
    assert_same_weights(full.ema.average, resumed.ema.average)
    assert resumed.ema.num_updates == 12
    # the raw weights and the average differ; checkpoint.pt keeps both, best.pt the evaluated average
    saved = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)
    assert not torch.equal(saved["model"]["generator.weight"], saved["ema"]["average"]["generator.weight"])
    best = torch.load(tmp_path / "part" / "best.pt", weights_only=False)
    assert "ema" not in best and "optimizer" not in best
    # best.pt holds the average as it was at the end of the best epoch, whichever epoch that was
    one_epoch = Trainer(tiny_config(tmp_path, "one", **{**kw, "epochs": 1}))
    assert one_epoch.fit() == "finished"
    average_after = {1: one_epoch.ema.average, 2: resumed.ema.average}
    assert best["epoch"] in average_after
    assert_same_weights({k: best["model"][k] for k in average_after[best["epoch"]]}, average_after[best["epoch"]])
    assert not torch.equal(average_after[1]["generator.weight"], average_after[2]["generator.weight"])


def test_validation_and_evaluate_use_the_average(tmp_path, capsys):
    t = Trainer(tiny_config(tmp_path, "run", ema_decay=0.9, epochs=1, keep_best=False))
    t.fit()
    with t.ema.applied():
        averaged = t.task.evaluate(t.model, "valid", t.cfg, decode=False)
    raw = t.task.evaluate(t.model, "valid", t.cfg, decode=False)
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r["valid"] for r in logged if r["kind"] == "valid"][0]
    assert valid["loss"] == pytest.approx(averaged["loss"]) and valid["loss"] != pytest.approx(raw["loss"])
    _, _, model, _ = load_for_eval(str(tmp_path / "run" / "checkpoint.pt"), "cpu")
    assert_same_weights({k: v for k, v in model.state_dict().items() if k in t.ema.average}, t.ema.average)


def test_resume_with_ema_from_a_run_without_it_names_the_problem(tmp_path, capsys):
    out = tmp_path / "plain"
    Trainer(tiny_config(tmp_path, "plain", epochs=1)).fit()
    assert main(["train", f"--out={out}", "--resume", "--ema_decay=0.9", "--epochs=2"]) == 2
    assert re.search("--ema_decay=0.9 but .*checkpoint.pt was trained without it", capsys.readouterr().err)
