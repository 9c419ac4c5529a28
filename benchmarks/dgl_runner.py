"""DGL side of bench_dgl.py, run with the DGL environment's Python (DGL 2.1 needs torch 2.2):
`DGL_VENV/bin/python benchmarks/dgl_runner.py [threads]`. Imports only dgl, torch, numpy and
benchmarks/harness.py (never sparseattn), and times and measures a call as the harness does. One JSON
command per stdin line, one JSON reply per stdout line, so the caller interleaves its timings with these:
hello (versions), load {family, path: an .npz of the graph, q, k, v, reference} (each recipe's max |err|),
time {contender, mode, reps, warmup} (ms per call), mem {contender, mode} (peak extra MiB), quit.
Recipes (`fused`, `builtin`): docs/benchmarks/dgl.md.
"""

from __future__ import annotations

import json
import sys

import harness  # benchmarks/harness.py, beside this script: torch and the standard library only
import numpy as np
import torch

STATE: dict = {}


def _graph(src, dst, n_src, n_dst):
    import dgl

    src, dst = torch.from_numpy(src), torch.from_numpy(dst)
    if n_src == n_dst:
        return dgl.graph((src, dst), num_nodes=n_src)
    return dgl.heterograph({("s", "e", "d"): (src, dst)}, num_nodes_dict={"s": n_src, "d": n_dst})


def fused(g, q, k, v):
    import dgl

    score = dgl.ops.u_dot_v(g, k, q) * (q.shape[-1] ** -0.5)  # (E, H, 1)
    a = dgl.ops.edge_softmax(g, score)
    return dgl.ops.u_mul_e_sum(g, v, a)  # (N_dst, H, D)


def builtin(g, q, k, v, clamp=(-5.0, 5.0)):
    import dgl.function as fn

    with g.local_scope():
        g.srcdata["k"], g.srcdata["v"], g.dstdata["q"] = k, v, q
        g.apply_edges(fn.u_dot_v("k", "q", "score"))
        g.edata["a"] = torch.exp((g.edata["score"] * (q.shape[-1] ** -0.5)).clamp(*clamp))
        g.update_all(fn.u_mul_e("v", "a", "m"), fn.sum("m", "wv"))
        g.update_all(fn.copy_e("a", "m"), fn.sum("m", "z"))
        return g.dstdata["wv"] / g.dstdata["z"]


RECIPES = {"dgl fused": fused, "dgl builtin": builtin}


def _call(contender: str, mode: str):
    g, leaves = STATE["g"], STATE["leaves"]
    return harness.timed_pass(lambda: RECIPES[contender](g, *leaves), mode, leaves, STATE["gout"])


def handle(msg: dict) -> dict:
    cmd = msg["cmd"]
    if cmd == "hello":
        import dgl

        return dict(dgl=dgl.__version__, torch=torch.__version__, numpy=np.__version__, threads=torch.get_num_threads())
    if cmd == "load":
        data = np.load(msg["path"])
        g = _graph(data["src"], data["dst"], int(data["num_src"]), int(data["num_dst"]))
        q, k, v, ref, gout = (torch.from_numpy(data[n]) for n in ("q", "k", "v", "ref", "gout"))
        STATE.update(g=g, leaves=[x.clone().requires_grad_(True) for x in (q, k, v)], gout=gout)
        with torch.no_grad():
            errs = {name: (f(g, q, k, v) - ref).abs().max().item() for name, f in RECIPES.items()}
        return {"family": msg["family"], "edges": g.num_edges(), "max_err": errs}
    call = _call(msg.get("contender"), msg.get("mode"))
    if cmd == "time":  # timed and measured as the harness does for sparseattn, under the same malloc settings
        return {"times_ms": harness.time_ms(call, "cpu", msg.get("warmup", 0), msg["reps"], budget_s=float("inf"))}
    if cmd == "mem":
        return {"peak_extra_mib": harness.peak_extra_mib(call)}
    raise ValueError(f"unknown command {cmd!r}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].isdigit():
        torch.set_num_threads(int(sys.argv[1]))
    replies, sys.stdout = sys.stdout, sys.stderr  # whatever a library prints goes to stderr, not the replies
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        try:
            reply = handle(msg)
        except Exception as exc:  # reported, not fatal: the caller records a null with the reason
            reply = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
