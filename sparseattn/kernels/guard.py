"""Non-finite values kept to the edges that touch them, for backends that compute whole tiles.

"local" and "dense" multiply whole tiles (every destination row of a tile by every source row of
its span) and take the non-edges out afterwards, with a -inf score or a zero weight. A NaN or inf in
one q, k or v row then reaches every row of its tile (NaN - inf, 0 * inf and 0 * NaN are NaN), not
only the destinations whose edges touch it. Such values are rare, so these backends run as they
are and their results are checked: an output that holds a non-finite value is computed again by
the sparse backend (csr), which touches the edges only, and so is a gradient of q, k, v or bias
that does (an identity node in front of the tiles replaces it in the backward). A finite result of
the tiles is the edges' own result, since a finite value times a zero weight adds exactly 0. The
checks are sums (`all_finite`): one pass over the output forward, one over the gradients backward,
one host read each. A tile backend that has shown its inputs finite in its forward (dense's causal
blocks, whose clamp test reads the norms of q and k) says so with `claim_finite_inputs`; the
backward then reads the incoming gradient instead of the three gradients it produces (why that is
enough: `claim_finite_inputs`).

The contract this restores, which every backend keeps (tests/kernels/test_non_finite.py):
- out[t] has a non-finite element exactly where the reference's has one (returned weights too);
- a gradient is non-finite only in rows connected to a touched destination t (one with an edge
  that reads a non-finite q, k, v, bias or edge-term value, or whose incoming gradient is
  non-finite): dq at t, dk and dv at the sources of t's edges, bias and edge terms at t's edges;
  every other row equals the reference's. Which of those rows are non-finite may differ between
  backends (the reference's clamp passes no gradient through a NaN score, csr multiplies it out).
Inside a torch.compile or torch.export trace the check cannot branch on the data and is left out:
"auto" picks neither backend there, and one named explicitly runs unchecked.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .._tracing import tracing
from .contract import AttentionInputs, BackendFn

GRADIENT_INPUTS = ("q", "k", "v", "bias")  # what a tile backend takes gradients for


def all_finite(tensors: Sequence[Optional[Tensor]]) -> bool:
    """Whether no element of these tensors is NaN or inf: their sums (in float32 at least, so that half
    types do not overflow) added up, one host read. Finite values whose sum overflows (magnitudes near
    the dtype's largest) read as non-finite too, which costs only the recomputation."""
    total: Optional[Tensor] = None
    for t in tensors:
        if t is not None and t.numel():
            part = t.sum(dtype=torch.promote_types(t.dtype, torch.float32))
            total = part if total is None else total + part
    return total is None or math.isfinite(total.item())


class _Claims(threading.local):
    """Whether the tile backend running in a checked call on this thread has claimed finite inputs."""

    made = False


_claims = _Claims()


def claim_finite_inputs() -> None:
    """Called by a tile backend during a checked call (guarded by `checked`) whose forward has shown
    q and k finite in every row its tiles read, and every v row read by an edge of positive weight;
    bias None. Then a finite output shows v finite too, so each non-edge pair of a tile holds a
    finite value times a zero weight, and so does its backward under a finite incoming gradient:
    the tiles' gradients are the edges' own, and the backward checks the incoming gradient (one
    read) instead of dq, dk and dv (three). Outside a checked call it has no effect."""
    _claims.made = True


def _tiles_claiming(tiles: BackendFn, inputs: AttentionInputs) -> Tuple[Tuple[Tensor, Optional[Tensor]], bool]:
    """tiles(inputs), and whether the call claimed finite inputs (`claim_finite_inputs`)."""
    _claims.made = False
    try:
        results = tiles(inputs)
        return results, _claims.made
    finally:
        _claims.made = False


def _with(inputs: AttentionInputs, tensors: Dict[str, Any]) -> AttentionInputs:
    """inputs with some of q, k, v and bias replaced (by None too: what a `_Call` keeps of a call)."""
    return inputs._replace(**tensors)


class _Call:
    """What the backward of one checked call needs beside its tensors: the call's other arguments, the
    sparse backend, and the incoming gradients of out and weights in the backward pass under way (set
    by hooks on them, which run before the tiles' backward; taken by `_Entry`, which runs after it)."""

    def __init__(self, inputs: AttentionInputs, sparse: BackendFn) -> None:
        self.inputs = _with(inputs, dict.fromkeys(GRADIENT_INPUTS))  # the tensors are saved by `_Entry`
        self.sparse = sparse
        self.incoming: list = [None, None]
        self.finite_inputs = False  # the tiles claimed finite inputs (`claim_finite_inputs`)

    def arrived(self, i: int, grad: Tensor) -> None:
        """The hook of output i (0: out, 1: weights): its incoming gradient in this backward pass."""
        self.incoming[i] = grad

    def sparse_gradients(self, tensors: Sequence[Optional[Tensor]], needs: Sequence[bool]) -> list:
        """The sparse backend's gradients of tensors = (q, k, v, bias) under the incoming gradients, None
        where not needed. Under create_graph=True (grad mode on inside the backward) they differentiate
        again: computed on the saved tensors themselves, else on detached copies."""
        create_graph = torch.is_grad_enabled()
        wanted = {n: t for n, t, need in zip(GRADIENT_INPUTS, tensors, needs) if need and t is not None}
        if not create_graph:
            wanted = {n: t.detach().requires_grad_() for n, t in wanted.items()}
        given = dict(zip(GRADIENT_INPUTS, tensors), **wanted)
        with torch.enable_grad():
            results = self.sparse(_with(self.inputs, given))
        pairs = [(o, g) for o, g in zip(results, self.incoming) if o is not None and g is not None]
        outputs, incoming = zip(*pairs)
        found = dict(
            zip(wanted, torch.autograd.grad(outputs, list(wanted.values()), incoming, create_graph=create_graph))
        )
        return [found.get(n) for n in GRADIENT_INPUTS]


class _Entry(torch.autograd.Function):
    """Identity on (q, k, v, bias) before the tiles; its backward receives the tiles' gradients of them
    and replaces those that are not finite by the sparse backend's."""

    @staticmethod
    def forward(ctx, call: _Call, *tensors):
        ctx.call = call
        ctx.save_for_backward(*tensors)
        return tuple(None if t is None else t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        call, needs = ctx.call, ctx.needs_input_grad[1:]
        if call.finite_inputs and all_finite(call.incoming):
            pass  # the tiles' gradients are the edges' own (`claim_finite_inputs`)
        elif not all_finite(grads):
            bad = [need and not all_finite([g]) for g, need in zip(grads, needs)]
            sparse = call.sparse_gradients(ctx.saved_tensors, bad)
            grads = tuple(s if b else g for g, s, b in zip(grads, sparse, bad))
        call.incoming = [None, None]
        return (None, *grads)


def _checked_with_gradients(inputs: AttentionInputs, tiles: BackendFn, sparse: BackendFn):
    """The tiles' (out, weights) behind `_Entry`, with hooks that hand their incoming gradients to it,
    when out is finite; else the sparse backend's."""
    call = _Call(inputs, sparse)
    entered = _Entry.apply(call, *(getattr(inputs, n) for n in GRADIENT_INPUTS))
    results, call.finite_inputs = _tiles_claiming(tiles, _with(inputs, dict(zip(GRADIENT_INPUTS, entered))))
    if not all_finite([results[0]]):
        return sparse(inputs)
    for i, result in enumerate(results):
        if result is not None and result.requires_grad:
            result.register_hook(functools.partial(call.arrived, i))
    return results


def checked(
    tiles: BackendFn,
    sparse: BackendFn,
    reaches_non_edges: Callable[[AttentionInputs], bool] = lambda _: True,
    takes: Callable[[AttentionInputs], bool] = lambda _: True,
) -> BackendFn:
    """The backend function `tiles` (one that computes whole tiles) with its results checked: an
    output or a gradient holding a non-finite value comes from `sparse` instead (the module
    docstring). Unchecked inside a trace, and where `reaches_non_edges(inputs)` says that the tiles
    hold edges only (then their products are the edges' own, whatever the values). Inputs the tiles
    do not compute (`takes(inputs)` false) go to `sparse` directly, so the tiles' module never calls
    another backend."""

    def run(inputs: AttentionInputs) -> Tuple[Tensor, Optional[Tensor]]:
        if not takes(inputs):
            return sparse(inputs)
        if tracing() or not reaches_non_edges(inputs):
            return tiles(inputs)
        if torch.is_grad_enabled() and any(
            getattr(inputs, n) is not None and getattr(inputs, n).requires_grad for n in GRADIENT_INPUTS
        ):
            return _checked_with_gradients(inputs, tiles, sparse)
        results = tiles(inputs)
        return results if all_finite([results[0]]) else sparse(inputs)

    run.__name__ = run.__qualname__ = getattr(tiles, "__name__", "tiles")
    run.__doc__ = tiles.__doc__
    return run


__all__ = ["all_finite", "checked", "claim_finite_inputs"]
