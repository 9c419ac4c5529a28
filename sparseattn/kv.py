"""Keys and values kept across calls of `EdgeAttention`: projected once, cached while decoding,
or updated for a shrinking set of active nodes.

A `KVStore` is what `EdgeAttention(..., cache=store)` writes a call's keys and values into and
reads the keys and values to attend to from:
    KVCache  one new row per sequence per call (incremental decoding); `step_graph()` is the graph
             from every cached row of a sequence into its newest one
    NodeKV   one row per node of a fixed graph; a call with `dst_rows` overwrites those nodes' rows
             and the others keep theirs (Adaptive Computation Time: halted nodes stay readable)
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .graphs import Block, Graph


class KeyValue(NamedTuple):
    """Projected keys k: (N_src, H, D) and values v: (N_src, H, Dv)."""

    k: Tensor
    v: Tensor


class KVStore:
    """Base class of caches: `update(kv, rows)` stores this call's keys and values and returns the
    keys and values attention reads."""

    def update(self, kv: KeyValue, rows: Optional[Tensor] = None) -> KeyValue:
        """Store this call's keys and values (k: (R, H, D), v: (R, H, Dv); `rows`: (R,) node ids
        they belong to, or None) and return every key and value attention reads, (N_src, H, ·)."""
        raise NotImplementedError


class KVCache(KVStore):
    """Keys and values of B sequences, growing by one row per sequence and call.

    `update(kv)` takes (B, H, D) rows (sequence b's newest token) and returns all rows so far,
    sequence-major: (B * T, H, D), sequence b's rows at b*T .. b*T + T - 1. `step_graph()` connects
    them to the newest rows; `reorder(index)` keeps sequences `index` (beam search)."""

    def __init__(self) -> None:
        self.k: Optional[Tensor] = None  # (B, T, H, D)
        self.v: Optional[Tensor] = None

    @property
    def length(self) -> int:
        """T, the rows cached per sequence."""
        return 0 if self.k is None else self.k.shape[1]

    def update(self, kv: KeyValue, rows: Optional[Tensor] = None) -> KeyValue:
        """Append one row per sequence: kv.k (B, H, D), kv.v (B, H, Dv) -> every row so far,
        (B * T, H, D) and (B * T, H, Dv), sequence-major. `rows` must be None (ValueError)."""
        if rows is not None:
            raise ValueError("KVCache appends one row per sequence; dst_rows is not supported with it")
        k, v = kv.k[:, None], kv.v[:, None]  # (B, 1, H, D)
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        return KeyValue(self.k.flatten(0, 1), self.v.flatten(0, 1))

    def reorder(self, index: Tensor) -> None:
        """Keep the sequences `index` (B',) int64, in that order (beam search: a hypothesis's
        cache follows the hypothesis it extends); an empty cache stays empty."""
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k[index], self.v[index]

    def step_graph(self, num_sequences: int, device: Optional[torch.device] = None) -> Graph:
        """Edges from each sequence's T + 1 rows (the cached ones and the one this call appends)
        into its newest row: (B * (T + 1) sources -> B destinations), destination-major. Built
        without validation, with its dense blocks recorded: sequence b is a "full" block of T + 1
        sources b*(T+1) .. and destination b (what `graphs.from_blocks([("full", T + 1, 1)] * B)`
        builds, at a fraction of its cost), so "auto" takes the dense backend (measured on B = 64
        sequences: faster than csr, on par where the clamp may bind)."""
        t = self.length + 1
        dst = torch.arange(num_sequences, device=device).repeat_interleave(t)
        src = torch.arange(num_sequences * t, device=device)
        blocks = [Block("full", b * t, b, t, 1, b * t) for b in range(num_sequences)]
        return Graph.unchecked(
            torch.stack([src, dst]), num_sequences * t, num_sequences, blocks=blocks, sorted_by_dst=True
        )


class NodeKV(KVStore):
    """The latest keys and values of every node of a graph. `update(kv, rows)` overwrites the rows
    `rows` (all rows when None) with kv: (len(rows), H, D) and returns every node's: (N, H, D)."""

    def __init__(self) -> None:
        self.kv: Optional[KeyValue] = None

    def update(self, kv: KeyValue, rows: Optional[Tensor] = None) -> KeyValue:
        """Overwrite the nodes `rows` (R,) int64 with kv (R, H, D) and return every node's keys and
        values, (N, H, D). The first update holds every node in order (rows ignored); later ones
        need rows (ValueError otherwise)."""
        if self.kv is None:  # the first update holds every node, in order
            self.kv = kv
        elif rows is None:
            raise ValueError("NodeKV updates after the first need rows")
        else:
            self.kv = KeyValue(self.kv.k.index_copy(0, rows, kv.k), self.kv.v.index_copy(0, rows, kv.v))
        return self.kv
