"""The "dense" backend: batched matmuls over the dense blocks a builder recorded in `graph.blocks`.

A Transformer batch is a block-diagonal union of complete, causal or complete-bipartite blocks
(`Block`). Blocks of one kind are sorted by size and bucketed; each bucket is padded to its
largest block (only inside this kernel) and runs as one batched matmul:
    scores (B, H, Lq, Lk) = scale * q @ k^T (+ bias scattered to its dense positions)
    w = exp(clamp(scores)) or exp(scores - row max), 0 outside the block's edges
    out = (w * dropout_mask) @ v / sum(w)
with torch's own autograd. A bucket accepts a block while its padded area stays within
`MAX_WASTE` of the blocks' own areas, so padding costs at most that fraction of extra work
(`plan(graph).waste` reports it). With no bias, dropout or returned weights, uniform full/causal
buckets call `F.scaled_dot_product_attention` in exact mode (clamp=None), and in clamp mode for
the rows whose scores provably stay inside the clamp, where clamp-exp is exact softmax; the other
clamp-mode rows run `DenseClampAttention` (tile by tile, hand-written backward that recomputes the
weights: no (B, H, lq, lk) tensor is stored). On CUDA, clamp mode on those buckets with half inputs
runs fused instead (`dense/triton_blocks.py`: no (B, H, Lq, Lk) tensor; 3-14x faster forward and 1.7-6.6x
forward+backward than the batched matmuls on an H100).
Under torch.compile and torch.export every clamp-mode row runs the same math in out-of-place ops
that autograd differentiates (no branch on the data, so no graph break; compiled code through the
Function gave zero gradients under torch 2.11); a plan not built before is built inside the trace.
Half types run in float32, except that on CUDA the SDPA calls take them as they are (its fused
kernels accumulate in float32; an H100 ran the float32 kernel 5-10x slower). Inside a block every
destination sees every source value, so NaN/inf in one source row reaches the whole block; the
registered backend checks this function's results and computes a call that is not finite with
csr instead (kernels/guard.py), which keeps it to the destinations with an edge from that row.

Modules by job: plan.py (buckets and their cached parts, `plan`, `prepare`), tiles.py (clamp mode
tile by tile: `DenseClampAttention`), dispatch.py (`dense_attention`: each bucket's path).

Shapes: q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), bias/dropout_mask (E, H).
"""

from .dispatch import dense_attention
from .plan import DENSE_MAX_SHAPES, DENSE_MIN_EDGES_PER_BLOCK, MAX_WASTE, Plan, plan, prepare

__all__ = ["dense_attention", "plan", "prepare", "Plan", "MAX_WASTE", "DENSE_MAX_SHAPES", "DENSE_MIN_EDGES_PER_BLOCK"]
