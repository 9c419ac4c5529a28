"""bfloat16 with a sharp softmax: one edge per destination takes more than 0.99 of the weight.

Where a kernel keeps out, or the backward's delta = rowsum(dO * O), in bfloat16 instead of float32,
the gradient of q cancels badly (delta - <dO, v_e> is a difference of two nearly equal numbers for the
dominant edge). Values and gradients of every backend that takes bfloat16 here are compared against
float64 math on the same bfloat16-rounded inputs; on CPU the triton backend runs in the interpreter
(tests/conftest.py), on a GPU it runs compiled.
"""

import pytest
import torch

from sparseattn import Graph, edge_attention
from sparseattn.kernels import _BACKENDS

from ..optional import backend_params

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, DEG, H, D = 96, 12, 2, 32
MODES = {"exact": None, "clamp": (-5.0, 5.0)}  # clamp: every other edge gets bias -10, so it sits at -5


def takes_bf16(name: str) -> bool:
    return torch.bfloat16 in _BACKENDS[name].dtypes.get(DEVICE, ())


# skipped with the reason where a backend's dependency is missing
BACKENDS = backend_params(
    [n for n in ("reference", "csr", "scatter", "triton", "auto") if n == "auto" or takes_bf16(n)]
)


def sharp_inputs(gen: torch.Generator):
    """A random graph of in-degree DEG (no duplicate edges) and q, k, v in bfloat16 where each
    destination's query points along the key of its first in-edge, scaled so that edge dominates."""
    src = torch.stack([torch.randperm(N, generator=gen)[:DEG] for _ in range(N)])  # (N, DEG)
    g = Graph(torch.stack([src.flatten(), torch.arange(N).repeat_interleave(DEG)]), N, N).to(DEVICE)
    k = torch.nn.functional.normalize(torch.randn(N, H, D, generator=gen), dim=-1) * D**0.5
    q = 3.0 * k[src[:, 0]] + 0.3 * torch.randn(N, H, D, generator=gen)  # (N, H, D)
    v = torch.randn(N, H, D, generator=gen)
    return g, [x.to(DEVICE, torch.bfloat16).requires_grad_() for x in (q, k, v)]


def run(q, k, v, g: Graph, mode: str, backend: str, grad, return_weights=False):
    bias = None if MODES[mode] is None else torch.where(torch.arange(g.num_edges, device=DEVICE) % DEG == 0, 0.0, -10.0)
    bias = None if bias is None else bias.to(q.dtype)[:, None].expand(-1, H)  # (E, H); edge 0 of each row dominant
    out = edge_attention(q, k, v, g, clamp=MODES[mode], bias=bias, backend=backend, return_weights=return_weights)
    if return_weights:
        return out
    return [out, *torch.autograd.grad(out, (q, k, v), grad)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_sharp_softmax_values_and_gradients(backend, mode):
    gen = torch.Generator().manual_seed(7)
    g, (q, k, v) = sharp_inputs(gen)
    grad = torch.randn(N, H, D, generator=gen).to(DEVICE, torch.bfloat16)
    wide = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want = run(*wide, g, mode, "reference", grad.double())
    _, weights = run(*wide, g, mode, "reference", None, return_weights=True)
    top = torch.zeros(N, H, dtype=torch.float64, device=DEVICE).index_reduce_(0, g.dst, weights.detach(), "amax")
    assert float(top.min()) > 0.99, "the inputs are not sharp enough to test what they are meant to"

    got = run(q, k, v, g, mode, backend, grad)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        a, b = a.detach(), b.detach()
        assert a.dtype == torch.bfloat16 and bool(a.isfinite().all()), name
        err = (a.double() - b).norm() / b.norm()  # bf16 holds 8 bits: one rounding is <= 2^-9 relative
        assert float(err) < 2e-2, f"{backend} {mode} {name}: relative error {float(err):.3g}"
        worst = (a.double() - b).abs().max() / b.abs().max()
        assert float(worst) < 4e-2, f"{backend} {mode} {name}: worst entry off by {float(worst):.3g} of the largest"


def test_sharp_inputs_would_catch_a_bf16_delta():
    """The check above fails for a backward that rounds delta = rowsum(dO * O) to bfloat16 (written
    out here in float64 math), so the inputs are sharp enough to expose that fault."""
    gen = torch.Generator().manual_seed(7)
    g, (q, k, v) = sharp_inputs(gen)
    grad = torch.randn(N, H, D, generator=gen).to(DEVICE, torch.bfloat16).double()
    q64, k64, v64 = (x.detach().double() for x in (q, k, v))
    src, dst, scale = g.src, g.dst, D**-0.5
    out, p = edge_attention(q64, k64, v64, g, clamp=None, backend="reference", return_weights=True)  # p (E, H)

    def dq_with(delta):  # dq[t] = scale sum_e p_e (<dO_t, v_s> - delta_t) k_s
        ds = p * ((grad[dst] * v64[src]).sum(-1) - delta[dst])  # (E, H)
        return torch.zeros_like(q64).index_add_(0, dst, scale * ds.unsqueeze(-1) * k64[src])

    delta = (grad * out).sum(-1)  # (N, H)
    exact, rounded = dq_with(delta), dq_with(delta.bfloat16().double())
    assert float((rounded - exact).norm() / exact.norm()) > 2e-2
