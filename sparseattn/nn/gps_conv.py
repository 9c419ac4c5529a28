"""`GPSConv`: PyG's GraphGPS layer (local message passing + global attention + MLP) with
`GlobalAttention` over each graph of the batch, without padding."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Union

import torch.nn.functional as F
from torch import Tensor, nn

from ._common import NotScriptable
from .global_attention import GlobalAttention
from .performer import PerformerAttention

PYG_EXTRA = "pip install 'sparseattn[examples]' (or torch_geometric)"


def resolve_activation(act: Union[str, Callable, None], **kwargs: Any) -> Any:
    """PyG's `activation_resolver(act, **kwargs)` where torch_geometric is installed; otherwise a
    name resolves the same way among torch.nn's activations ("relu", "leaky_relu", "gelu", ...:
    lowercase, underscores dropped), and anything not a string is returned as it is."""
    try:
        from torch_geometric.nn.resolver import activation_resolver  # type: ignore[import-untyped]
    except ImportError:
        activation_resolver = None
    if activation_resolver is not None:
        return activation_resolver(act, **kwargs)
    if not isinstance(act, str):
        return act
    key = act.lower().replace("_", "").replace("-", "").replace(" ", "")
    acts = {name.lower(): cls for name, cls in vars(nn.modules.activation).items() if isinstance(cls, type)}
    acts = {name: cls for name, cls in acts.items() if issubclass(cls, nn.Module)}
    if key not in acts:
        raise ValueError(f"act={act!r} is not a torch.nn activation; valid names include 'relu', 'gelu', 'leaky_relu'")
    return acts[key](**kwargs)


def resolve_norm(norm: Union[str, Callable, None], channels: int, **kwargs: Any) -> Any:
    """PyG's `normalization_resolver(norm, channels, **kwargs)`: a name ("batch_norm", "layer_norm",
    "graph_norm", ...) becomes a new torch_geometric.nn.norm module, which needs torch_geometric
    (ImportError naming the extra); a module or None is returned as it is (one module passed is
    then shared by norm1, norm2 and norm3, as in PyG)."""
    if not isinstance(norm, str):
        return norm
    try:
        from torch_geometric.nn.resolver import normalization_resolver
    except ImportError as e:
        raise ImportError(
            f"GPSConv(norm={norm!r}) builds PyG's norm layer (torch_geometric.nn.norm, whose state-dict keys GPSConv "
            f"mirrors), which needs torch_geometric: {PYG_EXTRA}; or pass norm=None or a module"
        ) from e
    return normalization_resolver(norm, channels, **kwargs)


class GPSConv(NotScriptable, nn.Module):
    """The GraphGPS layer, as `torch_geometric.nn.GPSConv`, with the same constructor, submodules
    (conv, attn, mlp, norm1, norm2, norm3), init order and state-dict keys, so
    `load_state_dict(pyg_gps.state_dict())` works both ways; `attn` is a `GlobalAttention`
    (nn.MultiheadAttention's keys), which attends within each graph of `batch` without
    `to_dense_batch`'s padding, or with attn_type="performer" a `PerformerAttention` (PyG's keys).

    out = norm3(h + mlp(h)), h = norm1(x + conv(x, edge_index)) + norm2(x + attn(x, batch)), with
    dropout on conv's and attn's outputs and inside the MLP; a norm that takes `batch` (PyG's
    LayerNorm, GraphNorm) gets it.

    Args:
        channels: C, the width of x and of the output.
        conv: the local message passing layer, (x, edge_index, **kwargs) -> (N, C), or None.
        heads: H of the global attention; C must be divisible by it.
        dropout: dropout on the intermediate embeddings (not on the attention weights: pass
            attn_kwargs={"dropout": p} for those).
        act, act_kwargs: the MLP's activation, a name resolved as PyG's `activation_resolver` does
            (among torch.nn's activations without torch_geometric), or a module.
        norm, norm_kwargs: the three norms: a name resolved by PyG's `normalization_resolver`
            ("batch_norm", "layer_norm", "graph_norm", ...; needs torch_geometric), a module, or None.
        attn_type: "multihead" (`GlobalAttention`) or "performer" (`nn.performer.PerformerAttention`,
            PyG's linear attention over the batch padded as `to_dense_batch` pads it, whose result
            depends on that padding).
        attn_kwargs: more arguments of the attention: `GlobalAttention`'s (dropout, bias, clamp,
            backend) or `PerformerAttention`'s (head_channels, kernel, qkv_bias, attn_out_bias, dropout).

    Shapes:
        x: (N, C); edge_index: whatever conv takes; batch: (N,) sorted graph ids, or None for one
        graph. Output: (N, C).
    """

    def __init__(
        self,
        channels: int,
        conv: Optional[nn.Module],
        heads: int = 1,
        dropout: float = 0.0,
        act: Union[str, Callable] = "relu",
        act_kwargs: Optional[Dict[str, Any]] = None,
        norm: Union[str, Callable, None] = "batch_norm",
        norm_kwargs: Optional[Dict[str, Any]] = None,
        attn_type: str = "multihead",
        attn_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Build the layer; the arguments are described in the class docstring."""
        super().__init__()
        if attn_type not in ("multihead", "performer"):
            raise ValueError(
                f"attn_type must be 'multihead' (GlobalAttention, as nn.MultiheadAttention) or 'performer' "
                f"(PerformerAttention, as PyG's), got {attn_type!r}"
            )
        self.channels = channels
        self.conv = conv
        self.heads = heads
        self.dropout = dropout
        self.attn_type = attn_type
        self.attn: nn.Module
        if attn_type == "multihead":
            self.attn = GlobalAttention(channels, heads, batch_first=True, **(attn_kwargs or {}))
        else:
            self.attn = PerformerAttention(channels, heads, **(attn_kwargs or {}))
        self.mlp = nn.Sequential(
            nn.Linear(channels, channels * 2),
            resolve_activation(act, **(act_kwargs or {})),
            nn.Dropout(dropout),
            nn.Linear(channels * 2, channels),
            nn.Dropout(dropout),
        )
        norm_kwargs = norm_kwargs or {}
        self.norm1 = resolve_norm(norm, channels, **norm_kwargs)
        self.norm2 = resolve_norm(norm, channels, **norm_kwargs)
        self.norm3 = resolve_norm(norm, channels, **norm_kwargs)
        self.norm_with_batch = False
        if self.norm1 is not None:
            self.norm_with_batch = "batch" in inspect.signature(self.norm1.forward).parameters

    def reset_parameters(self) -> None:
        """Reset conv, attn, the MLP's layers and the norms, as PyG's GPSConv does."""
        for module in (self.conv, self.attn, *self.mlp, self.norm1, self.norm2, self.norm3):
            reset = getattr(module, "reset_parameters", None)  # None for conv=None, activations, dropout
            if callable(reset):
                reset()

    def _norm(self, norm: Optional[nn.Module], h: Tensor, batch: Optional[Tensor]) -> Tensor:
        """norm(h), with batch=batch for norms that take it; h itself without a norm."""
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def forward(self, x: Tensor, edge_index: Any, batch: Optional[Tensor] = None, **kwargs: Any) -> Tensor:
        """x (N, C) -> (N, C); edge_index and **kwargs go to conv, batch (N,) (None: one graph)
        to the global attention and to norms that take it."""
        hs: List[Tensor] = []
        if self.conv is not None:  # local message passing
            h = self.conv(x, edge_index, **kwargs)  # (N, C)
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        h = self.attn(x, batch)  # (N, C): attention within each graph of the batch
        h = F.dropout(h, p=self.dropout, training=self.training)
        hs.append(self._norm(self.norm2, h + x, batch))
        out = hs[0] if len(hs) == 1 else hs[0] + hs[1]
        out = out + self.mlp(out)
        return self._norm(self.norm3, out, batch)

    def __repr__(self) -> str:
        """PyG's repr: GPSConv(channels, conv=..., heads=..., attn_type=...)."""
        return (
            f"{type(self).__name__}({self.channels}, conv={self.conv}, heads={self.heads}, attn_type={self.attn_type})"
        )
