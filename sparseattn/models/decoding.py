"""Greedy and beam-search decoding, batched over sentences, for any `Seq2SeqModel`
(`GraphTransformer`, `UniversalTransformer`; the protocol is in seq2seq.py).

Each step grows every hypothesis' causal graph by one node (the Transformer attends to cached
keys/values; the UT recomputes its decoder on the prefix). Outputs exclude BOS and EOS. A
sentence stops at EOS or after max_len tokens.
Beam search ranks hypotheses by log P / lp(len) with the GNMT length penalty
lp = ((5 + len) / 6) ** alpha (len counts the EOS); alpha = 0 ranks by log P.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from .batch import GraphBatch, GraphPool, bucket_batches
from .seq2seq import Seq2SeqModel

MAX_HYPOTHESES = 4096  # per decoding batch: a 4096 x 8000-token score tensor is 128 MB


def _max_lens(batch: GraphBatch, max_len: Union[int, Sequence[int]]) -> Tensor:
    if isinstance(max_len, int):
        return torch.full((batch.num_sentences,), max_len, dtype=torch.long)
    return torch.as_tensor(list(max_len), dtype=torch.long)


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqModel, batch: GraphBatch, bos: int, eos: int, max_len: Union[int, Sequence[int]]
) -> List[List[int]]:
    """Argmax decoding of every sentence of `batch` (only its source side is used).
    max_len: one limit or one per sentence. Finished sentences leave the computation."""
    b = batch.num_sentences
    device = batch.src.device
    limits = _max_lens(batch, max_len).to(device)
    alive = torch.arange(b, device=device)  # sentence of each live hypothesis
    state = model.start_decoding(batch, alive.clone())
    tokens = torch.full((b,), bos, dtype=torch.long, device=device)
    outputs: List[List[int]] = [[] for _ in range(b)]
    for t in range(int(limits.max()) if b else 0):
        nxt = model.decode_next(state, tokens).argmax(-1)  # (Nh,)
        nxt = torch.where(limits[alive] <= t, torch.full_like(nxt, eos), nxt)
        for sent, tok in zip(alive.tolist(), nxt.tolist()):
            if tok != eos:
                outputs[sent].append(tok)
        keep = (nxt != eos).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        if keep.numel() < alive.numel():
            model.reorder_state(state, keep)
            alive = alive[keep]
        tokens = nxt[keep]
    return outputs


@torch.no_grad()
def beam_search(
    model: Seq2SeqModel,
    batch: GraphBatch,
    bos: int,
    eos: int,
    max_len: Union[int, Sequence[int]],
    beam: int = 4,
    alpha: float = 0.6,
) -> List[List[int]]:
    """Beam search with `beam` hypotheses per sentence, all sentences in one batch.
    Finished hypotheses stay in the beam and extend only by EOS at no cost."""
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    b, k = batch.num_sentences, beam
    if b == 0:
        return []
    device = batch.src.device
    limits = _max_lens(batch, max_len).to(device)
    state = model.start_decoding(batch, torch.arange(b, device=device).repeat_interleave(k))
    tokens = torch.full((b * k,), bos, dtype=torch.long, device=device)
    scores = torch.zeros(b, k, device=device)
    scores[:, 1:] = float("-inf")  # all beams start as the one empty hypothesis
    finished = torch.zeros(b, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(b, k, dtype=torch.long, device=device)
    history = torch.zeros(b, k, 0, dtype=torch.long, device=device)
    for t in range(int(limits.max())):
        logp = model.decode_next(state, tokens)
        v = logp.shape[-1]
        logp = logp.reshape(b, k, v).to(scores.dtype)
        only_eos = torch.full((v,), float("-inf"), device=device, dtype=logp.dtype)
        only_eos[eos] = 0.0
        must_stop = finished | (limits <= t)[:, None]  # (B, K)
        logp = torch.where(must_stop[..., None], only_eos, logp)
        cand = scores[..., None] + logp  # (B, K, V)
        new_len = torch.where(finished, lengths, torch.full_like(lengths, t + 1))
        penalty = ((5.0 + new_len.to(cand.dtype)) / 6.0) ** alpha  # (B, K)
        top = (cand / penalty[..., None]).reshape(b, k * v).topk(k, dim=1)
        origin, tok = top.indices // v, top.indices % v  # (B, K) beam of origin, new token
        scores = cand.reshape(b, k * v).gather(1, top.indices)
        lengths = new_len.gather(1, origin)
        finished = finished.gather(1, origin) | (tok == eos)
        history = torch.cat([history.gather(1, origin[..., None].expand(-1, -1, t)), tok[..., None]], 2)
        model.reorder_state(state, (origin + torch.arange(b, device=device)[:, None] * k).reshape(-1))
        tokens = tok.reshape(-1)
        if bool(finished.all()):
            break
    best = history[:, 0].tolist()  # topk sorts by normalised score, so beam 0 is the best
    return [[tok for tok in seq[: seq.index(eos)]] if eos in seq else seq for seq in best]


@torch.no_grad()
def decode(
    model: Seq2SeqModel,
    sources: Sequence[Sequence[int]],
    bos: int,
    eos: int,
    *,
    beam: int = 1,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 10,
    batch_size: int = 256,
    device: Optional[Union[str, torch.device]] = None,
    pool: Optional[GraphPool] = None,
    max_hypotheses: int = MAX_HYPOTHESES,
) -> List[List[int]]:
    """Decode many sources (lists of token ids) in length-bucketed batches; outputs in input order.
    Each output has at most int(max_len_a * len(source) + max_len_b) tokens. A batch holds at most
    `batch_size` sentences and `max_hypotheses` hypotheses (sentences x beam): beam search keeps a
    (sentences, beam, vocabulary) score tensor, so wide beams decode fewer sentences at a time."""
    was_training = model.training
    model.eval()
    pool = pool or GraphPool()
    device = device or next(model.parameters()).device
    outputs: List[Optional[List[int]]] = [None] * len(sources)
    batch_size = max(1, min(batch_size, max_hypotheses // beam))
    for idx in bucket_batches([len(s) for s in sources], batch_size):
        batch = pool.batch([sources[i] for i in idx]).to(device)
        limits = [int(max_len_a * len(sources[i]) + max_len_b) for i in idx]
        if beam == 1:
            outs = greedy_decode(model, batch, bos, eos, limits)
        else:
            outs = beam_search(model, batch, bos, eos, limits, beam=beam, alpha=alpha)
        for i, o in zip(idx, outs):
            outputs[i] = o
    model.train(was_training)
    return outputs  # type: ignore[return-value]


__all__ = ["greedy_decode", "beam_search", "decode"]
