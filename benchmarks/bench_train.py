"""Training-step throughput: the graph Transformer (`auto` backend) vs a padded torch.nn.Transformer.

    python -m benchmarks.bench_train --data-dir ../shared/data/multi30k            # multi30k + copy, 1 and 2 threads
    python -m benchmarks.bench_train --data-dir ../shared/data/multi30k --tasks copy --rounds 3 --threads 1
    python -m benchmarks.bench_train --data-dir ../shared/data/multi30k --tasks multi30k --backends reference auto
    python -m benchmarks.bench_train --data-dir ../shared/data/multi30k --device cuda --threads 16  # bf16 autocast
    python -m benchmarks.bench_train --data-dir ../shared/data/multi30k --tasks multi30k --compile  # + compiled layers

What is measured and how: docs/benchmarks/train.md (benchmarks/templates/train.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence

from sparseattn.models import sinusoid

from .harness import Output, machine_info, nest, parser, peak_extra_mib, profile_lines, profile_top, write_bars

SDPA_OPS = ("flash_attention", "efficient_attention", "cudnn_attention", "attention_math", "_fused_sdp")


class PaddedTransformer(nn.Module):
    """torch.nn.Transformer with the graph model's embeddings and generator, on padded batches."""

    def __init__(self, vocab_src: int, vocab_tgt: int, m, share_embeddings: bool, max_len: int = 1024) -> None:
        """m: the graph model's config (layers, d_model, heads, d_ff, tie_generator)."""
        super().__init__()
        layers, d_model, heads, d_ff = m.num_layers, m.d_model, m.num_heads, m.d_ff
        self.src_embed = nn.Embedding(vocab_src, d_model)
        self.tgt_embed = self.src_embed if share_embeddings else nn.Embedding(vocab_tgt, d_model)
        self.scale = math.sqrt(d_model)
        self.register_buffer("pos", sinusoid(torch.arange(max_len), d_model), persistent=False)
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")  # norm_first: not used anyway
        settings = dict(dropout=0.0, batch_first=True, norm_first=True)
        self.transformer = nn.Transformer(d_model, heads, layers, layers, d_ff, **settings)
        self.generator = nn.Linear(d_model, vocab_tgt)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if m.tie_generator:
            self.generator.weight = self.tgt_embed.weight

    def forward(self, pb: Dict[str, Tensor]) -> Tensor:
        src = self.src_embed(pb["src"]) * self.scale + self.pos[: pb["src"].shape[1]]
        tgt = self.tgt_embed(pb["tgt_in"]) * self.scale + self.pos[: pb["tgt_in"].shape[1]]
        masks = dict(src_key_padding_mask=pb["src_pad"], tgt_key_padding_mask=pb["tgt_pad"], tgt_is_causal=True)
        h = self.transformer(src, tgt, tgt_mask=pb["causal"], memory_key_padding_mask=pb["src_pad"], **masks)
        return self.generator(h[pb["tgt_valid"]])  # (N_dec, V): real target tokens only, in sentence order


def padded_batch(batch, device: str = "cpu") -> Dict[str, Any]:
    """A GraphBatch's sentences as (B, L) tensors (pad id 0) with key-padding and causal masks, on device."""
    batch = batch.to("cpu")
    src = pad_sequence(list(batch.src.split(list(batch.src_lens))), batch_first=True)
    tgt_in = pad_sequence(list(batch.tgt_in.split(list(batch.tgt_lens))), batch_first=True)
    src_valid = torch.arange(src.shape[1])[None] < torch.tensor(batch.src_lens)[:, None]
    tgt_valid = torch.arange(tgt_in.shape[1])[None] < torch.tensor(batch.tgt_lens)[:, None]
    causal = torch.ones(tgt_in.shape[1], tgt_in.shape[1], dtype=torch.bool).triu(1)  # True: not attended
    tensors = dict(src=src, tgt_in=tgt_in, src_pad=~src_valid, tgt_pad=~tgt_valid, tgt_valid=tgt_valid, causal=causal)
    padding = 1 - (batch.src.numel() + batch.tgt_in.numel()) / (src.numel() + tgt_in.numel())
    return {**{k: v.to(device) for k, v in tensors.items()}, "padding": padding}


def setup_task(name: str, args) -> Tuple[Any, Any, List[Any]]:
    from sparseattn.train.config import make_config
    from sparseattn.train.tasks import get_task

    flags: Dict[str, Any] = {"task": name, "out": args.run, "dropout": 0.0}
    if name == "multi30k":
        flags["data_dir"] = args.data_dir
    cfg = make_config(flags)
    task = get_task(name)
    task.setup(cfg)
    n = args.batches if name == "multi30k" else args.copy_batches
    batches = [task.make_batch("train", idx).to(args.device) for idx in task.batch_indices("train", cfg, 0)[:n]]
    return cfg, task, batches


