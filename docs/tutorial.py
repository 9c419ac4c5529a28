# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The Transformer as a graph neural network, with sparseattn
#
# DGL's tutorial "Transformer as a Graph Neural Network" showed that a Transformer's attention is
# message passing on a graph: every token is a node, and a token attends to exactly the tokens that
# have an edge into it. That tutorial no longer runs (its `dgl.contrib.transformer` module and data
# servers are gone, and DGL does not install on current PyTorch). This notebook walks the same road
# with `sparseattn`, which implements attention along edges in plain PyTorch, and it runs top to
# bottom on a laptop CPU in a few minutes:
#
# 1. attention as message passing, checked against a dense masked computation;
# 2. the three graphs of an encoder-decoder, and a batch as one block-diagonal graph with no padding;
# 3. speed: the per-edge recipe against the `csr`, `dense` and `auto` backends, time and memory;
# 4. the model: `EdgeAttention` in a pre-norm layer, then `GraphTransformer` trained on the copy task;
# 5. attention maps of the encoder, the decoder and the cross attention;
# 6. the Universal Transformer with Adaptive Computation Time;
# 7. beyond the tutorial: local attention on long sequences, and your own graph in your own model.
#
# Install: `pip install torch==2.13.0 && pip install -e ".[tutorial]"` from a clone of the repository.
# Every figure and number below is produced by the cells of this notebook. Set the environment
# variable `SPARSEATTN_TUTORIAL_SMALL=1` to run everything at toy sizes in well under three
# minutes (our test suite does this on every run); the stored outputs come from a run at the default
# sizes.

# %%
import ctypes
import functools
import gc
import os
import platform
import subprocess
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

import sparseattn
from sparseattn import EdgeAttention, NodeKV, edge_attention, graphs, record_attention
from sparseattn.models import GraphPool, GraphTransformer, UniversalTransformer, decode
from sparseattn.train.config import make_config  # the training application's data: the copy and sort tasks
from sparseattn.train.tasks import get_task

SMALL = os.environ.get("SPARSEATTN_TUTORIAL_SMALL", "0") not in ("", "0")
torch.set_num_threads(1)  # one thread: on a small shared machine more threads mostly wait for each other
torch.manual_seed(0)


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


print(f"sparseattn {sparseattn.__version__} | torch {torch.__version__} | python {platform.python_version()}")
print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores, torch threads: {torch.get_num_threads()}")
print(f"mode: {'SMALL (toy sizes)' if SMALL else 'full'}")

# %% [markdown]
# ## 1. Attention as message passing
#
# Write the keys, queries and values of node $i$ as $k_i, q_i, v_i$ (one vector per head). Along each
# edge $j \to i$ the source $j$ sends the message $v_j$ with the score
# $s_{ji} = \langle k_j, q_i \rangle / \sqrt{D}$. The destination normalises the scores of its in-edges
# and sums the messages:
#
# $$ w_{ji} = \frac{\exp(s_{ji})}{\sum_{j' \to i} \exp(s_{j'i})}, \qquad
#    \text{out}_i = \sum_{j \to i} w_{ji}\, v_j . $$
#
# On a complete graph this is ordinary softmax attention; on any other graph it is attention with a
# mask, but computed only on the edges that exist. `sparseattn` clamps the score to $[-5, 5]$ before
# `exp` by default (the DGL tutorial's trick: nothing overflows and no maximum is needed);
# `clamp=None` subtracts each destination's maximum instead and gives the exact softmax.
#
# Here is a 5-node graph, given as a `(2, E)` tensor of (source, destination) pairs. Node 4 has no
# in-edges at all.

# %%
edges = torch.tensor(
    [
        [0, 1, 2, 1, 2, 3, 0, 3, 4, 2],  # source
        [0, 0, 0, 1, 1, 1, 2, 2, 2, 3],  # destination
    ]
)
N, H, D = 5, 2, 4
q, k, v = torch.randn(3, N, H, D).unbind(0)  # each (N, H, D)

out_sparse = edge_attention(q, k, v, edges, clamp=None)  # exact softmax along the edges
print("in-degree of each node:", torch.bincount(edges[1], minlength=N).tolist())

# %% [markdown]
# The same numbers from a dense computation: score every pair, mask the pairs without an edge, take a
# softmax per row. A row with no edge at all would be all `-inf` and produce NaN, so it is set to 0,
# which is what `edge_attention` returns for a node with no in-edges.


# %%
def dense_masked_attention(q, k, v, edges):
    """q, k, v: (N, H, D); edges (2, E). Returns (N, H, D)."""
    n = q.shape[0]
    mask = torch.zeros(n, n, dtype=torch.bool)  # mask[dst, src]
    mask[edges[1], edges[0]] = True
    scores = torch.einsum("ihd,jhd->hij", q, k) / q.shape[-1] ** 0.5  # (H, N_dst, N_src)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows without edges -> 0
    return torch.einsum("hij,jhd->ihd", weights, v)


