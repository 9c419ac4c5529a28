"""The "local" backend: locally dense graphs (windows, meshes in row-major order, banded graphs)
as tiles of T consecutive destination rows over the one contiguous span of S source rows their
edges touch, through batched matmuls masked to the graph's edges.

    scores (tiles, T, S) = scale * q_tile k_span^T
    p = softmax(clamp(scores) + bias)   (bias 0 at edges, -inf elsewhere; exact mode: no clamp)
    out_tile = p v_span

Clamp and exact modes, hand-written backward that recomputes the weights; eager only. The plan
(tile sizes, each tile's span, the edges' tile positions) is built once per graph and cached on
it. Calls with bias, dropout or returned weights go to the csr backend; an edge repeated m times
weighs m times (log m in its position's bias); graphs whose tiles would be mostly empty (random
ones) are refused with a ValueError. Inside a tile every destination's scores read
every span row, so NaN/inf in a source row reaches every destination of the tiles whose span
holds it; the registered backend checks this function's results and computes a call that is not
finite with csr instead (kernels/guard.py). "auto" picks it on CPU for rows of many edges in dense enough
tiles (`LOCAL_MIN_DEGREE`, `LOCAL_MIN_DENSITY` in plan.py; the rule is kernels/auto.py).

Modules by job: plan.py (`Layout`, `Plan`, `plan`), tiles.py (one head of a batch of tiles,
forward and backward), attention.py (`LocalAttention`, `local_attention`).

Shapes: q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv).
"""

from .attention import CHUNK_BYTES, LocalAttention, local_attention, local_takes
from .plan import (
    LOCAL_MIN_DEGREE,
    LOCAL_MIN_DENSITY,
    MAX_POSITIONS_PER_EDGE,
    TILE_ROWS,
    Layout,
    Plan,
    cached_layout,
    choose_tile_rows,
    layout,
    plan,
    takes,
)

__all__ = [
    "LOCAL_MIN_DEGREE",
    "LOCAL_MIN_DENSITY",
    "local_attention",
    "local_takes",
    "LocalAttention",
    "CHUNK_BYTES",
    "Layout",
    "Plan",
    "layout",
    "cached_layout",
    "choose_tile_rows",
    "plan",
    "takes",
    "TILE_ROWS",
    "MAX_POSITIONS_PER_EDGE",
]
