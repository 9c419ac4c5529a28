import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from sparseattn.models.sentence_ops import (FeedForward, SentenceConv, positions_in_sentence,
                                            shift_within_sentences, sinusoidal)


def test_positions_restart_in_every_sentence():
    assert positions_in_sentence(torch.tensor([3, 1, 2])).tolist() == [0, 1, 2, 0, 0, 1]


def test_shift_zeroes_across_boundaries():
    x = torch.arange(1.0, 6.0)[:, None]  # sentences [1, 2, 3] and [4, 5]
    lengths = torch.tensor([3, 2])
    assert shift_within_sentences(x, lengths, -1)[:, 0].tolist() == [0, 1, 2, 0, 4]
    assert shift_within_sentences(x, lengths, 1)[:, 0].tolist() == [2, 3, 0, 5, 0]


def test_sinusoidal_matches_formula():
    pe = sinusoidal(torch.tensor([0, 5]), 4)
    expected = torch.tensor([[0.0, 1.0, 0.0, 1.0],
                             [torch.sin(torch.tensor(5.0)), torch.cos(torch.tensor(5.0)),
                              torch.sin(torch.tensor(0.05)), torch.cos(torch.tensor(0.05))]])
    assert torch.allclose(pe, expected, atol=1e-6)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.sampled_from([1, 3, 5]))
def test_sentence_conv_equals_conv1d_on_each_padded_sentence(lengths, width):
    torch.manual_seed(0)
    conv = SentenceConv(4, 6, width).double()
    ref = nn.Conv1d(4, 6, width, padding=width // 2).double()
    ref.load_state_dict({"weight": conv.weight, "bias": conv.bias})
    x = torch.randn(sum(lengths), 4, dtype=torch.float64)
    out = conv(x, torch.tensor(lengths))
    expected = torch.cat([ref(s.T[None])[0].T for s in torch.split(x, lengths)])
    assert torch.allclose(out, expected, atol=1e-12)


@given(st.lists(st.integers(1, 8), min_size=2, max_size=6), st.data())
def test_conv_ffn_never_mixes_sentences(lengths, data):
    """Perturbing every token of one sentence leaves all other sentences' outputs unchanged."""
    torch.manual_seed(1)
    ffn = FeedForward(5, 7, "conv", dropout=0.0).double()
    x = torch.randn(sum(lengths), 5, dtype=torch.float64)
    b = data.draw(st.integers(0, len(lengths) - 1))
    start = sum(lengths[:b])
    y = x.clone()
    y[start:start + lengths[b]] += 10 * torch.randn(lengths[b], 5, dtype=torch.float64)
    lens = torch.tensor(lengths)
    out_x, out_y = ffn(x, lens), ffn(y, lens)
    other = torch.ones(sum(lengths), dtype=torch.bool)
    other[start:start + lengths[b]] = False
    assert torch.equal(out_x[other], out_y[other])
    if lengths[b] > 1:  # and the perturbed sentence itself does change
        assert not torch.equal(out_x[~other], out_y[~other])