out_dense = dense_masked_attention(q, k, v, edges)
print("node | edge_attention (head 0, first 3 features) | dense masked (same)")
for i in range(N):
    a, b = out_sparse[i, 0, :3].tolist(), out_dense[i, 0, :3].tolist()
    print(f"  {i}  | {' '.join(f'{x:+.4f}' for x in a)}           | {' '.join(f'{x:+.4f}' for x in b)}")
print("max |difference| over all nodes, heads, features:", (out_sparse - out_dense).abs().max().item())

# %% [markdown]
# With the default clamp the result is the same as long as every score stays inside $[-5, 5]$, which
# is the case for these small random vectors:

# %%
out_clamped = edge_attention(q, k, v, edges)  # clamp=(-5, 5)
scores = (k[edges[0]] * q[edges[1]]).sum(-1) / D**0.5
print(
    f"scores span [{scores.min():.2f}, {scores.max():.2f}];",
    "max |clamped - exact| =",
    (out_clamped - out_sparse).abs().max().item(),
)

# %% [markdown]
# ## 2. The three graphs of an encoder-decoder
#
# A translation model sees a source sentence and a target sentence. Its attention needs three graphs:
#
# * **encoder self-attention**: every source token attends to every source token, itself included
#   (`graphs.complete(n)`);
# * **decoder self-attention**: target token $t$ attends to targets $0..t$ only, so it cannot peek at
#   the future (`graphs.causal(m)`);
# * **cross attention**: every target token attends to every source token (`graphs.bipartite(n, m)`).
#
# We draw each graph as its adjacency matrix: row = destination, column = source, a filled cell = an
# edge.


# %%
def adjacency(g, n_src=None, n_dst=None):
    """(N_dst, N_src) 0/1 matrix of a Graph (row = destination, column = source)."""
    a = torch.zeros(n_dst or g.num_dst, n_src or g.num_src)
    a[g.dst, g.src] = 1.0
    return a.numpy()


src_sentence, tgt_sentence = "the cat sat on the mat".split(), "le chat est assis".split()
n, m = len(src_sentence), len(tgt_sentence)
pair_graphs = {
    "encoder: complete(n)": (graphs.complete(n), src_sentence, src_sentence),
    "decoder: causal(m)": (graphs.causal(m), tgt_sentence, tgt_sentence),
    "cross: bipartite(n, m)": (graphs.bipartite(n, m), src_sentence, tgt_sentence),
}
fig, axes = plt.subplots(1, 3, figsize=(12, 4))
for ax, (title, (g, cols, rows)) in zip(axes, pair_graphs.items()):
    ax.imshow(adjacency(g), cmap="Blues", vmin=0, vmax=1.3)
    ax.set_xticks(range(len(cols)), cols, rotation=90)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("source (sends)")
    ax.set_title(f"{title}\n{g.num_edges} edges")
