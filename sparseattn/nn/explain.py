"""PyG's explainers on models built with `sparseattn.nn`'s attention layers (TransformerConv, GATConv,
GATv2Conv): `attention_explainer`, PyG's `AttentionExplainer` that reads their weights, and
`explainable`, which lets PyG's mask explainers (GNNExplainer, PGExplainer, CaptumExplainer) and
`Explainer`'s masked predictions reach them."""

from __future__ import annotations

import functools
from typing import Any, List

import torch
from torch import Tensor, nn

from ._common import MASK_HOLDER
from .gat import GATConv
from .gatv2 import GATv2Conv
from .transformer_conv import TransformerConv

# layers whose forward returns (out, (edge_index, alpha)) when asked, and where that argument sits
ATTENTION_LAYERS = {GATConv: 4, GATv2Conv: 3, TransformerConv: 3}


def attention_explainer(reduce: str = "max") -> Any:
    """`torch_geometric.explain.algorithm.AttentionExplainer(reduce)` that also reads the attention
    weights of sparseattn's TransformerConv, GATConv and GATv2Conv, and counts them as hops.

    PyG's AttentionExplainer (and PyG's Explainer generally) finds its layers by
    `isinstance(module, MessagePassing)` and reads their weights through MessagePassing's
    message-forward hooks; on sparseattn layers it finds none ("Could not collect any attention
    coefficients"). This subclass asks each sparseattn attention layer for its weights during the
    explainer's forward pass (a forward pre-hook sets return_attention_weights=True; a forward hook
    records alpha and hands the model the output it asked for), then reduces them as PyG does
    (per head, then across layers, by `reduce`; the first E weights of each layer, E the edges
    given). For node-level tasks the hard edge mask spans as many hops as there are attention
    layers, PyG's and these. Homogeneous graphs only. Needs torch_geometric, imported here only.

    Use: `Explainer(model, algorithm=attention_explainer(), explanation_type="model",
    edge_mask_type="object", model_config=...)`, as with PyG's.
    """
    from torch_geometric.explain.algorithm import AttentionExplainer  # type: ignore[import-untyped]
    from torch_geometric.explain.algorithm.base import ExplainerAlgorithm  # type: ignore[import-untyped]
    from torch_geometric.nn import MessagePassing  # type: ignore[import-untyped]
    from torch_geometric.utils import k_hop_subgraph  # type: ignore[import-untyped]

    class SparseAttnAttentionExplainer(AttentionExplainer):
        """AttentionExplainer over PyG's MessagePassing layers and sparseattn's attention layers."""

        def _collect_attention_coefficients(self, model: nn.Module, x: Any, edge_index: Any, **kwargs: Any):
            if self.is_hetero:
                raise NotImplementedError("attention_explainer: heterogeneous graphs are not supported")
            alphas: List[Tensor] = []
            handles = []
            recorder = _Recorder(alphas)
            for module in model.modules():
                if type(module) in ATTENTION_LAYERS:
                    handles.append(module.register_forward_pre_hook(recorder.pre, with_kwargs=True))
                    handles.append(module.register_forward_hook(recorder.post))
            try:
                theirs = super()._collect_attention_coefficients(model, x, edge_index, **kwargs)
            except ValueError:  # PyG's: none of its layers gave weights
                if not alphas:
                    raise
                theirs = []
            finally:
                for handle in handles:
                    handle.remove()
            return list(theirs) + alphas

        @staticmethod
        def _get_hard_masks(model: nn.Module, node_index: Any, edge_index: Tensor, num_nodes: int):
            if node_index is None:
                return None, None
            hops = sum(isinstance(m, MessagePassing) or type(m) in ATTENTION_LAYERS for m in model.modules())
            flow = ExplainerAlgorithm._flow(model)
            index, _, _, edge_mask = k_hop_subgraph(
                node_index, num_hops=hops, edge_index=edge_index, num_nodes=num_nodes, flow=flow
            )
            node_mask = edge_index.new_zeros(num_nodes, dtype=torch.bool)
            node_mask[index] = True
            return node_mask, edge_mask

    return SparseAttnAttentionExplainer(reduce=reduce)


