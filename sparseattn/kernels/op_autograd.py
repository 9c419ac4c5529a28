"""One autograd rule per kernel op, and the way eager code enters it.

A fast backend's kernels are `torch.library` custom ops (`sparseattn::csr_attention_fwd`, ...), so
compiled and exported graphs hold them whole. `with_autograd` registers the op's rule (setup and
backward) and returns the function the backend calls: inside a trace, the op itself (its registered
rule is what AOTAutograd differentiates); in eager code, a `torch.autograd.Function` that calls the
same op and runs the same setup and backward. The Function skips torch's wrapper around a custom
op's rule, which rebuilds the op's schema once per argument on every call (`fill_defaults`, ~0.1 ms
for 19 arguments: 13% of a forward+backward on a 64-node graph).
"""

from __future__ import annotations

from typing import Any, Callable, Type

import torch

from .._tracing import tracing


def with_autograd(op: Any, setup_context: Callable, backward: Callable) -> Callable:
    """Register backward (with setup_context, as `register_autograd` takes them) as op's autograd
    rule and return op's differentiable entry: op(*inputs) inside a trace or without grad mode, else
    the same op and rule through an autograd.Function. The rule sees the op's inputs by position
    either way."""
    op.register_autograd(backward, setup_context=setup_context)

    def forward(ctx, *inputs):  # grad mode is off in here: the op runs its kernel directly
        output = op(*inputs)
        setup_context(ctx, inputs, output)
        return output

    # named after the op (its graph node shows as <op>_eagerBackward)
    name = f"{op._qualname.split('::')[-1]}_eager"
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    eager: Type[torch.autograd.Function] = type(name, (torch.autograd.Function,), methods)

    def call(*inputs):
        if tracing() or not torch.is_grad_enabled():  # (without grad mode the op skips its rule)
            return op(*inputs)
        return eager.apply(*inputs)

    return call


__all__ = ["with_autograd"]
