"""GraphBatch: sentences as three block-diagonal graphs, no padding and no masks.

A batch of B (source, target) pairs becomes one row per token, all sentences end to end:
    encoder graph  complete with self-loops per source sentence       (N_enc -> N_enc)
    decoder graph  causal per target sentence                          (N_dec -> N_dec)
    cross graph    complete bipartite, sentence b's source -> target b (N_enc -> N_dec)
`GraphPool` caches the per-sentence graphs for every length (and length pair), so building a
batch is a `graphs.batch` of cached pieces; `bucket_batches` groups sentences of similar length
into batches of a fixed number of sentences, `token_batches` into batches under a token budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import Graph, graphs


@dataclass
class GraphBatch:
    """Token ids, positions and graphs of B sentence pairs.

    Shapes: src, src_pos (N_enc,); tgt_in (decoder input, BOS + target), tgt_out (prediction
    target, target + EOS), tgt_pos (N_dec,), all int64. For a source-only batch (decoding)
    the target fields are empty and dec_graph/cross_graph are None.
    """

    src: Tensor
    src_pos: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_pos: Tensor
    enc_graph: Graph
    dec_graph: Optional[Graph]
    cross_graph: Optional[Graph]
    src_lens: Tuple[int, ...]
    tgt_lens: Tuple[int, ...]

    def target_graphs(self) -> Tuple[Graph, Graph]:
        """(dec_graph, cross_graph); ValueError for a source-only batch."""
        if self.dec_graph is None or self.cross_graph is None:
            raise ValueError("this batch has no targets (it was built for decoding)")
        return self.dec_graph, self.cross_graph

    @property
    def num_sentences(self) -> int:
        """B: the number of sentence pairs."""
        return len(self.src_lens)

    @property
    def num_tokens(self) -> int:
        """Predicted tokens (decoder nodes)."""
        return int(self.tgt_out.numel())

    def to(self, device) -> "GraphBatch":
        """A copy with every tensor and graph on `device` (lengths stay host tuples)."""
        moved: Dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            moved[f.name] = v.to(device) if isinstance(v, (Tensor, Graph)) else v
        return GraphBatch(**moved)


class GraphPool:
    """Cache of per-sentence graphs keyed by length: complete(n), causal(m), bipartite(n, m).

    `pool.batch(src_seqs, tgt_seqs, bos, eos)` builds a GraphBatch from lists of token-id lists.
    """

    def __init__(self) -> None:
        self._enc: Dict[int, Graph] = {}
        self._dec: Dict[int, Graph] = {}
        self._cross: Dict[Tuple[int, int], Graph] = {}

    def encoder(self, n: int) -> Graph:
        """`graphs.complete(n)`: a source sentence of n tokens (self-loops included), cached."""
        if n not in self._enc:
            self._enc[n] = graphs.complete(n)
        return self._enc[n]

    def decoder(self, m: int) -> Graph:
        """`graphs.causal(m)`: a target sentence of m tokens, each attending to itself and earlier ones, cached."""
        if m not in self._dec:
            self._dec[m] = graphs.causal(m)
        return self._dec[m]

    def cross(self, n: int, m: int) -> Graph:
        """`graphs.bipartite(n, m)`: every source token into every target token, cached."""
        if (n, m) not in self._cross:
            self._cross[(n, m)] = graphs.bipartite(n, m)
        return self._cross[(n, m)]

    def graphs_for(self, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> Tuple[Graph, Graph, Graph]:
        """Batched (encoder, decoder, cross) graphs for sentence lengths (B,) and (B,)."""
        enc = graphs.batch([self.encoder(n) for n in src_lens])
        dec = graphs.batch([self.decoder(m) for m in tgt_lens])
        cross = graphs.batch([self.cross(n, m) for n, m in zip(src_lens, tgt_lens)])
        return enc, dec, cross

    def batch(
        self,
        src_seqs: Sequence[Sequence[int]],
        tgt_seqs: Optional[Sequence[Sequence[int]]] = None,
        bos: int = 1,
        eos: int = 2,
    ) -> GraphBatch:
        """Sentences -> GraphBatch. Each source must be non-empty; the decoder sees BOS + target and
        predicts target + EOS (so a target of length m gives m + 1 decoder nodes)."""
        src_lens = tuple(len(s) for s in src_seqs)
        if any(n == 0 for n in src_lens):
            raise ValueError("every source sequence must have at least one token")
        src = torch.tensor([t for s in src_seqs for t in s], dtype=torch.long)
        src_pos = torch.cat([torch.arange(n) for n in src_lens]) if src_lens else torch.zeros(0, dtype=torch.long)
        if tgt_seqs is None:
            empty = torch.zeros(0, dtype=torch.long)
            return GraphBatch(
                src,
                src_pos,
                empty,
                empty,
                empty,
                graphs.batch([self.encoder(n) for n in src_lens]),
                None,
                None,
                src_lens,
                (),
            )
        if len(tgt_seqs) != len(src_seqs):
            raise ValueError(f"got {len(src_seqs)} sources but {len(tgt_seqs)} targets")
        tgt_lens = tuple(len(t) + 1 for t in tgt_seqs)
        tgt_in = torch.tensor([t for s in tgt_seqs for t in [bos, *s]], dtype=torch.long)
        tgt_out = torch.tensor([t for s in tgt_seqs for t in [*s, eos]], dtype=torch.long)
        tgt_pos = torch.cat([torch.arange(m) for m in tgt_lens])
        enc, dec, cross = self.graphs_for(src_lens, tgt_lens)
        return GraphBatch(src, src_pos, tgt_in, tgt_out, tgt_pos, enc, dec, cross, src_lens, tgt_lens)


def bucket_batches(
    lengths: Sequence[int], batch_size: int, seed: Optional[int] = None, pool_factor: int = 50
) -> List[List[int]]:
    """Indices grouped into batches of at most `batch_size` sentences of similar length.

    With a seed: shuffle, sort within pools of `pool_factor * batch_size` by length, cut, and
    shuffle the batch order (deterministic in the seed). Without: sorted by length, in order.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    lens = np.asarray(lengths)
    if seed is None:
        order = np.argsort(lens, kind="stable")
        return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))
    pool = pool_factor * batch_size
    batches: List[List[int]] = []
    for start in range(0, len(order), pool):
        chunk = order[start : start + pool]
        chunk = chunk[np.argsort(lens[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def token_batches(
    sizes: Sequence[int], max_tokens: int, seed: Optional[int] = None, pool_factor: int = 50, by_length: bool = True
) -> List[List[int]]:
    """Indices grouped into batches whose summed `sizes` (tokens per example) stay within
    `max_tokens`; an example larger than the budget gets a batch of its own. Every index
    appears exactly once.

    by_length=True: with a seed, shuffle, sort within pools of about `pool_factor` batches by size,
    cut greedily and shuffle the batch order (deterministic in the seed); without, sorted by size.
    by_length=False: examples in a seeded random order (or in order), cut greedily: batches mix
    lengths, which the padding-free graph batches do not pay for.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    if not by_length:
        order = list(range(len(sizes)))
        if seed is not None:
            random.Random(seed).shuffle(order)
        return _cut(order, [int(n) for n in sizes], max_tokens)
    counts = np.asarray(sizes, dtype=np.int64)
    if seed is None:
        chunks = [np.argsort(counts, kind="stable")]
    else:
        rng = np.random.default_rng(seed)
        shuffled = rng.permutation(len(counts))
        per_batch = max(1, max_tokens // max(1, int(np.median(counts)) if len(counts) else 1))
        pool = pool_factor * per_batch
        chunks = [shuffled[i : i + pool] for i in range(0, len(shuffled), pool)]
        chunks = [c[np.argsort(counts[c], kind="stable")] for c in chunks]
    batches = [b for chunk in chunks for b in _cut(chunk.tolist(), counts.tolist(), max_tokens)]
    if seed is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _cut(order: Sequence[int], sizes: Sequence[int], max_tokens: int) -> List[List[int]]:
    """Consecutive runs of `order` whose sizes sum to at most max_tokens (an oversize one alone)."""
    batches: List[List[int]] = []
    current: List[int] = []
    total = 0
    for i in order:
        if current and total + sizes[i] > max_tokens:
            batches.append(current)
            current, total = [], 0
        current.append(i)
        total += sizes[i]
    if current:
        batches.append(current)
    return batches
