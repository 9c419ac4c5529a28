"""Head-major layout of the csr backend, for graphs whose edges gather sources from far apart.

The interleaved layout (interleaved.py) runs all heads in one sparse call over (N_src * H, D) rows. Each
edge then reads H rows of D values scattered over the whole N_src * H * D matrix: when the
graph has no locality (random edges) nearly every read misses the cache. Here the heads run one
after another: q[:, h], k[:, h], v[:, h] are copied into contiguous (N, D) buffers (sparse calls
need contiguous inputs) and the sparse calls use the graph's own CSR, shared by the heads, so
one call's reads span N_src * D values, 1/H of the data. Outputs are written into their (N, H, D)
places directly. The index is E entries, not H * E, and per-edge values are (H, E) in
destination-sorted order. The copies cost about one extra pass over the inputs (a strided copy
per head and tensor: 8 of them moved 134 MB in ~21 ms on an AVX-512 EPYC), which pays off only
when the reads would miss the cache, or when gradients are wanted on a graph used once: its
backward builds no (H * E) transposed index, where the interleaved one builds three.
`prefers_head_major` decides (on AVX-512 CPUs only, for a Graph that is kept:
`spread_favours_head_major`). Measured there on 2026-11-24 (1 thread, H=8, D=64, fwd+bwd, ms,
interleaved / head-major), on a Graph the caller keeps: window graphs of 2K, 8K and 65K tokens
14 / 20, 51 / 90, 692 / 797, variable-length blocks of 5-50 tokens 52 / 71, random 50K nodes
1399 / 1310, power-law 50K 1151 / 949; on a raw edge_index (a graph per call, its index built
each time): windows 18 / 19, 69 / 77, 817 / 847, variable-length blocks 82 / 59, random 1810 / 1182.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ...graphs import Graph
from ...graphs.order import source_spread
from .. import memory
from .index import HeadMajorIndex
from .primitives import exp_shifted_, sddmm, spmm, take

# Above this many bytes of sources read around each destination, interleaved reads miss the cache
# (measured on a 32 MiB-L3 AMD EPYC: random graphs of 50K nodes gain, window and block graphs lose).
HEAD_MAJOR_MIN_BYTES = 8 << 20
# With gradients wanted on a graph made for one call, head-major from this many (edge, head) slots up
# (window graphs of 2K tokens, E * H = 278K, were level; 256 tokens, 34K, twice as fast interleaved).
HEAD_MAJOR_MIN_TRAINING_SLOTS = 1 << 18


def prefers_head_major(graph: Graph, k: Tensor, training: bool = False) -> bool:
    """Whether the head-major layout should serve k: (N_src, H, D) on this graph: always when
    `training` (gradients wanted) on a graph made for this one call (edge_attention given a raw
    edge_index) of at least HEAD_MAJOR_MIN_TRAINING_SLOTS (edge, head) slots, where building the
    interleaved backward's transposed index would dominate; else, for a Graph that lives on and
    keeps its index, by `head_major_rule` (the interleaved backward, with no per-head copies, is
    1.2-1.8x faster on graphs with locality). CPU tensors only (on CUDA the interleaved layout
    stays). Inside a trace csr takes the head-major layout without asking (see __init__.py)."""
    if k.device.type != "cpu":
        return False
    heads = k.shape[1]
    if training and graph.one_call and heads > 1 and graph.num_edges * heads >= HEAD_MAJOR_MIN_TRAINING_SLOTS:
        return True
    return head_major_rule(graph, heads, heads * k.shape[2] * k.element_size())


def head_major_rule(graph: Graph, heads: int, row_bytes: int) -> bool:
    """True on a CPU where spread-out reads favour head-major (`spread_favours_head_major`) when the
    sources read around a destination, spread * N_src rows of row_bytes (all heads of one source),
    exceed HEAD_MAJOR_MIN_BYTES."""
    if graph.num_edges == 0 or heads <= 1 or graph.num_src * row_bytes <= HEAD_MAJOR_MIN_BYTES:
        return False  # (the last: small enough whatever the spread, which is at most 1)
    if not spread_favours_head_major():
        return False
    return source_spread(graph) * graph.num_src * row_bytes > HEAD_MAJOR_MIN_BYTES


def spread_favours_head_major() -> bool:
    """Whether this CPU runs graphs without locality faster head-major, by the kernels torch
    dispatches to on it: AVX-512 yes, others no. Measured with a Graph kept, 1 thread, H=8, D=64,
    on two AMD EPYCs with 32 MiB of L3: with AVX-512 (2026-11-24) head-major took 0.94x / 0.82x of
    interleaved's fwd+bwd time on random / power-law 50K nodes; with AVX2 (2026-11-27) interleaved
    was 1.36-1.55x faster forward and 1.15-1.30x fwd+bwd on random and power-law 50K nodes, kNN(16)
    points and a 224 x 224 mesh with shuffled ids."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _rows(x: Tensor) -> Optional[Tensor]:
    """A reusable contiguous (N, D) buffer for one head of x: (N, H, D), or None when x is already
    head-major in memory (x.transpose(0, 1) contiguous), so its heads need no copy."""
    return None if x.transpose(0, 1).is_contiguous() else x.new_empty(x.shape[0], x.shape[2])


