import inspect

import pytest
import torch

from sparseattn.models import GraphPool, GraphTransformer, Seq2SeqModel, Seq2SeqOptions, UniversalTransformer

from .helpers import BOS, EOS, V, make_batch, make_model, random_pairs

KINDS = ["transformer", "ut"]


@pytest.mark.parametrize("kind", KINDS)
def test_forward_shapes(kind):
    batch = make_batch(5)
    model = make_model(kind)
    out = model(batch)
    assert out.logits.shape == (batch.num_tokens, V)
    assert out.aux_loss.shape == ()
    assert model.encode(batch).shape == (batch.src.numel(), 16)
    assert batch.tgt_in.shape == batch.tgt_out.shape == batch.tgt_pos.shape


# float64 models; the UT's ACT steps run the layer on the active rows only, so the row count of its
# matmuls depends on which tokens of *other* sentences halted, and CPU BLAS may round a row differently
# for another row count: outputs that must not change may move in the last bits (measured: 7e-16)
UNCHANGED = dict(rtol=0.0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_changing_target_token_j_changes_no_output_before_j(kind):
    src, tgt = random_pairs(3, seed=1, lo=5, hi=9)
    model = make_model(kind)
    pool = GraphPool()
    base = model(pool.batch(src, tgt, BOS, EOS)).logits
    j = 3  # tgt[1][j] is decoder input position j + 1 of sentence 1
    changed = [list(t) for t in tgt]
    changed[1][j] = 3 if changed[1][j] != 3 else 4
    out = model(pool.batch(src, changed, BOS, EOS)).logits
    start = len(tgt[0]) + 1  # first decoder node of sentence 1
    before = slice(start, start + j + 1)  # positions 0..j read inputs before the changed one
    torch.testing.assert_close(out[before], base[before], **UNCHANGED)
    assert not torch.allclose(out[start + j + 1], base[start + j + 1])
    torch.testing.assert_close(out[:start], base[:start], **UNCHANGED)  # other sentences untouched
    other = start + len(tgt[1]) + 1
    torch.testing.assert_close(out[other:], base[other:], **UNCHANGED)


@pytest.mark.parametrize("kind", KINDS)
def test_incremental_decoding_equals_full_recomputation(kind):
    batch = make_batch(4, seed=2)
    model = make_model(kind)
    full = torch.log_softmax(model(batch).logits, -1)  # (N_dec, V), teacher forced
    per_sentence = batch.dec_graph.split_dst(batch.tgt_in)
    steps = min(len(t) for t in per_sentence)
    state = model.start_decoding(batch, torch.arange(batch.num_sentences))
    full_split = batch.dec_graph.split_dst(full)
    for t in range(steps):
        tokens = torch.stack([s[t] for s in per_sentence])
        logp = model.decode_next(state, tokens)
        expected = torch.stack([f[t] for f in full_split])
        torch.testing.assert_close(logp, expected, atol=1e-10, rtol=1e-10)


def test_shared_and_tied_weights():
    m = GraphTransformer(V, V, share_embeddings=True, tie_generator=True)
    assert m.src_embed is m.tgt_embed
    assert m.generator.weight is m.tgt_embed.lut.weight
    with pytest.raises(ValueError, match="share_embeddings"):
        GraphTransformer(V, V + 1, share_embeddings=True)


def test_seq2seq_options_are_the_defaulted_keywords_of_seq2seq_model():
    params = inspect.signature(Seq2SeqModel.__init__).parameters.values()
    assert [p.name for p in params if p.default is not p.empty] == list(Seq2SeqOptions.__annotations__)


@pytest.mark.parametrize("model_class", [GraphTransformer, UniversalTransformer])
def test_options_reach_seq2seq_model(model_class):
    m = model_class(V, V, d_model=16, num_heads=2, share_embeddings=True, tie_generator=True, clamp=None, max_len=7)
    assert m.src_embed is m.tgt_embed and m.generator.weight is m.tgt_embed.lut.weight
    assert m.pos_enc.table.shape[0] == 7
    assert all(a.clamp is None for a in m.decoder_cross_attentions())
    with pytest.raises(TypeError, match="tie_generatr"):
        model_class(V, V, tie_generatr=True)


def test_cross_attention_has_its_own_projections():
    m = GraphTransformer(V, V)
    layer = m.decoder[0]
    assert layer.cross_attn is not layer.self_attn
    assert layer.cross_attn.out_proj.weight.data_ptr() != layer.self_attn.out_proj.weight.data_ptr()


@pytest.mark.parametrize("kind", KINDS)
def test_reference_and_auto_backends_train_to_the_same_loss(kind):
    """The same model, weights and batches with backend="reference" and "auto": losses agree
    step by step (float64), so a faster "auto" kernel is exercised inside real training."""
    losses = {}
    for backend in ("reference", "auto"):
        model = make_model(kind, backend=backend, dropout=0.0).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses[backend] = []
        for step in range(4):
            batch = make_batch(6, seed=10 + step)
            out = model(batch)
            loss = torch.nn.functional.cross_entropy(out.logits, batch.tgt_out) + out.aux_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[backend].append(loss.item())
    for a, b in zip(losses["reference"], losses["auto"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a))
    assert losses["auto"][-1] < losses["auto"][0]
