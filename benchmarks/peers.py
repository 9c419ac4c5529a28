"""The peers the benchmarks compare against, each a no-argument callable on the same (N, H, D) inputs
returning (N_dst, H, Dv), with a byte estimate where it can be large: masked SDPA on a padded batch, the
dense bmm floor, torch_geometric's TransformerConv recipe, and FlexAttention with a block mask from the graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparseattn import graphs

HEADS, DIM = 8, 64


def _padded_index(fam, g: graphs.Graph):
    """For block families: (B, L) gather indices and validity of destinations and sources, and the
    (B, 1, Lq, Lk) mask of valid pairs (causal ones for a causal family)."""
    b = len(fam.lengths)
    lq, lk = max(d for _, d in fam.lengths), max(s for s, _ in fam.lengths)
    qi, ki = torch.zeros(b, lq, dtype=torch.long), torch.zeros(b, lk, dtype=torch.long)
    qv, kv = torch.zeros(b, lq, dtype=torch.bool), torch.zeros(b, lk, dtype=torch.bool)
    for i, ((ns, nd), s0, d0) in enumerate(zip(fam.lengths, g.src_ptr, g.dst_ptr)):
        qi[i, :nd], qv[i, :nd] = torch.arange(d0, d0 + nd), True
        ki[i, :ns], kv[i, :ns] = torch.arange(s0, s0 + ns), True
    mask = qv[:, None, :, None] & kv[:, None, None, :]
    if fam.kind == "causal":
        mask = mask & torch.ones(lq, lk, dtype=torch.bool).tril()
    return qi, qv, ki, kv, mask


def make_sdpa(fam, g: graphs.Graph, q, k, v):
    """Masked SDPA on a padded batch as a user would write it; returns (fn, bytes estimate)."""
    if fam.lengths is None:  # one graph: a (N_dst, N_src) boolean mask
        mask = torch.zeros(g.num_dst, g.num_src, dtype=torch.bool)
        mask[g.dst, g.src] = True

        def fn():
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask
            )
            return o[0].transpose(0, 1)

        return fn, g.num_dst * g.num_src * (HEADS * 4 * 5 + 1)
    qi, qv, ki, kv, mask = _padded_index(fam, g)
    rows = qi[qv]

    def fn():
        qb, kb, vb = (x[i].transpose(1, 2) for x, i in ((q, qi), (k, ki), (v, ki)))  # (B, H, L, D)
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)  # (B, H, Lq, Dv)
        out = torch.zeros(g.num_dst, HEADS, v.shape[2], dtype=q.dtype)
        return out.index_put((rows,), o.transpose(1, 2)[qv])

    return fn, mask.numel() * HEADS * 4 * 5


def make_sdpa_exact(g: graphs.Graph, q, k, v):
    """Unmasked F.scaled_dot_product_attention on (B, H, L, D) views of a graph of B equal square
    blocks (is_causal for causal ones): exact softmax, the fused kernel clamp-mode "auto" is
    measured against. ValueError for any other graph."""
    kinds = {(b.kind, b.n_src, b.n_dst) for b in g.blocks or ()}
    kind, length, n_dst = next(iter(kinds)) if len(kinds) == 1 else ("", 0, -1)
    if kind not in ("full", "causal") or length != n_dst or length * len(g.blocks or ()) != g.num_dst:
        raise ValueError("the graph is not a batch of equal complete blocks (nor of equal causal ones)")

    def fn():
        qb, kb, vb = (x.view(-1, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))  # (B, H, L, D)
        o = F.scaled_dot_product_attention(qb, kb, vb, scale=q.shape[-1] ** -0.5, is_causal=kind == "causal")
        return o.transpose(1, 2).reshape(g.num_dst, q.shape[1], -1)

    return fn


def sdpa_kernel_name(fn) -> str:
    """The aten kernel F.scaled_dot_product_attention dispatched to inside fn (one profiled call)."""
    from torch.profiler import profile

    with profile() as prof, torch.no_grad():
        fn()
    names = {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}
    return ", ".join(sorted(names - {"aten::scaled_dot_product_attention"})) or "none"


def make_dense_bmm(fam, g: graphs.Graph, q, k, v, clamp=(-5.0, 5.0)):
    """Padded bmm + clamp-exp directly on (B, H, L, D) tensors, no graph. Inputs are reshaped
    views when the batch is uniform; otherwise gathered into a padded batch."""
    b = len(fam.lengths)
    lq, lk = max(d for _, d in fam.lengths), max(s for s, _ in fam.lengths)
    uniform = all(x == fam.lengths[0] for x in fam.lengths)
    scale = DIM**-0.5
    mask = None if fam.kind != "causal" else torch.ones(lq, lk, dtype=torch.bool).tril()
    if not uniform:
        qi, qv, ki, kv, mask = _padded_index(fam, g)

    def fn():
        if uniform:
            qb, kb, vb = (x.view(b, -1, HEADS, x.shape[2]).transpose(1, 2) for x in (q, k, v))
        else:
            qb, kb, vb = (x[i].transpose(1, 2) for x, i in ((q, qi), (k, ki), (v, ki)))
        s = torch.matmul(qb, kb.transpose(-1, -2)) * scale
        w = torch.exp(s.clamp(*clamp))
        if mask is not None:
            w = w.masked_fill(~mask, 0.0)
        z = w.sum(-1, keepdim=True)
        o = torch.matmul(w, vb) / z.clamp_min(1e-30)  # (B, H, Lq, Dv)
        o = o.transpose(1, 2)
        return o.reshape(-1, HEADS, o.shape[-1]) if uniform else o[qv]

    return fn, b * HEADS * lq * lk * 4 * 3


def pyg_label() -> str:
    """The peer's label in outputs, "torch_geometric X.Y" (ImportError when it is not installed)."""
    import torch_geometric

    return "torch_geometric " + ".".join(torch_geometric.__version__.split(".")[:2])