def _head(x: Tensor, h: int, buf: Optional[Tensor]) -> Tensor:
    """x[:, h] as a contiguous (N, D) tensor: copied into buf, or a view when buf is None."""
    return x[:, h] if buf is None else buf.copy_(x[:, h])


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pat: HeadMajorIndex,
    scale: float,
    clamp: Optional[Tuple[float, float]],
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    eps: float = 0.0,
):
    """q: (N_dst, H, D), k: (N_src, H_kv, D), v: (N_src, H_kv, Dv) (query head h reads kv head
    h // (H / H_kv)); bias, mask: (H, E) sorted or None;
    eps: added to the normalizer. Returns out (N_dst, H, Dv), w and score ((H, E); score None in
    exact mode), z_safe (H, N_dst)."""
    heads, num_edges, shape = q.shape[1], pat.col.numel(), (q.shape[0], k.shape[0])
    out = memory.empty((q.shape[0], heads, v.shape[2]), q)
    w = memory.empty((heads, num_edges), q)
    score = memory.empty((heads, num_edges), q) if clamp is not None else None
    z_safe = q.new_empty(heads, q.shape[0])
    qh, kh, vh = _rows(q), _rows(k), _rows(v)
    groups = heads // k.shape[1]  # query heads per kv head (grouped-query attention)
    k_h = v_h = k  # (the current kv head's rows, copied once per group)
    for h in range(heads):
        s = w[h] if score is None else score[h]
        if h % groups == 0:
            k_h = _head(k, h // groups, kh)
        sddmm(pat.crow, pat.col, _head(q, h, qh), k_h, alpha=scale, out=s.zero_())  # (E,)
        if bias is not None:
            s += bias[h]
        if clamp is not None:
            torch.clamp(s, clamp[0], clamp[1], out=w[h]).exp_()
        else:
            exp_shifted_(s, pat.offsets, pat.row)
        z = torch.segment_reduce(w[h], "sum", offsets=pat.offsets)
        z_safe[h] = z.add_(eps) if eps else z.masked_fill_(z == 0, 1.0)  # no in-edges: wv = 0, so out = 0
        # normalized before the SpMM: an (E,) product instead of dividing the strided (N_dst, Dv) rows
        p = w[h] / take(z_safe[h], pat.row)
        if mask is not None:
            p *= mask[h]
        # each head's sources are copied just before the call that gathers them, so they are in cache
        if h % groups == 0:
            v_h = _head(v, h // groups, vh)
        spmm(pat.crow, pat.col, p, v_h, shape, out=out[:, h])
    return out, w, score, z_safe


def backward(
    grad_out: Tensor,
    grad_weights: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    score: Optional[Tensor],
    z_safe: Tensor,
    mask: Optional[Tensor],
    pat: HeadMajorIndex,
    scale: float,
    clamp,
    need: Tuple[bool, bool, bool, bool],
):
    """The backward of `forward` (the formulas in __init__.py), one head at a time.
    grad_out: (N_dst, H, Dv); grad_weights: (H, E) sorted or None. Returns dq, dk, dv (shaped as
    q, k, v) and ds ((H, E) sorted, the gradient of bias), None where not needed."""
    heads, num_edges, shape = q.shape[1], pat.col.numel(), (q.shape[0], k.shape[0])
    transposed = (shape[1], shape[0])
    dq, dk, dv = (memory.empty_like(x) if n else None for x, n in zip((q, k, v), need))  # x's layout
    ds_all = memory.empty((heads, num_edges), w) if need[3] else None
    need_ds = need[0] or need[1] or need[3]
    a, buf = w.new_empty(num_edges), w.new_empty(num_edges)
    gh, qh, kh, vh = _rows(grad_out), _rows(q), _rows(k), _rows(v)
    groups = heads // k.shape[1]  # query heads per kv head: dk and dv sum over each group
    k_h = v_h = k
    for h in range(heads):
        j, first = h // groups, h % groups == 0
        g = _head(grad_out, h, gh)
        p = w[h] / take(z_safe[h], pat.row)  # (E,) normalized weights
        if dv is not None:
            torch.index_select(p if mask is None else p * mask[h], 0, pat.to_csc, out=buf)
            _add_spmm(pat.ccrow, pat.ccol, buf, g, transposed, 1.0, dv[:, j], first)
        if not need_ds:
            continue
        if first:
            k_h, v_h = (_head(k, j, kh) if dq is not None else k), _head(v, j, vh)
        sddmm(pat.crow, pat.col, g, v_h, out=a.zero_())  # <grad_out[t], v[s]>
        if mask is not None:
            a *= mask[h]
        if grad_weights is not None:
            a += grad_weights[h]
        delta = torch.segment_reduce(torch.mul(a, p, out=buf), "sum", offsets=pat.offsets)  # (N_dst,)
        ds = a.sub_(torch.index_select(delta, 0, pat.row, out=buf)).mul_(p)
        if score is not None:  # clamp mode: no gradient where the clamp is active
            ds.masked_fill_((score[h] < clamp[0]) | (score[h] > clamp[1]), 0.0)
        if ds_all is not None:
            ds_all[h] = ds
        if dq is not None:
            spmm(pat.crow, pat.col, ds, k_h, shape, alpha=scale, out=dq[:, h])
        if dk is not None:
            torch.index_select(ds, 0, pat.to_csc, out=buf)
            _add_spmm(pat.ccrow, pat.ccol, buf, _head(q, h, qh), transposed, scale, dk[:, j], first)
    return dq, dk, dv, ds_all


def _add_spmm(crow, col, values, x, shape, alpha: float, out: Tensor, first: bool) -> None:
    """out = spmm(...) for the first query head of a kv head's group, out += spmm(...) after it."""
    if first:
        spmm(crow, col, values, x, shape, alpha=alpha, out=out)
    else:
        out += spmm(crow, col, values, x, shape, alpha=alpha)


__all__ = [
    "HEAD_MAJOR_MIN_BYTES",
    "HEAD_MAJOR_MIN_TRAINING_SLOTS",
    "head_major_rule",
    "prefers_head_major",
    "spread_favours_head_major",
    "source_spread",
    "forward",
    "backward",
]