def build_models(cfg, task, backends: List[str], device: str = "cpu", compiled: bool = False) -> Dict[str, nn.Module]:
    """{"graph <backend>": the preset model, [its "(compiled)" twin: every layer torch.compile'd, fullgraph,
    dynamic shapes,] ..., "nn.Transformer": its padded peer}, each from seed 0, on device."""
    m = cfg.model_cfg
    info = task.model_info()
    models: Dict[str, nn.Module] = {}
    for b in backends:
        torch.manual_seed(0)
        models[f"graph {b}"] = dataclasses.replace(m, backend=b).build(info)
        if compiled:
            torch.manual_seed(0)
            model = dataclasses.replace(m, backend=b).build(info)
            for layer in [*model.encoder, *model.decoder]:
                layer.compile(fullgraph=True, dynamic=True)
            models[f"graph {b} (compiled)"] = model
    torch.manual_seed(0)
    share = bool(m.share_embeddings and info.get("shared_vocab", False))
    models["nn.Transformer"] = PaddedTransformer(info["src_vocab_size"], info["tgt_vocab_size"], m, share)
    return {n: mod.to(device) for n, mod in models.items()}


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_step(
    name: str, model: nn.Module, batches: List[Any], smoothing: float, device: str = "cpu"
) -> Callable[[int], None]:
    """step(i): one training step on batch i (forward, loss, backward, Adam); on CUDA under bf16 autocast, synced."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs = [padded_batch(b, device) for b in batches] if name == "nn.Transformer" else batches
    cuda = device.startswith("cuda")

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = model(inputs[i]) if name == "nn.Transformer" else model(inputs[i]).logits
            target = batches[i].tgt_out
            loss = F.cross_entropy(logits.float(), target, label_smoothing=smoothing, reduction="sum") / target.numel()
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    step.inputs = inputs  # type: ignore[attr-defined]
    return step


def check_same_function(models: Dict[str, nn.Module], batches: List[Any], padded_inputs: List[Any]) -> float:
    """Max |log-probability difference| on the first batch with the graph model's weights loaded into the
    nn.Transformer (EdgeAttention has nn.MultiheadAttention's layout): exact softmax, no dropout, same function."""
    graph, padded = next(iter(models.values())), models["nn.Transformer"]
    t = padded.transformer
    pairs = [(padded.src_embed, graph.src_embed.lut), (padded.tgt_embed, graph.tgt_embed.lut)]
    pairs += [(padded.generator, graph.generator), (t.encoder.norm, graph.enc_norm), (t.decoder.norm, graph.dec_norm)]
    for mine, theirs in [*zip(t.encoder.layers, graph.encoder), *zip(t.decoder.layers, graph.decoder)]:
        pairs += [(mine.self_attn, theirs.self_attn), (mine.linear1, theirs.ff.w1), (mine.linear2, theirs.ff.w2)]
        pairs += [(mine.norm1, theirs.norm1), (mine.norm2, theirs.norm2)]
        if hasattr(mine, "multihead_attn"):  # a decoder layer
            pairs += [(mine.multihead_attn, theirs.cross_attn), (mine.norm3, theirs.norm3)]
    with torch.no_grad():
        for a, b in pairs:
            a.load_state_dict(b.state_dict())
        lp_graph = F.log_softmax(graph(batches[0]).logits, -1)
        lp_padded = F.log_softmax(padded(padded_inputs[0]), -1)
    return (lp_graph - lp_padded).abs().max().item()


def run_task(name: str, args, log: Callable[[str], None]) -> List[dict]:
    cfg, task, batches = setup_task(name, args)
    models = build_models(cfg, task, args.backends, args.device, args.compile)
    graphs = [n for n in models if n != "nn.Transformer"]
    m = cfg.model_cfg
    smoothing = cfg.run.label_smoothing
    steps = {n: make_step(n, mod, batches, smoothing, args.device) for n, mod in models.items()}
    tokens = sum(b.num_tokens for b in batches)
    pads = [p["padding"] for p in steps["nn.Transformer"].inputs]  # type: ignore[attr-defined]
    desc = (
        f"{name}: {len(batches)} batches, {sum(b.num_sentences for b in batches)} sentences, {tokens} target "
        f"tokens; model {m.num_layers}+{m.num_layers} layers, d {m.d_model}, {m.num_heads} heads, d_ff {m.d_ff}, "
        f"clamp {m.clamp}, dropout 0; params graph {params(models[graphs[0]]):,} / nn.Transformer "
        f"{params(models['nn.Transformer']):,}; nn.Transformer padding {statistics.mean(pads):.1%} of its "
        f"token slots"
    )
    log("\n" + desc)
    check = None
    if m.clamp is None:  # exact softmax: the two compute the same function given the same weights
        check = check_same_function(models, batches, steps["nn.Transformer"].inputs)  # type: ignore[attr-defined]
        log(f"  nn.Transformer given the graph model's weights: max |log-prob difference| {check:.2e}")
        models = build_models(cfg, task, args.backends, args.device, args.compile)  # back to each one's own init
        steps = {n: make_step(n, mod, batches, smoothing, args.device) for n, mod in models.items()}
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for s in steps.values():  # warm-up round (Adam state, allocator, graph caches)
            for i in range(len(batches)):
                s(i)
        times: Dict[str, List[float]] = {n: [] for n in steps}
        for r in range(args.rounds):  # contenders interleaved per batch, alternating who goes first
            spent = {n: 0.0 for n in steps}
            for i in range(len(batches)):
                for n in list(steps) if (r + i) % 2 == 0 else list(reversed(steps)):
                    t0 = time.perf_counter()
                    steps[n](i)
                    spent[n] += time.perf_counter() - t0
            for n in steps:
                times[n].append(spent[n])
        load = os.getloadavg()[0]
        biggest = max(range(len(batches)), key=lambda i: batches[i].num_tokens)
        cuda = args.device.startswith("cuda")
        for n, s in steps.items():
            med = statistics.median(times[n])
            mem = peak_extra_mib(lambda s=s, i=biggest: s(i), args.device)
            # one training step on each batch, ranked by self CPU time (self CUDA time on a GPU)
            tops, names, busy = profile_top(lambda s=s: [s(i) for i in range(len(batches))], 1, args.profile_rows, cuda)
            sdpa = sorted({k for k in names if "scaled_dot_product" in k or any(op in k for op in SDPA_OPS)})
            busy_line = f"\n    GPU busy (all kernels) {busy:.1f} ms over the {len(batches)} steps" * cuda
            row = dict(task=name, threads=threads, contender=n, tokens_per_s=tokens / med, seconds_median=med)
            row.update(seconds=[round(x, 4) for x in times[n]], peak_extra_mib=mem, sdpa_kernels=sdpa, top_ops=tops)
            row.update(load_average=load, target_tokens=tokens, batches=len(batches), same_function_max_err=check)
            rows.append(dict(row, padding=statistics.mean(pads) if n == "nn.Transformer" else 0.0))
            log(
                f"  {threads}t {n:15s} {tokens / med:9.0f} target tok/s  (median {med * 1e3:.0f} ms of "
                f"{args.rounds} rounds: {', '.join(f'{x * 1e3:.0f}' for x in times[n])})  peak +{mem or 0:.0f} MiB  "
                f"SDPA: {', '.join(sdpa) or 'none'}  load {load:.1f}"
            )
            log(f"    top operators by self {'CUDA' if cuda else 'CPU'} time, one step per batch ({threads} threads):")
            log(profile_lines(tops) + busy_line)
        here = {r["contender"]: r for r in rows if (r["task"], r["threads"]) == (name, threads)}
        for gname in graphs:  # the ratios the page shows at the end
            g = here[gname]
            g["ratio_vs_nn_transformer"] = g["tokens_per_s"] / here["nn.Transformer"]["tokens_per_s"]
            g["ratio_per_round"] = sorted(b / a for a, b in zip(times[gname], times["nn.Transformer"]))
            g["ratio_median_of_rounds"] = statistics.median(g["ratio_per_round"])
            eager = gname.removesuffix(" (compiled)")
            if eager != gname:  # compiled vs the same model eager, per round
                g["compiled_speedup_per_round"] = sorted(e / c for e, c in zip(times[eager], times[gname]))
    return rows


def main(argv=None) -> None:
    ap = parser(__doc__, nargs="+", type=int, default=[1, 2])
    ap.add_argument("--data-dir", default="", help="Multi30k-format folder (train/val/test_2016_flickr.{en,de})")
    ap.add_argument("--run", default="", help="folder holding (or receiving) the BPE tokenizer.json (default: temp)")
    ap.add_argument("--backends", nargs="+", default=["auto"], help="edge-attention backends of the graph model")
    ap.add_argument("--tasks", nargs="+", default=["multi30k", "copy"], choices=["multi30k", "copy"])
    ap.add_argument("--batches", type=int, default=2, help="multi30k token-budget batches per round")
    ap.add_argument("--copy-batches", type=int, default=16, help="copy batches (16 sequences each) per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast, as sparseattn train runs there)")
    ap.add_argument("--profile-rows", type=int, default=12)
    ap.add_argument("--compile", action="store_true", help="also time each graph model with its layers torch.compile'd")
    args = ap.parse_args(argv)
    if not args.data_dir and "multi30k" in args.tasks:
        ap.error("--data-dir is required for the multi30k task")
    args.run = args.run or tempfile.mkdtemp(prefix="bench_train_")
    info = dict(machine_info(args.device), threads="-".join(map(str, args.threads)))
    out = Output("benchmarks.bench_train", argv, args.out, info, args.tag)  # versions are in the JSON
    out.header += f" | {out.provenance['command']}"
    config = {**vars(args), "data_dir": os.path.basename(os.path.normpath(args.data_dir)), "run": "RUN", "out": "OUT"}
    rows: List[dict] = []
    for name in args.tasks:
        rows += run_task(name, args, out.log)
        out.save(dict(config, header=out.header), rows)
    panels = nest(rows, "task", "threads", "contender", "tokens_per_s")
    write_bars(out.png, out.header, panels, "target tokens / s at 1, 2, ... threads (median; fwd + bwd + Adam)")
    out.close()


if __name__ == "__main__":
    main()
