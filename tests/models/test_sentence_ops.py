import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from sparseattn.models.sentence_ops import SentenceConv, positions_in_sentence, shift_within_sentences


def test_positions_restart_in_every_sentence():
    assert positions_in_sentence(torch.tensor([3, 1, 2])).tolist() == [0, 1, 2, 0, 0, 1]


def test_shift_zeroes_across_boundaries():
    x = torch.arange(1.0, 6.0)[:, None]  # sentences [1, 2, 3] and [4, 5]
    lengths = torch.tensor([3, 2])
    assert shift_within_sentences(x, lengths, -1)[:, 0].tolist() == [0, 1, 2, 0, 4]
    assert shift_within_sentences(x, lengths, 1)[:, 0].tolist() == [2, 3, 0, 5, 0]


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