axes[0].set_ylabel("destination (attends)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### A batch is one big graph
#
# Sentences have different lengths. A dense Transformer pads every sentence to the longest one and
# masks the padding; a graph Transformer instead puts the sentences' graphs side by side in one
# block-diagonal graph (`graphs.batch`). There is one row per real token and no padding anywhere.
# `sparseattn.models.GraphPool` builds the three batched graphs for lists of token ids (and caches
# the per-length pieces).

# %%
rng = np.random.default_rng(0)
lengths = [int(x) for x in rng.integers(3, 15, size=6)]
sources = [list(rng.integers(3, 29, size=n)) for n in lengths]
pool = GraphPool()
batch = pool.batch(sources, sources, bos=1, eos=2)  # copy task: the target is the source
print("source lengths:", batch.src_lens, " decoder lengths (BOS + target):", batch.tgt_lens)
print("encoder graph:", batch.enc_graph)

fig, axes = plt.subplots(1, 3, figsize=(13, 4.5))
for ax, (name, g) in zip(
    axes, [("encoder", batch.enc_graph), ("decoder", batch.dec_graph), ("cross", batch.cross_graph)]
):
    ax.imshow(adjacency(g), cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
    ax.set_title(f"batched {name} graph: {g.num_dst} x {g.num_src} nodes, {g.num_edges} edges")
    ax.set_xlabel("source node")
axes[0].set_ylabel("destination node")
plt.tight_layout()
plt.show()

# %%
B, n_max, m_max = batch.num_sentences, max(batch.src_lens), max(batch.tgt_lens)
rows = [
    ("encoder tokens", sum(batch.src_lens), B * n_max),
    ("decoder tokens", sum(batch.tgt_lens), B * m_max),
    ("encoder score pairs", batch.enc_graph.num_edges, B * n_max * n_max),
    ("decoder score pairs", batch.dec_graph.num_edges, B * m_max * m_max),
    ("cross score pairs", batch.cross_graph.num_edges, B * m_max * n_max),
]
print(f"{'':22s}{'graph batch':>12s}{'padded batch':>14s}{'padded/graph':>14s}")
for name, ours, padded in rows:
    print(f"{name:22s}{ours:12d}{padded:14d}{padded / ours:14.2f}x")

# %% [markdown]
# The padded batch computes every score of every (padded) pair, including the upper triangle of the
# decoder that the causal mask then throws away. The graph batch computes the edges only.
#
# ## 3. Speed: from the per-edge recipe to fused kernels
#
# DGL's tutorial sped its first version up by replacing Python message functions with built-in ones.
# The same story here, with backends. The per-edge recipe is three steps, one tensor per edge:
#
# 1. **gather**: copy $k_{src}$, $q_{dst}$ and $v_{src}$ onto every edge, (E, H, D) each;
# 2. **score and clamp-exp**: $w_e = \exp(\mathrm{clamp}(\langle k, q\rangle / \sqrt D))$;
# 3. **scatter-add**: sum $w_e v_{src}$ and $w_e$ into each destination, then divide.
#
# Written out, it is ten lines:


# %%
def per_edge_attention(q, k, v, edges, lo=-5.0, hi=5.0):
    src, dst = edges[0], edges[1]
    k_e, q_e, v_e = k[src], q[dst], v[src]  # gather: (E, H, D) each
    w = torch.exp(((k_e * q_e).sum(-1) / q.shape[-1] ** 0.5).clamp(lo, hi))  # (E, H)
    num = torch.zeros(q.shape[0], *v.shape[1:]).index_add_(0, dst, w[..., None] * v_e)  # (N, H, D)
    den = torch.zeros(q.shape[0], q.shape[1]).index_add_(0, dst, w)  # (N, H)
    return num / den.clamp_min(1e-30)[..., None]  # no in-edges -> 0


print(
    "max |per-edge - edge_attention| on the 5-node graph:",
    (per_edge_attention(q, k, v, edges) - out_clamped).abs().max().item(),
)

# %% [markdown]
# `sparseattn`'s `reference` backend is this recipe. The faster backends never build an (E, H, D)
# tensor:
#
# * `csr` computes all scores with one sampled matrix product over the destination-sorted edges and
#   aggregates with one sparse-dense product, with a hand-written backward;
# * `dense` works on graphs whose builder recorded dense blocks (`complete`, `causal`, `bipartite`
#   and batches of them): it groups blocks of equal shape and runs one batched matmul per group;
# * `auto` picks `dense` for large equal blocks and `csr` otherwise (and the Triton kernel on a GPU).
#
# We time forward + backward on two encoder batches: many short sentences of varied length, and a
# few long sentences of equal length. **The timings are taken on whatever machine runs this notebook
# (named at the top); ours is a 2-core machine shared with other jobs, so expect noise of tens of
# percent. We therefore report the CPU time of this process (one thread) rather than wall time;
# on an idle machine the two agree. Compare the rows of one table, not numbers across runs.**


# %%
def fwd_bwd_ms(fn, *args, reps=5, warmup=2):
    """Median CPU milliseconds of fn() followed by a backward pass (CPU time of this process: with one
    thread it is the work done, and it does not count the time other programs held the core)."""
    times = []
    for i in range(warmup + reps):
        t0 = time.process_time()
        fn(*args).sum().backward()
        if i >= warmup:
            times.append((time.process_time() - t0) * 1e3)
    return float(np.median(times))


def _glibc():
    """glibc, told to hand large blocks straight back to the system, so that resident memory
    measures what a call holds (None on other platforms: memory is then not measured)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: blocks over 64 KiB are mmapped, unmapped on free
        libc.mallopt(-1, 64 * 1024)  # M_TRIM_THRESHOLD
        return libc
    except (OSError, AttributeError):
        return None


LIBC = _glibc()


def peak_extra_mib(fn, *args):
    """Peak resident memory that fn(*args) + backward adds, in MiB (Linux only; None elsewhere)."""
    if LIBC is None:
        return None
    gc.collect()
    LIBC.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current size

        def status(key):
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

        before = status("VmRSS")
        fn(*args).sum().backward()
        return max(0.0, (status("VmHWM") - before) / 1024)
    except (OSError, StopIteration):
        return None


H, D = 4, 32
bench_graphs = {
    "varied: 64 sentences, 5-40 tokens": graphs.batch(
        [graphs.complete(int(n)) for n in np.random.default_rng(1).integers(5, 41, size=16 if SMALL else 64)]
    ),
    f"equal: 8 sentences x {64 if SMALL else 128} tokens": graphs.batch([graphs.complete(64 if SMALL else 128)] * 8),
}
for title, g in bench_graphs.items():
    q, k, v = (torch.randn(g.num_dst, H, D, requires_grad=True) for _ in range(3))
    contenders = {"per-edge recipe (above)": (per_edge_attention, g.edge_index)}
    for name in ("reference", "csr", "dense", "auto"):
        contenders[f"backend={name!r}"] = (functools.partial(edge_attention, backend=name), g)
    expected = per_edge_attention(q, k, v, g.edge_index).detach()
    print(f"{title}: N={g.num_dst}, E={g.num_edges}, H={H}, D={D}, float32, forward+backward")
    print(f"  {'':26s}{'ms':>8s}{'x faster':>10s}{'peak MiB':>10s}{'max err':>10s}")
    base = None
    for name, (fn, graph) in contenders.items():
        err = (fn(q, k, v, graph).detach() - expected).abs().max().item()
        ms = fwd_bwd_ms(fn, q, k, v, graph, reps=2 if SMALL else 5, warmup=1)
        base = base or ms
        mib = peak_extra_mib(fn, q, k, v, graph)
        print(f"  {name:26s}{ms:8.1f}{base / ms:10.1f}{'n/a' if mib is None else f'{mib:.0f}':>10s}{err:10.1e}")
    per_edge_mib = 3 * g.num_edges * H * D * 4 / 2**20
    print(f"  the gathered k, q, v alone are 3 x E x H x D floats = {per_edge_mib:.0f} MiB\n")

# %% [markdown]
# ## 4. The model
#
# ### `EdgeAttention` in a pre-norm layer
#
# `EdgeAttention` is the module version, with `nn.MultiheadAttention`'s parameters: it projects node
# features to queries, keys and values, calls `edge_attention` along the graph you pass, and projects
# the result back. An encoder layer is then the usual two residual blocks; in the pre-norm arrangement
# each block is `x + f(LayerNorm(x))`:


# %%
class MyEncoderLayer(torch.nn.Module):
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.attn = EdgeAttention(d_model, num_heads)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d_model, d_ff), torch.nn.ReLU(), torch.nn.Linear(d_ff, d_model))
        self.norm1, self.norm2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)

    def forward(self, x, graph):  # x: (N, d_model), one row per token of the whole batch
        x = x + self.attn(self.norm1(x), graph)
        return x + self.ff(self.norm2(x))


layer = MyEncoderLayer(d_model=32, num_heads=4, d_ff=64)
x = torch.randn(batch.enc_graph.num_dst, 32)
y = layer(x, batch.enc_graph)
print(
    "input",
    tuple(x.shape),
    "-> output",
    tuple(y.shape),
    "; per sentence:",
    [tuple(t.shape) for t in batch.enc_graph.split_dst(y)],
)

# %% [markdown]
# `sparseattn.models` has this layer (`EncoderLayer`, with dropout), the decoder layer (causal
# self-attention, cross attention into the encoder's output, feed-forward) and the whole model,
# `GraphTransformer`: embeddings scaled by $\sqrt{d}$, sinusoidal positions, the two stacks, a final
# LayerNorm each and the output projection. Its forward takes a `GraphBatch` and returns one row of
# logits per decoder token.
#
# ### Training on the copy task
#
# The task: read a random string of letters a-z (about 15 long) and write it out again. It is the
# tutorial's first experiment, and a good smoke test for a new model, since it only needs the cross
# attention to learn to look at the right source position. The data come from the training
# application's copy task (`sparseattn.train.tasks`), which generates them from a seed; the loop
# below is ours: Adam, label smoothing, gradient clipping, and a learning rate that warms up to the
# peak of the Noam schedule (DGL's and the paper's) and then decays linearly to zero at the last
# step. With Noam's own slow $1/\sqrt{\text{step}}$ decay our runs kept wobbling between 97% and
# 99.7% of validation sequences; letting the rate reach zero lets the last steps settle.

# %%
copy_sizes = (
    dict(num_train=400, num_valid=50, num_test=50, epochs=1, steps=13, budget_s=20)
    if SMALL
    else dict(num_train=9000, num_valid=300, num_test=300, epochs=12, steps=3000, budget_s=180)
)
cfg = make_config(
    {
        "task": "copy",
        "num_train": copy_sizes["num_train"],
        "num_valid": copy_sizes["num_valid"],
        "num_test": copy_sizes["num_test"],
        "batch_size": 32,
        "label_smoothing": 0.1,
    }
)
task = get_task("copy")
task.setup(cfg)  # generates the seeded train/valid/test splits
src_ids, tgt_ids = task.splits["train"]
print(
    f"{task.num_examples('train')} training pairs, {task.num_examples('valid')} validation and "
    f"{task.num_examples('test')} test pairs; vocabulary of {len(task.src_vocab)} (a-z, <unk>, <s>, </s>)"
)
print("example:", " ".join(task.src_vocab.decode(src_ids[0])), "->", " ".join(task.tgt_vocab.decode(tgt_ids[0])))

torch.manual_seed(0)
info = task.model_info()
model = GraphTransformer(
    info["src_vocab_size"], info["tgt_vocab_size"], num_layers=1, d_model=128, num_heads=1, d_ff=128, dropout=0.0
)
print(f"GraphTransformer: {sum(p.numel() for p in model.parameters()):,} parameters")


def noam(step, d_model=128, factor=2.0, warmup=200):
    step += 1
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


total_steps, warmup = copy_sizes["steps"], min(200, copy_sizes["steps"] // 5 + 1)


peak = noam(warmup - 1)  # Noam's largest learning rate, reached at the end of its warm-up


def warmup_then_linear(step):
    """Linear warm-up to Noam's peak over `warmup` steps, then linear decay to 0 at `total_steps`."""
    return peak * min((step + 1) / warmup, max(0.0, (total_steps - step) / (total_steps - warmup + 1)))


optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_linear)

# %% [markdown]
# The loop stops when greedy decoding gets every validation sequence right (checked every 250 steps),
# after `total_steps` steps, or when the budget of CPU time (3 minutes; on a shared machine wall time
# is longer) is spent, whichever comes first.

# %%
losses, valid_curve = [], []
t0, wall0 = time.process_time(), time.perf_counter()
model.train()
done = False
for epoch in range(copy_sizes["epochs"]):
    batches = task.batch_indices("train", cfg, epoch)  # sentences of similar length, shuffled
    for indices in tqdm(batches, desc=f"epoch {epoch + 1}", mininterval=10, ncols=80):
        batch = task.make_batch("train", indices)
        logits = model(batch).logits  # (N_dec, V): one row per target token
        loss = F.cross_entropy(logits, batch.tgt_out, label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        out_of_time = time.process_time() - t0 > copy_sizes["budget_s"]
        last = len(losses) == total_steps
        if len(losses) % 250 == 0 or out_of_time or last:
            acc = task.evaluate(model, "valid", cfg)["sequence_accuracy"]  # decodes; back in train mode after
            valid_curve.append((len(losses), acc))
            done = acc == 1.0 or out_of_time or last
        if done:
            break
    if done:
        break
if not valid_curve or valid_curve[-1][0] != len(losses):  # the last step was not checked yet
    valid_curve.append((len(losses), task.evaluate(model, "valid", cfg)["sequence_accuracy"]))
train_seconds = time.process_time() - t0
print(
    f"{len(losses)} steps in {train_seconds:.0f} s of CPU time ({time.perf_counter() - wall0:.0f} s of wall "
    f"time), {1e3 * train_seconds / len(losses):.0f} ms per step, validation included"
)
print("validation sequences decoded exactly: " + ", ".join(f"{100 * a:.1f}% at step {s}" for s, a in valid_curve))

# %%
metrics = task.evaluate(model, "test", cfg)  # greedy decoding of every test sequence
print(
    f"test: {100 * metrics['sequence_accuracy']:.1f}% of sequences decoded exactly, "
    f"{100 * metrics['token_accuracy']:.2f}% of tokens"
)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(losses, lw=0.6, alpha=0.5, label="per batch")
ax.plot(np.convolve(losses, np.ones(25) / 25, mode="valid"), label="moving average (25)")
V, eps = info["tgt_vocab_size"], 0.1
p_true, p_other = 1 - eps + eps / V, eps / V  # the smoothed target distribution
ax.axhline(-p_true * np.log(p_true) - (V - 1) * p_other * np.log(p_other), color="gray", lw=0.8)
ax.set_xlabel("step")
ax.set_ylabel("cross entropy (label smoothing 0.1)")
ax.set_title(f"copy task, {train_seconds:.0f} s of CPU time on 1 thread")
ax.legend(loc="upper left")
ax2 = ax.twinx()
ax2.plot(*zip(*valid_curve), "o-", color="tab:green", label="validation: decoded exactly")
ax2.set_ylim(0, 1.02)
ax2.set_ylabel("sequences decoded exactly")
ax2.legend(loc="upper right")
plt.show()

# %% [markdown]
# With label smoothing the loss cannot reach 0: its floor is the entropy of the smoothed target (the
# gray line); what matters is the decoded accuracy. Decoding is greedy: `sparseattn.models.decode`
# feeds one token per sentence and
# step, and each decoder layer reads the keys and values of the earlier steps from a `KVCache`
# instead of recomputing them.

# %%
test_src, test_tgt = task.splits["test"]
model.eval()
for s, t, p in zip(test_src[:3], test_tgt[:3], decode(model, test_src[:3], bos=task.bos, eos=task.eos)):
    print("".join(task.src_vocab.decode(s[:-1])), "->", "".join(task.tgt_vocab.decode(p)), "" if p == t else "(wrong)")

# %% [markdown]
# ## 5. What the heads look at
#
# `record_attention(model)` collects the normalised weights of every `EdgeAttention` call in a model,
# one `(E, H)` tensor per call in that call's edge order, without changing the model. We run one test
# pair and put each edge's weight back into an adjacency matrix.

# %%
sample = pool.batch([test_src[0]], [test_tgt[0]], bos=task.bos, eos=task.eos)
with torch.no_grad(), record_attention(model) as records:
    model(sample)
src_tokens = task.src_vocab.decode(test_src[0])
dec_tokens = ["<s>"] + task.tgt_vocab.decode(test_tgt[0])
for r in records:
    print(f"{r.name:22s} call {r.call}: {r.graph.num_edges} edges, weights {tuple(r.weights.shape)}")


def attention_maps(record):
    """(H, N_dst, N_src) weights of one recorded call (one sentence pair, so node ids are positions)."""
    g, w = record.graph, record.weights
    maps = torch.zeros(w.shape[1], g.num_dst, g.num_src)
    maps[:, g.dst, g.src] = w.T
    return maps.numpy()


panels = [
    ("encoder self-attention", "encoder.0.self_attn", src_tokens, src_tokens),
    ("decoder self-attention", "decoder.0.self_attn", dec_tokens, dec_tokens),
    ("cross attention", "decoder.0.cross_attn", src_tokens, dec_tokens),
]
heads = model.num_heads
fig, axes = plt.subplots(heads, 3, figsize=(13, 4.4 * heads), squeeze=False)  # one row per head
for col, (title, name, cols, rows_) in enumerate(panels):
    maps = attention_maps(next(r for r in records if r.name == name))
    for h in range(heads):
        ax = axes[h, col]
        ax.imshow(maps[h], cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(cols)), cols, fontsize=7)
        ax.set_yticks(range(len(rows_)), rows_, fontsize=7)
        ax.set_xlabel("source")
        ax.set_title(f"{title}, head {h}", fontsize=10)
axes[0, 0].set_ylabel("destination")
plt.tight_layout()
plt.show()

# %% [markdown]
# Rows are destinations (the token that attends) and columns sources. In the cross attention of a
# trained copy model the decoder token that is about to write letter $i$ puts its weight on source
# position $i$, a diagonal; the decoder's own self-attention is lower-triangular, because its graph
# has no edges from the future.
#
# ## 6. The Universal Transformer and Adaptive Computation Time
#
# The Universal Transformer applies **one** shared layer again and again instead of a stack of
# different layers. With Adaptive Computation Time (ACT) each token decides how many times: after
# every step a small halting unit outputs a probability $p_t$ per token, the token accumulates them,
# and it stops once the sum passes a threshold (0.99) or after `max_steps`. Its output is the average
# of its states weighted by those probabilities (the last step gets the remainder, so the weights sum
# to one), and a small penalty on the remainders pushes tokens to stop early.
#
# In graph terms, a halted token leaves the set of destinations: at the next step only the edges
# *into* active tokens are computed. Halted tokens still serve as sources, with their last keys and
# values. `Graph.dst_subgraph(mask)` keeps the edges into the active nodes:

# %%
g = graphs.complete(6)
active = torch.tensor([True, False, True, True, False, False])
sub = g.dst_subgraph(active)
fig, axes = plt.subplots(1, 2, figsize=(7, 3.5))
for ax, (title, gg) in zip(
    axes, [(f"complete(6): {g.num_edges} edges", g), (f"dst_subgraph(active): {sub.num_edges} edges", sub)]
):
    ax.imshow(adjacency(gg, 6, 6), cmap="Blues", vmin=0, vmax=1.3)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("source")
axes[0].set_ylabel("destination")
axes[1].set_yticks(range(6), [f"{i} {'active' if a else 'halted'}" for i, a in enumerate(active.tolist())])
plt.tight_layout()
plt.show()

# %% [markdown]
# `EdgeAttention` does this for you with `dst_rows=` (the ids of the active destinations) and a
# `NodeKV` store: each call writes the active rows' new keys and values into the store, and attention
# reads every row of it, so halted nodes keep what they had. The result for the active rows equals
# the full computation with the halted rows' inputs frozen:

# %%
attn = EdgeAttention(16, 2)
x = torch.randn(6, 16)
store = NodeKV()
attn(x, g, cache=store)  # step 1: every node active, fills the store
x2 = x + torch.randn(6, 16)  # step 2: new states ...
rows = active.nonzero().squeeze(1)
y_rows = attn(x2[rows], g, cache=store, dst_rows=rows)  # ... but only the active rows are updated
x_frozen = torch.where(active[:, None], x2, x)  # the same thing, computed in full
print(
    "active rows:",
    rows.tolist(),
    " max |difference| to the full computation:",
    (y_rows - attn(x_frozen, g)[rows]).abs().max().item(),
)

# %% [markdown]
# `sparseattn.models.UniversalTransformer` is built from the same `EncoderLayer`/`DecoderLayer`, with
# a time-step encoding added at every step. We train it briefly on the **sort** task (write the
# letters of the input in alphabetical order), a task where more thinking should help some positions.
# The run is short, so the model is far from converged (the training application reaches 99.8% of
# tokens after 26 minutes); we look at how many steps each position takes.

# %%
sort_cfg = make_config(
    {
        "task": "sort",
        "model": "ut",
        "num_train": 200 if SMALL else 4000,
        "num_valid": 10,
        "num_test": 50,
        "batch_size": 32,
    }
)
sort_task = get_task("sort")
sort_task.setup(sort_cfg)
torch.manual_seed(0)
info = sort_task.model_info()
ut = UniversalTransformer(
    info["src_vocab_size"], info["tgt_vocab_size"], d_model=64, num_heads=4, d_ff=128, dropout=0.0, max_steps=8
)
ut_opt = torch.optim.Adam(ut.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
ut_sched = torch.optim.lr_scheduler.LambdaLR(ut_opt, lambda s: noam(s, d_model=64, factor=1.0, warmup=200))
ut_losses, ut_steps = [], []
budget_s, t0 = (10 if SMALL else 75), time.process_time()
ut.train()
with tqdm(
    total=budget_s,
    desc="UT on sort (CPU seconds)",
    mininterval=5,
    ncols=80,
    bar_format="{l_bar}{bar}| {n:.0f}/{total} s",
) as bar:
    while time.process_time() - t0 < budget_s:
        for indices in sort_task.batch_indices("train", sort_cfg, len(ut_losses)):
            b = sort_task.make_batch("train", indices)
            out = ut(b)
            loss = F.cross_entropy(out.logits, b.tgt_out, label_smoothing=0.1) + out.aux_loss  # + ACT penalty
            ut_opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ut.parameters(), 1.0)
            ut_opt.step()
            ut_sched.step()
            ut_losses.append(loss.item())
            ut_steps.append(torch.cat([out.stats["act_steps_enc"], out.stats["act_steps_dec"]]).float().mean().item())
            bar.update(min(budget_s, time.process_time() - t0) - bar.n)
            if time.process_time() - t0 >= budget_s:
                break
ut_metrics = sort_task.evaluate(ut, "test", sort_cfg, decode=False)  # teacher-forced
print(
    f"{len(ut_losses)} steps; teacher-forced test token accuracy {100 * ut_metrics['tf_accuracy']:.1f}%, "
    f"mean ACT steps per token {ut_metrics['act_steps_mean']:.2f}"
)

# %%
ut.eval()
test_batch = sort_task.make_batch("test", list(range(12)))
with torch.no_grad():
    stats = ut(test_batch).stats
fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), gridspec_kw={"width_ratios": [1, 1, 0.8]})
for ax, key, lens, title in [
    (axes[0], "act_steps_enc", test_batch.src_lens, "encoder"),
    (axes[1], "act_steps_dec", test_batch.tgt_lens, "decoder"),
]:
    per_sentence = torch.split(stats[key], list(lens))
    grid = np.full((len(lens), max(lens)), np.nan)
    for i, s in enumerate(per_sentence):
        grid[i, : len(s)] = s.numpy()
    im = ax.imshow(grid, cmap="magma", vmin=1, vmax=ut.max_steps, aspect="auto")
    ax.set_title(f"ACT steps per position: {title}")
    ax.set_xlabel("position")
    ax.set_ylabel("test sentence")
