"""Training-step tokens/s per attention backend on the same multi30k batches.

    python -m benchmarks.bench_train --data-dir ../shared/data/multi30k --run runs/m30k \
        --backends reference auto --steps 5 --threads 1

Builds the ("multi30k", "transformer") preset model (same init for every backend), takes the
first `--batches` token-budget training batches of epoch 0 and times forward + backward + Adam
steps over them, interleaving backends per round so machine load hits them alike. Reports the
median over rounds of predicted (target) tokens per second. `--run` reuses that run's tokenizer.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


def main() -> None:
    from sparseattn.config import make_config
    from sparseattn.data.tasks import get_task
    from sparseattn.models import build_model

    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", required=True)
    p.add_argument("--run", required=True, help="run dir holding (or receiving) tokenizer.json")
    p.add_argument("--backends", nargs="+", default=["reference", "auto"])
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=4096)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = make_config({"task": "multi30k", "data_dir": args.data_dir, "out": args.run, "max_tokens": args.max_tokens,
                       "dropout": 0.0})
    task = get_task("multi30k")
    task.setup(cfg)
    batches = [task.make_batch("train", idx) for idx in task.batch_indices("train", cfg, 0)[:args.batches]]
    tokens = sum(b.num_tokens for b in batches)
    models = {}
    for name in args.backends:
        torch.manual_seed(0)
        model, _ = build_model("transformer", make_config({**cfg.to_dict(), "backend": name}), task)
        models[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-4))
    times = {name: [] for name in args.backends}
    for _ in range(args.rounds):
        for name, (model, opt) in models.items():
            start = time.perf_counter()
            for batch in batches:
                opt.zero_grad(set_to_none=True)
                loss, _ = task.loss(model, batch, cfg)
                loss.backward()
                opt.step()
            times[name].append(time.perf_counter() - start)
    result = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "batches": args.batches, "target_tokens": tokens,
              "tokens_per_s": {n: round(tokens / statistics.median(t), 1) for n, t in times.items()},
              "seconds": {n: [round(x, 2) for x in t] for n, t in times.items()}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
