"""One description of a kernel op's call, from which its `torch.library` schema, its saved tensors
and its autograd wiring are derived, written once for every backend.

An `OpSpec` lists the op's arguments in order, each an `Arg` with its schema type and two roles:
`grad` (the autograd rule returns a gradient for it) and `saved` (the backward reads it). From that
list the spec derives

- the op's schema (`torch.library.custom_op(..., schema=spec.schema())`); the kernels read their
  arguments by name (`Saved`), so a new argument cannot be bound to the wrong parameter;
- the autograd rule: `setup_context` saves the `saved` tensor arguments and saved outputs and keeps the
  non-tensor arguments; the backward is written against names (`Saved`, `grads_of_outputs`, `needs`)
  and returns gradients by name, which the spec places at their arguments' positions;
- the call by keyword: `spec.bind(**named)` orders the arguments (and refuses a missing or unknown
  name), so callers never splat positional lists.

The arguments every attention op shares (q, k, v, the score and edge terms, the options) are
declared once in `ATTENTION_ARGS` (its edge terms from `contract.EDGE_TERMS`); a backend's spec adds
the index views it asks for. A new edge term is an entry in EDGE_TERMS plus its math in each kernel
and the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor

from .._tracing import TraceableOp, tracing
from .contract import EDGE_TERMS


@dataclass(frozen=True)
class Arg:
    """One argument of a kernel op. type: its schema type ("Tensor", "Tensor?", "float", "float[]?",
    "bool", "int[]", "bool[]"); grad: the op's autograd rule returns a gradient for it; saved: the
    backward reads it (non-tensor arguments are always kept)."""

    name: str
    type: str
    grad: bool = False
    saved: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass(frozen=True)
class Out:
    """One output of a forward op. saved: it only carries state to the backward (saved, marked
    non-differentiable, no zeros made up when unused)."""

    name: str
    saved: bool = False


# The inputs of an attention call that every backend's forward op takes, in this order (shapes in
# contract.AttentionInputs). A new edge term is an entry in contract.EDGE_TERMS.
ATTENTION_ARGS: Tuple[Arg, ...] = (
    Arg("q", "Tensor", grad=True, saved=True),
    Arg("k", "Tensor", grad=True, saved=True),
    Arg("v", "Tensor", grad=True, saved=True),
    Arg("edge_index", "Tensor", saved=True),  # for a double backward through the reference
    Arg("bias", "Tensor?", grad=True, saved=True),
    Arg("mask", "Tensor?", saved=True),
    *(Arg(term.name, "Tensor?", grad=True, saved=True) for term in EDGE_TERMS),
    Arg("eps", "float"),
    Arg("scale", "float"),
    Arg("clamp", "float[]?"),
    Arg("return_weights", "bool"),
)
EDGE_TERM_NAMES: Tuple[str, ...] = tuple(term.name for term in EDGE_TERMS)


class Saved(dict):
    """What the backward reads, by name: the saved tensor arguments and outputs, and every non-tensor
    argument. Attribute access reads an entry (`saved.q`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


# backward(saved, grads_of_outputs, needs) -> gradients by argument name (None or absent: no gradient)
Backward = Callable[[Saved, Dict[str, Optional[Tensor]], Dict[str, bool]], Dict[str, Optional[Tensor]]]


class OpSpec:
    """The description of one op: its qualified name, arguments and outputs (see the module doc)."""

    def __init__(self, qualname: str, args: Sequence[Arg], outputs: Sequence[Any]) -> None:
        names = [a.name for a in args]
        if len(set(names)) != len(names):
            raise ValueError(f"{qualname}: repeated argument names in {names}")
        self.qualname, self.args = qualname, tuple(args)
        self.outputs = tuple(o if isinstance(o, Out) else Out(o) for o in outputs)
        self.names = tuple(names)
        self._position = {n: i for i, n in enumerate(names)}
        self.grad_args = tuple(a.name for a in args if a.grad)

    def schema(self) -> str:
        """The op's schema string: `(Tensor q, ..., bool return_weights) -> (Tensor, ...)`."""
        params = ", ".join(f"{a.type} {a.name}" for a in self.args)
        return f"({params}) -> ({', '.join('Tensor' for _ in self.outputs)})"

    def bind(self, **named: Any) -> Tuple[Any, ...]:
        """The arguments in the op's order; optional ("?") ones left out are None."""
        unknown = set(named) - set(self.names)
        if unknown:
            raise TypeError(f"{self.qualname}: unknown arguments {sorted(unknown)}")
        values = []
        for a in self.args:
            if a.name in named:
                values.append(named[a.name])
            elif a.type.endswith("?"):
                values.append(None)
            else:
                raise TypeError(f"{self.qualname}: missing argument {a.name!r}")
        return tuple(values)

    def with_autograd(self, op: TraceableOp, backward: Backward) -> Callable:
        """Register op's autograd rule, derived from the spec around `backward`, and return the
        op's differentiable entry (see `autograd_entry`)."""
        saved_tensors = [a.name for a in self.args if a.is_tensor and a.saved]
        kept = [a.name for a in self.args if not a.is_tensor]
        saved_outputs = [i for i, o in enumerate(self.outputs) if o.saved]
        out_names = [o.name for o in self.outputs]
        positions = [self._position[n] for n in self.grad_args]

        def setup_context(ctx, inputs, output):
            carried = [output[i] for i in saved_outputs]
            ctx.mark_non_differentiable(*carried)
            ctx.set_materialize_grads(False)  # no zeros made up for an output left unused
            ctx.save_for_backward(*(inputs[self._position[n]] for n in saved_tensors), *carried)
            ctx.kept = {n: inputs[self._position[n]] for n in kept}

        def backward_rule(ctx, *grads):
            tensors = ctx.saved_tensors
            saved = Saved(zip(saved_tensors, tensors))
            saved.update(zip((out_names[i] for i in saved_outputs), tensors[len(saved_tensors) :]))
            saved.update(ctx.kept)
            needs = {n: bool(ctx.needs_input_grad[p]) for n, p in zip(self.grad_args, positions)}
            by_name = backward(saved, dict(zip(out_names, grads)), needs)
            result: List[Optional[Tensor]] = [None] * len(self.args)
            for n, p in zip(self.grad_args, positions):
                result[p] = by_name.get(n) if needs[n] else None
            return tuple(result)

        return autograd_entry(op, setup_context, backward_rule)


def autograd_entry(op: TraceableOp, setup_context: Callable, backward: Callable) -> Callable:
    """Register backward (with setup_context, as `register_autograd` takes them) as op's autograd
    rule and return op's differentiable entry: the op inside a trace (its registered rule is what
    AOTAutograd differentiates), its function without grad mode, else the function and the same rule
    through an autograd.Function. The Function skips torch's wrapper around a custom op's rule, which
    rebuilds the op's schema once per argument on every call (`fill_defaults`, ~0.1 ms for 19
    arguments: 13% of a forward+backward on a 64-node graph)."""
    op.op.register_autograd(backward, setup_context=setup_context)

    def forward(ctx, *inputs):  # grad mode is off in here
        output = op.fn(*inputs)
        setup_context(ctx, inputs, output)
        return output

    # named after the op (its graph node shows as <op>_eagerBackward)
    name = f"{op.qualname.split('::')[-1]}_eager"
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    eager: Type[torch.autograd.Function] = type(name, (torch.autograd.Function,), methods)

    def call(*inputs):
        if tracing():
            return op.op(*inputs)
        if not torch.is_grad_enabled():
            return op.fn(*inputs)
        return eager.apply(*inputs)

    return call


__all__ = ["Arg", "Out", "OpSpec", "Saved", "ATTENTION_ARGS", "EDGE_TERM_NAMES", "autograd_entry"]