class _Recorder:
    """The hooks that ask a layer for its weights and keep them: `pre` (forward pre-hook) calls with
    return_attention_weights=True, remembering what the caller asked; `post` (forward hook) keeps
    alpha (E', H) and returns what the caller would have had."""

    def __init__(self, alphas: List[Tensor]) -> None:
        self.alphas = alphas
        self.caller_wants: List[bool] = []  # a stack: a layer may run inside another's call

    def pre(self, module: nn.Module, args: tuple, kwargs: dict):
        pos = ATTENTION_LAYERS[type(module)]
        given = args[pos] if len(args) > pos else kwargs.get("return_attention_weights")
        # the layers' own rules: TransformerConv returns weights for any bool, GAT / GATv2 for True
        self.caller_wants.append(isinstance(given, bool) if isinstance(module, TransformerConv) else bool(given))
        if len(args) > pos:
            return args[:pos] + (True,) + args[pos + 1 :], kwargs
        return args, {**kwargs, "return_attention_weights": True}

    def post(self, module: nn.Module, args: tuple, out: Any):
        self.alphas.append(out[1][1].detach())
        return out if self.caller_wants.pop() else out[0]


def explainable(model: nn.Module) -> nn.Module:
    """`model` (changed in place and returned) with each of its sparseattn TransformerConv, GATConv and
    GATv2Conv given a child `explain_masks`: a parameterless PyG `MessagePassing`, which PyG's
    `set_masks` finds (PyG's explainers select layers by `isinstance(module, MessagePassing)`) and
    fills with the explainer's edge mask. The layer then multiplies each edge's normalized weight by
    it (edge_attention's `edge_weight`), as PyG's layers multiply each message, so GNNExplainer,
    PGExplainer, CaptumExplainer and `Explainer.get_masked_prediction` (fidelity) explain these
    layers as PyG's: `Explainer(snn.explainable(model), algorithm=GNNExplainer(), ...)`.

    Outside an explanation the layers compute as before and the state dict is unchanged; while one
    runs, the explainer's mask is a parameter of every such child (PyG's layers hold it the same
    way). A layer that already has the child keeps it. Needs torch_geometric, imported here only."""
    holder = _mask_holder_class()
    for module in list(model.modules()):
        if type(module) in ATTENTION_LAYERS and MASK_HOLDER not in module._modules:
            module.add_module(MASK_HOLDER, holder())
            module.register_forward_hook(_relay_output)
    return model


def _relay_output(module: nn.Module, args: tuple, output: Any) -> None:
    """A layer's forward hook: its output passes through its `explain_masks` child, so that hooks PyG
    puts on MessagePassing modules to read layer outputs (`torch_geometric.utils.get_embeddings`,
    which PGExplainer reads) see it."""
    holder = module._modules[MASK_HOLDER]
    assert holder is not None
    holder(output)


@functools.lru_cache(maxsize=None)
def _mask_holder_class() -> type:
    """`ExplainMasks`, made on first use (it subclasses PyG's MessagePassing, and torch_geometric is
    imported only when asked for); the module's `ExplainMasks` attribute, so pickle finds it."""
    from torch_geometric.nn import MessagePassing

    class ExplainMasks(MessagePassing):
        """Where PyG's explainers leave a sparseattn layer's edge mask (`explainable`); never propagates.
        Called with its layer's output, which it returns (`_relay_output`)."""

        def forward(self, output: Any) -> Any:
            return output

    ExplainMasks.__module__, ExplainMasks.__qualname__ = __name__, "ExplainMasks"
    return ExplainMasks


def __getattr__(name: str) -> Any:
    if name == "ExplainMasks":
        return _mask_holder_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