fig.colorbar(im, ax=axes[:2], shrink=0.8, label="steps")
axes[2].plot(ut_steps, lw=0.8)
axes[2].set_xlabel("training step")
axes[2].set_ylabel("mean ACT steps per token")
axes[2].set_title("pondering during training")
plt.show()

# %% [markdown]
# ## 7. Beyond the tutorial
#
# ### Local attention on long sequences
#
# With a graph, attention that looks only at nearby tokens is nothing special: `graphs.window(L, r)`
# connects each token to the ones at most `r` positions away, so the cost grows like $L \cdot r$
# instead of $L^2$. A dense implementation has to build the $L \times L$ scores (and a mask) and
# throw most of them away. We time forward + backward of both as the length grows (4 heads of 32,
# radius 16; the dense side is `F.scaled_dot_product_attention` with a boolean mask, stopped at a
# length where it would need gigabytes). Same caveat as above: a shared machine, noisy timings.

# %%
H, D, radius = 4, 32, 16
lengths = [256, 512, 1024] if SMALL else [512, 1024, 2048, 4096, 8192, 16384]
dense_max = 1024 if SMALL else 4096
rows = []
for L in lengths:
    g = graphs.window(L, radius)
    q, k, v = (torch.randn(L, H, D, requires_grad=True) for _ in range(3))
    sparse_fn = functools.partial(edge_attention, clamp=None)  # exact softmax, as the dense side
    sparse_args = (q, k, v, g)
    reps = 2 if SMALL else 3
    row = {
        "L": L,
        "sparse_ms": fwd_bwd_ms(sparse_fn, *sparse_args, reps=reps),
        "sparse_mib": peak_extra_mib(sparse_fn, *sparse_args),
    }
    if L <= dense_max:
        mask = torch.zeros(L, L, dtype=torch.bool)
        mask[g.dst, g.src] = True  # (L_dst, L_src)
        qd, kd, vd = (t.detach().transpose(0, 1).requires_grad_() for t in (q, k, v))  # (H, L, D)
        dense_fn, dense_args = F.scaled_dot_product_attention, (qd, kd, vd, mask)
        err = (dense_fn(*dense_args).transpose(0, 1) - sparse_fn(*sparse_args)).abs().max().item()
        row.update(
            dense_ms=fwd_bwd_ms(dense_fn, *dense_args, reps=reps),
            dense_mib=peak_extra_mib(dense_fn, *dense_args),
            err=err,
        )
    rows.append(row)
    print(
        f"L={L:6d} E={g.num_edges:7d}  window: {row['sparse_ms']:7.1f} ms {row['sparse_mib'] or 0:6.0f} MiB"
        + (
            f"   dense masked: {row['dense_ms']:7.1f} ms {row['dense_mib'] or 0:6.0f} MiB  max err {row['err']:.1e}"
            if "dense_ms" in row
            else "   dense masked: skipped"
        )
    )

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, key, label in [(axes[0], "ms", "forward + backward, ms"), (axes[1], "mib", "peak extra memory, MiB")]:
    for who, style in [("sparse", "o-"), ("dense", "s--")]:
        pts = [(r["L"], r[f"{who}_{key}"]) for r in rows if r.get(f"{who}_{key}") is not None]
        if pts:
            ax.plot(
                *zip(*pts), style, label="window graph (edge_attention)" if who == "sparse" else "dense masked SDPA"
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend()
fig.suptitle(f"local attention, radius {radius}, H={H}, D={D}, CPU time on 1 thread (shared machine: noisy)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Your own graph in your own model
#
# Nothing above is specific to sentences. Any `(2, E)` tensor of (source, destination) pairs is a
# graph. Here is a point cloud where each point attends to its 8 nearest neighbours, with the distance
# as an additive per-edge score (`edge_bias=`), inside a model we write ourselves. The toy target,
# the average of a signal over each point's neighbourhood, is something attention along the kNN edges
# can learn.


# %%
class PointAttentionNet(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.embed = torch.nn.Linear(3, d)  # (x, y, signal) -> d
        self.attn = EdgeAttention(d, heads)
        self.dist_scale = torch.nn.Parameter(torch.ones(heads))  # per-head penalty on distance
        self.norm = torch.nn.LayerNorm(d)
        self.out = torch.nn.Linear(d, 1)

    def forward(self, pos, signal, edges):
        h = self.embed(torch.cat([pos, signal[:, None]], dim=1))
        dist = (pos[edges[0]] - pos[edges[1]]).norm(dim=1)  # (E,)
        bias = -dist[:, None] * self.dist_scale  # (E, H) additive scores
        h = h + self.attn(self.norm(h), edges, edge_bias=bias)
        return self.out(h).squeeze(1)


def knn_edges(pos, k):
    """Edges from each point's k nearest neighbours (itself included) into it, (2, N*k)."""
    nbrs = torch.cdist(pos, pos).topk(k, largest=False).indices  # (N, k)
    return torch.stack([nbrs.reshape(-1), torch.arange(pos.shape[0]).repeat_interleave(k)])


torch.manual_seed(0)
net = PointAttentionNet()
opt = torch.optim.Adam(net.parameters(), lr=3e-3)
point_losses = []
for _ in range(60 if SMALL else 400):
    pos, signal = torch.rand(200, 2), torch.randn(200)
    edges = knn_edges(pos, 8)
    target = torch.zeros(200).index_add_(0, edges[1], signal[edges[0]]) / 8  # neighbourhood mean
    loss = F.mse_loss(net(pos, signal, edges), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    point_losses.append(loss.item())
print(
    f"mean squared error: {np.mean(point_losses[:10]):.3f} (first 10 steps) -> "
    f"{np.mean(point_losses[-10:]):.3f} (last 10); predicting 0 gives {target.var().item():.3f}"
)

fig, axes = plt.subplots(1, 2, figsize=(10, 4))
axes[0].plot(point_losses)
axes[0].set_yscale("log")
axes[0].set_xlabel("step")
axes[0].set_ylabel("MSE")
axes[0].set_title("training on random point clouds")
with torch.no_grad():
    _, w = net.attn(
        net.norm(net.embed(torch.cat([pos, signal[:, None]], 1))),
        edges,
        edge_bias=-(pos[edges[0]] - pos[edges[1]]).norm(dim=1)[:, None] * net.dist_scale,
        return_weights=True,
    )
i = 0
mine = edges[1] == i
axes[1].scatter(pos[:, 0], pos[:, 1], s=8, c="lightgray")
axes[1].scatter(
    pos[edges[0, mine], 0],
    pos[edges[0, mine], 1],
    s=400 * w[mine].mean(1),
    c="tab:blue",
    label="neighbours, size = mean weight",
)
axes[1].scatter(pos[i, 0], pos[i, 1], marker="*", s=150, c="tab:red", label=f"point {i}")
axes[1].set_title("where point 0 looks")
axes[1].legend(fontsize=8, loc="lower right")
plt.tight_layout()
plt.show()

# %% [markdown]
# That is the whole interface: build the edges however your problem defines them, pass them with the
# node features, and `EdgeAttention` (or `edge_attention` on your own q, k, v) computes attention
# along them with the fastest backend available. Wrap the edge tensor in `sparseattn.Graph` once if
# you call attention on it repeatedly; it validates and caches the sorted structure the fast kernels
# need. The README lists the rest of the API: the backends, cached decoding, beam search and the
# training application (`sparseattn train`).
