"""A fast backend's attention as a forward op and a backward op, both derived from one `OpSpec`.

A backend declares its forward op as `ATTENTION_ARGS` plus the index views and options it asks for,
with the outputs "out" (N_dst, H, Dv) and "weights" (E, H) (empty unless return_weights) and the
state it saves for the backward (`Out(..., saved=True)`). From that `define_attention_op` makes

- the forward op `<name>_fwd` (the backend's kernel and the fake of its saved outputs);
- the backward op `<name>_bwd`, whose arguments follow from the forward's: the gradients of the
  unsaved outputs (`grad_out`, `grad_weights`), every saved tensor argument and saved output, every
  non-tensor argument, and `needs` (per gradient argument: is its gradient wanted); it returns one
  gradient per gradient argument, shaped as that argument (empty where not needed);
- the autograd rule between them, written once: a create_graph backward recomputes through the
  reference (`differentiable_grads`), whose gradients torch can differentiate again.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from .._tracing import TraceableOp
from . import reference
from .op_spec import ATTENTION_ARGS, EDGE_TERM_NAMES, Arg, OpSpec, Out, Saved


class AttentionOp(NamedTuple):
    """call: the differentiable entry (positional, in `forward.names` order: use `forward.bind`);
    forward, backward: the two specs; forward_op, backward_op: the ops (`.op`: the custom op)."""

    call: Callable
    forward: OpSpec
    backward: OpSpec
    forward_op: TraceableOp
    backward_op: TraceableOp


def backward_spec(forward: OpSpec, qualname: str) -> OpSpec:
    """The backward op's description, derived from the forward's (see the module doc)."""
    grads_in = [Arg(f"grad_{o.name}", "Tensor?") for o in forward.outputs if not o.saved]
    saved = [a for a in forward.args if a.is_tensor and a.saved]
    carried = [Arg(o.name, "Tensor") for o in forward.outputs if o.saved]
    kept = [a for a in forward.args if not a.is_tensor]
    outputs = [f"grad_{n}" for n in forward.grad_args]
    return OpSpec(qualname, [*grads_in, *saved, *carried, *kept, Arg("needs", "bool[]")], outputs)


def _forward_fake(spec: OpSpec, saved_fake: Callable[[Saved], Sequence[Tensor]]) -> Callable:
    def fake(*args):
        a = Saved(zip(spec.names, args))
        q, v = a.q, a.v
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
        weights = q.new_empty(a.edge_index.shape[1], q.shape[1]) if a.return_weights else q.new_empty(0)
        return (out, weights, *saved_fake(a))

    return fake


def _backward_fake(spec: OpSpec, grads: Sequence[str]) -> Callable:
    def fake(*args):
        a = Saved(zip(spec.names, args))
        q = a.q
        shaped = {n: a[n] for n in grads}
        shaped["bias"] = q.new_empty(a.edge_index.shape[1], q.shape[1]) if a.bias is None else a.bias
        return tuple(
            torch.empty_like(shaped[n]) if need and shaped[n] is not None else q.new_empty(0)
            for n, need in zip(grads, a.needs)
        )

    return fake


def _named(fn: Callable, spec: OpSpec) -> Callable:
    """fn(*args) under the spec's parameter names (what `OpSpec.define` checks), calling fn by keyword."""

    def kernel(*args):
        return fn(Saved(zip(spec.names, args)))

    return kernel


def _named_gradients(fn: Callable, spec: OpSpec, grads: Sequence[str]) -> Callable:
    """The backward op's kernel: fn(args) with `args.wanted` (gradient argument name -> whether its
    gradient is wanted, from `needs`) returns the gradients by name (None or absent: none); the op
    returns one per name of `grads`, empty where not wanted or not given."""

    def kernel(*args):
        a = Saved(zip(spec.names, args))
        a["wanted"] = dict(zip(grads, (bool(n) for n in a.needs)))
        found = fn(a)
        unknown = set(found) - set(grads)
        assert not unknown, f"{spec.qualname} returned gradients of {sorted(unknown)}, which take none"
        return tuple(found[n] if a.wanted[n] and found.get(n) is not None else a.q.new_empty(0) for n in grads)

    return kernel


def define_attention_op(
    name: str,
    extra_args: Sequence[Arg],
    saved_outputs: Sequence[str],
    forward: Callable[[Saved], tuple],
    saved_fake: Callable[[Saved], Sequence[Tensor]],
    backward: Callable[[Saved], Dict[str, Optional[Tensor]]],
) -> AttentionOp:
    """The ops `sparseattn::<name>_fwd` and `<name>_bwd` and their autograd rule.

    extra_args: the backend's index views and options, after `ATTENTION_ARGS`; saved_outputs: names
    of the forward's outputs after out and weights (carried to the backward). forward(args) returns
    (out, weights, *saved outputs); saved_fake(args) the saved outputs' fakes; backward(args) the
    gradients of the gradient arguments by name (`args.wanted[name]`: whether one is wanted; a name
    left out gets none). Each takes its op's arguments by name (`args.q`, `args.wanted`, ...)."""
    outputs = [Out("out"), Out("weights"), *(Out(n, saved=True) for n in saved_outputs)]
    fwd = OpSpec(f"sparseattn::{name}_fwd", [*ATTENTION_ARGS, *extra_args], outputs)
    bwd = backward_spec(fwd, f"sparseattn::{name}_bwd")
    fwd_op = TraceableOp(fwd.qualname, _named(forward, fwd), schema=fwd.schema())
    fwd_op.register_fake(_forward_fake(fwd, saved_fake))
    bwd_op = TraceableOp(bwd.qualname, _named_gradients(backward, bwd, fwd.grad_args), schema=bwd.schema())
    bwd_op.register_fake(_backward_fake(bwd, fwd.grad_args))
    grads = fwd.grad_args

    def rule(
        saved: Saved, grads_of: Dict[str, Optional[Tensor]], needs: Dict[str, bool]
    ) -> Dict[str, Optional[Tensor]]:
        grad_out, grad_weights = grads_of["out"], grads_of["weights"]
        if grad_weights is not None and grad_weights.numel() == 0:
            grad_weights = None
        if torch.is_grad_enabled():  # create_graph=True: gradients that can be differentiated again
            again = reference.differentiable_grads(
                saved.edge_index, saved.q, saved.k, saved.v, saved.bias, saved.mask,
                tuple(needs[n] for n in grads), saved.scale, saved.clamp, grad_out, grad_weights,
                tuple(saved[n] for n in EDGE_TERM_NAMES), saved.eps,
            )  # fmt: skip
            return dict(zip(grads, again))
        if grad_out is None:  # only the weights were used
            q, v = saved.q, saved.v
            grad_out = v.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        wanted = [needs[n] and saved.get(n) is not None for n in grads]
        given = {n: saved[n] for n in bwd.names if n in saved}
        result = bwd_op(*bwd.bind(**given, grad_out=grad_out, grad_weights=grad_weights, needs=wanted))
        return {n: g for n, g, w in zip(grads, result, wanted) if w}

    return AttentionOp(fwd.with_autograd(fwd_op, rule), fwd, bwd, fwd_op, bwd_op)


__all__ = ["AttentionOp", "backward_spec", "define_attention_op"]
