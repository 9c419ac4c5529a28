"""blocks: sinusoidal positions and the feed-forward block (linear, or convolutions along each sentence)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from sparseattn.models import FeedForward, sinusoid


def test_sinusoid_matches_formula():
    pe = sinusoid(torch.tensor([0, 5]), 4)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [
                torch.sin(torch.tensor(5.0)),
                torch.cos(torch.tensor(5.0)),
                torch.sin(torch.tensor(0.05)),
                torch.cos(torch.tensor(0.05)),
            ],
        ]
    )
    assert torch.allclose(pe, expected, atol=1e-6)


@given(st.lists(st.integers(1, 8), min_size=2, max_size=6), st.data())
def test_conv_ffn_never_mixes_sentences(lengths, data):
    """Perturbing every token of one sentence leaves all other sentences' outputs unchanged."""
    torch.manual_seed(1)
    ffn = FeedForward(5, 7, dropout=0.0, kind="conv").double()
    x = torch.randn(sum(lengths), 5, dtype=torch.float64)
    b = data.draw(st.integers(0, len(lengths) - 1))
    start = sum(lengths[:b])
    y = x.clone()
    y[start : start + lengths[b]] += 10 * torch.randn(lengths[b], 5, dtype=torch.float64)
    lens = torch.tensor(lengths)
    out_x, out_y = ffn(x, lens), ffn(y, lens)
    other = torch.ones(sum(lengths), dtype=torch.bool)
    other[start : start + lengths[b]] = False
    assert torch.equal(out_x[other], out_y[other])
    if lengths[b] > 1:  # and the perturbed sentence itself does change
        assert not torch.equal(out_x[~other], out_y[~other])


def test_linear_feed_forward_is_w2_relu_w1_and_ignores_lengths():
    torch.manual_seed(0)
    ffn = FeedForward(4, 6).double()  # kind="linear", dropout=0.0 by default
    assert ffn.kind == "linear" and isinstance(ffn.w1, nn.Linear) and ffn.w1.out_features == 6
    x = torch.randn(5, 4, dtype=torch.float64)
    expected = ffn.w2(F.relu(ffn.w1(x)))
    assert torch.equal(ffn(x), expected)
    assert torch.equal(ffn(x, torch.tensor([2, 3])), expected)  # position-wise: sentences do not matter


def test_conv_feed_forward_mixes_neighbours_within_a_sentence():
    torch.manual_seed(2)
    ffn = FeedForward(3, 5, kind="conv").double()
    x = torch.randn(4, 3, dtype=torch.float64)
    lens = torch.tensor([4])
    y = x.clone()
    y[0] += 1.0
    assert not torch.equal(ffn(x, lens)[1], ffn(y, lens)[1])  # token 1 sees token 0


def test_feed_forward_rejects_unknown_kind_and_conv_needs_lengths():
    with pytest.raises(ValueError, match="kind must be 'linear' or 'conv'"):
        FeedForward(4, 8, kind="gelu")
    with pytest.raises(ValueError, match="needs the sentence lengths"):
        FeedForward(4, 8, kind="conv")(torch.randn(3, 4))


def test_positional_encoding_reads_the_table_or_computes_past_it_with_or_without_max_pos():
    from sparseattn.models import PositionalEncoding

    pe = PositionalEncoding(6, max_len=4)
    inside, past = torch.tensor([0, 3, 1]), torch.tensor([0, 5, 2])
    assert torch.equal(pe(inside), pe.table[inside]) and torch.equal(pe(inside, 3), pe.table[inside])
    assert torch.allclose(pe(past), sinusoid(past, 6)) and torch.allclose(pe(past, 5), sinusoid(past, 6))
    assert pe(torch.zeros(0, dtype=torch.long)).shape == (0, 6)


def test_transformer_passes_the_largest_position_from_the_batch_lengths(monkeypatch):
    """encode/decode know each sentence's length on the host, so the positional encoding never
    reads pos.max() (a GPU synchronization per call); the hint equals the real maximum."""
    from sparseattn.models import PositionalEncoding

    from .helpers import make_batch, make_model

    seen, real = [], PositionalEncoding.forward

    def spy(self, pos, max_pos=None):
        seen.append((max_pos, int(pos.max())))
        return real(self, pos, max_pos)

    monkeypatch.setattr(PositionalEncoding, "forward", spy)
    make_model("transformer")(make_batch())
    assert len(seen) == 2 and all(hint == actual for hint, actual in seen)
