"""Per-sentence operations on concatenated token rows (B sentences, L tokens, no padding).

Sentences are given by their lengths (B,); token rows of sentence b are contiguous and in order.
Nothing here ever reads a token of another sentence: neighbours across a sentence boundary are
zeros, exactly as if each sentence were zero-padded on its own.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def positions_in_sentence(lengths: Tensor) -> Tensor:
    """(L,) int64 position of each token within its sentence: 0..n_b-1 for every b."""
    starts = torch.cumsum(lengths, 0) - lengths  # (B,) first row of each sentence
    total = int(lengths.sum())
    return torch.arange(total, device=lengths.device) - starts.repeat_interleave(lengths)


def shift_within_sentences(x: Tensor, lengths: Tensor, offset: int) -> Tensor:
    """y[i] = x[i + offset] when token i + offset is in i's sentence, else 0. x: (L, F) -> (L, F)."""
    if offset == 0:
        return x
    pos = positions_in_sentence(lengths)
    n = lengths.repeat_interleave(lengths)  # (L,) length of each token's sentence
    inside = (pos + offset >= 0) & (pos + offset < n)  # (L,)
    src = (torch.arange(x.shape[0], device=x.device) + offset).clamp(0, max(x.shape[0] - 1, 0))
    return x[src] * inside[:, None].to(x.dtype)


class SentenceConv(nn.Module):
    """Conv1d of odd `width` along each sentence, zero-padded per sentence, on (L, in) rows.

    Implemented as a linear map of the `width` shifted copies concatenated, so it costs one
    matmul and never sees the next sentence. Same parameters as nn.Conv1d(in, out, width,
    padding=width // 2): weight (out, in, width), bias (out,).
    """

    def __init__(self, in_dim: int, out_dim: int, width: int = 3) -> None:
        super().__init__()
        if width < 1 or width % 2 == 0:
            raise ValueError(f"width must be a positive odd int, got {width}")
        self.width = width
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim, width))
        self.bias = nn.Parameter(torch.empty(out_dim))
        conv = nn.Conv1d(in_dim, out_dim, width)  # borrow its initialization
        assert conv.bias is not None
        with torch.no_grad():
            self.weight.copy_(conv.weight)
            self.bias.copy_(conv.bias)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        half = self.width // 2
        shifted = [shift_within_sentences(x, lengths, k) for k in range(-half, half + 1)]
        stacked = torch.cat(shifted, dim=-1)  # (L, width * in), tap-major
        w = self.weight.permute(0, 2, 1).reshape(self.weight.shape[0], -1)  # (out, width * in), tap-major
        return F.linear(stacked, w, self.bias)