def make_pyg(g: graphs.Graph, q, k, v, clamp=None):
    """TransformerConv's message passing on (N, H, D) q/k/v: alpha = <q[dst], k[src]> / sqrt(D) (clamped
    to `clamp` if given), `torch_geometric.utils.softmax` per destination (exact, max-subtracted), then
    `utils.scatter` of v[src] * alpha. Returns (fn, bytes estimate, label); ImportError without PyG."""
    label = pyg_label()
    # the index rows taken here, outside the call: compiled with the rows selected inside (g.src, g.dst
    # or a (2, E) argument), the recipe's fwd+bwd ran 1.6-1.8x slower on random-50k (benchmarks/standalone.py)
    src, dst, num_dst = g.src, g.dst, g.num_dst

    def fn():
        return pyg_attention(q, k, v, src, dst, num_dst, clamp)

    return fn, g.num_edges * HEADS * DIM * 4 * 4, label


def pyg_attention(q, k, v, src, dst, num_dst: int, clamp=None):
    """make_pyg's recipe as one function of its tensors (what a user compiles once for a stream of graphs):
    q (N_dst, H, D), k (N_src, H, D), v (N_src, H, Dv), src and dst (E,) -> (N_dst, H, Dv)."""
    from torch_geometric.utils import scatter, softmax

    alpha = (q.index_select(0, dst) * k.index_select(0, src)).sum(-1) * q.shape[-1] ** -0.5  # (E, H)
    alpha = softmax(alpha if clamp is None else alpha.clamp(*clamp), index=dst, num_nodes=num_dst)
    msg = v.index_select(0, src) * alpha.unsqueeze(-1)  # (E, H, Dv)
    return scatter(msg, dst, dim=0, dim_size=num_dst, reduce="sum")


def graph_block_mask(g: graphs.Graph, block: int = 128):
    """FlexAttention BlockMask from the CSR, for graphs where destination t attends to exactly the
    sources lo[t]..hi[t]: the (q block, kv block) tiles that hold edges, full where every pair in the
    tile is an edge, and a mask_mod that looks the range up. Returns the mask and a description."""
    from torch.nn.attention.flex_attention import BlockMask

    ptr, idx, _ = g.csr()
    deg = ptr.diff()
    lo = torch.where(deg > 0, idx[ptr[:-1].clamp(max=g.num_edges - 1)], 1)  # (N_dst,); no in-edges: lo > hi
    hi = torch.where(deg > 0, idx[(ptr[1:] - 1).clamp(min=0)], 0)
    if not bool(((deg == 0) | (hi - lo + 1 == deg)).all()):  # idx is sorted within a row
        raise ValueError("some destination's sources are not one contiguous range (no graph lookup for that)")
    nq, nk = -(-g.num_dst // block), -(-g.num_src // block)
    tiles, count = torch.unique(g.dst // block * nk + g.src // block, return_counts=True)  # sorted
    qb, kb = tiles // nk, tiles % nk
    full = count == (g.num_dst - qb * block).clamp(max=block) * (g.num_src - kb * block).clamp(max=block)

    def blocks(sel):  # kv_num_blocks (1, 1, nq), kv_indices (1, 1, nq, nk): the kv blocks of each q block
        num = torch.bincount(qb[sel], minlength=nq)
        slot = torch.arange(int(sel.sum()), device=qb.device) - (num.cumsum(0) - num)[qb[sel]]
        ind = torch.zeros(nq, nk, dtype=torch.int32, device=qb.device).index_put_((qb[sel], slot), kb[sel].int())
        return num.int()[None, None], ind[None, None]

    def mask_mod(b, h, q_idx, kv_idx):
        return (lo[q_idx] <= kv_idx) & (kv_idx <= hi[q_idx])

    mask = BlockMask.from_kv_blocks(
        *blocks(~full), *blocks(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(g.num_dst, g.num_src)
    )
    return mask, f"{int((~full).sum())} partial + {int(full.sum())} full {block}x{block} blocks of {nq * nk}"


def make_flex(g: graphs.Graph, q, k, v, clamp=None, compiled: bool = True, scale=None):
    """FlexAttention over `graph_block_mask(g)` (compiled, or eager: dense math), scores clamped to `clamp`
    if given; returns (fn, the mask's description). ValueError where the mask cannot express g."""
    from torch.nn.attention.flex_attention import flex_attention

    mask, detail = graph_block_mask(g)
    run = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    score_mod = None if clamp is None else (lambda s, b, h, q_idx, kv_idx: s.clamp(*clamp))

    def fn():  # (N, H, D) -> (1, H, N, D) and back
        out = run(*(x.transpose(0, 1)[None] for x in (q, k, v)), score_mod=score_mod, block_mask=mask, scale=scale)
        return out[0].transpose(0, 1)

    return fn, detail
