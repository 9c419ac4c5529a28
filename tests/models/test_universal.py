import torch

from sparseattn import record_attention

from .helpers import make_batch, make_model


def _traced_forward(seed=0, **kw):
    model = make_model("ut", **kw)
    model.trace = []
    batch = make_batch(6, seed=seed)
    out = model(batch)
    return model, batch, out


def test_halting_bias_starts_at_one():
    model = make_model("ut")
    assert torch.all(model.halt_enc.linear.bias == 1.0) and torch.all(model.halt_dec.linear.bias == 1.0)


def test_act_invariants_mass_active_set_frozen_states():
    # a small threshold spread makes nodes halt at different steps
    model, batch, out = _traced_forward(threshold=0.9)
    for name, n in (("enc", batch.src.numel()), ("dec", batch.tgt_in.numel())):
        trace = [t for t in model.trace if t["name"] == name]
        mass = torch.zeros(n, dtype=torch.float64)
        prev_active, prev_x = torch.ones(n, dtype=torch.bool), None
        for rec in trace:
            mass.index_add_(0, rec["idx"], rec["weight"])
            active = rec["active"]
            assert not torch.any(active & ~prev_active), "a halted node became active again"
            assert torch.equal(active.nonzero().squeeze(1), rec["idx"])
            if prev_x is not None:  # halted rows (not in idx) keep their state exactly
                assert torch.equal(rec["x"][~active], prev_x[~active])
            prev_active, prev_x = active, rec["x"]
        assert torch.all(mass <= 1.0 + 1e-12)
        torch.testing.assert_close(mass, torch.ones(n, dtype=torch.float64))  # every node halts by max_steps
    steps = torch.cat([out.stats["act_steps_enc"], out.stats["act_steps_dec"]])
    assert steps.min() >= 1 and steps.max() <= model.max_steps
    assert out.aux_loss > 0


def test_halted_nodes_get_no_attention_edges():
    """Each ACT step attends only along edges into active destinations."""
    model = make_model("ut", threshold=0.9)
    model.trace = []
    batch = make_batch(6, seed=3)
    with record_attention(model) as records:
        model(batch)
    enc_trace = [t for t in model.trace if t["name"] == "enc"]
    enc_recs = [r for r in records if r.name == "enc_layer.self_attn"]
    assert len(enc_recs) == len(enc_trace)
    assert [r.call for r in enc_recs] == list(range(len(enc_trace)))  # one call per ACT step
    for r, t in zip(enc_recs, enc_trace):
        assert torch.all(t["active"][r.graph.dst])
        assert r.graph.num_edges == int(batch.enc_graph.in_degree()[t["active"]].sum())
        assert r.weights.shape == (r.graph.num_edges, 2)  # (E, H): make_model uses 2 heads


def test_max_steps_bounds_depth():
    model, batch, out = _traced_forward(threshold=100.0)  # never halts by itself
    assert torch.all(out.stats["act_steps_enc"] == model.max_steps)
    assert torch.all(out.stats["act_steps_dec"] == model.max_steps)
