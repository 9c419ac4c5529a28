"""WeightEMA and --ema_decay: the average's arithmetic (the old WeightEMA's, now an AveragedModel),
its checkpoint format, exact resume, best.pt and evaluate using the averaged weights."""

import json
import re

import pytest
import torch
from torch import nn

from sparseattn.train.cli import load_for_eval, main
from sparseattn.train.ema import WeightEMA
from sparseattn.train.trainer import Trainer

from .helpers import assert_same_weights, tiny_config


def old_weight_ema(weights, decay):
    """The averages the WeightEMA before AveragedModel computed over a sequence of weights, by its
    formula: at update n, avg <- d * avg + (1 - d) * weight with d = min(decay, n / (n + 1))."""
    average = None
    for n, w in enumerate(weights):
        d = min(decay, n / (n + 1))
        average = w.clone() if average is None else d * average + (1 - d) * w
        yield average


@pytest.mark.parametrize("decay", [0.9, 0.5])
def test_average_follows_the_old_formula_through_the_warm_up(decay):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()
    ema = WeightEMA(model, decay=decay)
    seen = []
    for n in range(30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        seen.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        ema.update_parameters(model)
        assert ema.num_updates == n + 1
        want = list(old_weight_ema(seen, decay))[-1]
        got = torch.cat([p.flatten() for p in ema.average().values()])
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_the_average_starts_as_the_plain_mean_and_the_initial_weights_never_count():
    model = nn.Linear(2, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        model.weight.fill_(1e6)
    ema = WeightEMA(model, decay=0.99)
    seen = []
    for step in range(5):
        with torch.no_grad():
            model.weight.fill_(float(step + 1) ** 2)
        seen.append(model.weight.detach().clone())
        ema.update_parameters(model)
        if step == 0:
            assert torch.equal(ema.average()["weight"], model.weight)
        torch.testing.assert_close(ema.average()["weight"], torch.stack(seen).mean(0), rtol=1e-13, atol=0)


def test_the_average_is_a_copy_with_tied_parameters_once_and_buffers_copied():
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    model[1].weight = model[0].weight
    model.register_buffer("steps", torch.zeros(()))
    ema = WeightEMA(model, decay=0.5)
    assert list(ema.average()) == ["0.weight", "1.bias"]
    assert ema.module[1].weight is ema.module[0].weight
    assert not any(p.requires_grad for p in ema.module.parameters())
    own = {k: v.clone() for k, v in model.state_dict().items()}
    ema.update_parameters(model)
    assert_same_weights(own, model.state_dict())  # averaging leaves the model's weights alone
    with torch.no_grad():
        model[0].weight.add_(1.0)
        model.steps.add_(3.0)
    ema.update_parameters(model)
    torch.testing.assert_close(ema.module[0].weight, own["0.weight"] + 0.5)
    assert ema.module.steps.item() == 3.0  # buffers: the model's, not averaged


def test_checkpoint_state_round_trips_and_keeps_the_old_format():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ema = WeightEMA(model, decay=0.9)
    for _ in range(3):
        with torch.no_grad():
            model.weight.add_(1.0)
        ema.update_parameters(model)
    state = ema.checkpoint_state()
    assert state.keys() == {"decay", "num_updates", "average"} and state["num_updates"] == 3
    assert state["decay"] == 0.9 and state["average"].keys() == {"weight", "bias"}
    other = WeightEMA(nn.Linear(3, 2), decay=0.9)
    other.load_checkpoint_state(state)
    assert other.num_updates == 3
    assert_same_weights(other.average(), ema.average())
    with pytest.raises(ValueError, match="ema state does not match the model's parameters"):
        WeightEMA(nn.Linear(3, 3, bias=False), decay=0.9).load_checkpoint_state(state)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_decay_outside_0_1_is_an_error(decay):
    with pytest.raises(ValueError, match=rf"ema decay must be in \(0, 1\), got decay={decay}"):
        WeightEMA(nn.Linear(2, 2), decay=decay)


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
    assert_same_weights(full.ema.average(), resumed.ema.average())
    assert resumed.ema.num_updates == 12
    # the raw weights and the average differ; checkpoint.pt keeps both, best.pt the evaluated average
    saved = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)
    assert not torch.equal(saved["model"]["generator.weight"], saved["ema"]["average"]["generator.weight"])
    best = torch.load(tmp_path / "part" / "best.pt", weights_only=False)
    assert "ema" not in best and "optimizer" not in best
    # best.pt holds the average as it was at the end of the best epoch, whichever epoch that was
    one_epoch = Trainer(tiny_config(tmp_path, "one", **{**kw, "epochs": 1}))
    assert one_epoch.fit() == "finished"
    average_after = {1: one_epoch.ema.average(), 2: resumed.ema.average()}
    assert best["epoch"] in average_after
    assert_same_weights({k: best["model"][k] for k in average_after[best["epoch"]]}, average_after[best["epoch"]])
    assert not torch.equal(average_after[1]["generator.weight"], average_after[2]["generator.weight"])


def test_validation_and_evaluate_use_the_average(tmp_path, capsys):
    t = Trainer(tiny_config(tmp_path, "run", ema_decay=0.9, epochs=1, keep_best=False))
    t.fit()
    averaged = t.task.evaluate(t.ema.module, "valid", t.cfg, decode=False)
    raw = t.task.evaluate(t.model, "valid", t.cfg, decode=False)
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r["valid"] for r in logged if r["kind"] == "valid"][0]
    assert valid["loss"] == pytest.approx(averaged["loss"]) and valid["loss"] != pytest.approx(raw["loss"])
    _, _, model, _ = load_for_eval(str(tmp_path / "run" / "checkpoint.pt"), "cpu")
    average = t.ema.average()
    assert_same_weights({k: v for k, v in model.state_dict().items() if k in average}, average)


def test_resume_with_ema_from_a_run_without_it_names_the_problem(tmp_path, capsys):
    out = tmp_path / "plain"
    Trainer(tiny_config(tmp_path, "plain", epochs=1)).fit()
    assert main(["train", f"--out={out}", "--resume", "--ema_decay=0.9", "--epochs=2"]) == 2
    assert re.search("--ema_decay=0.9 but .*checkpoint.pt was trained without it", capsys.readouterr().err)
