"""`EdgeAttention` and nn.MultiheadAttention's state dicts: the module built from an MHA, the clamp
recorded in a saved state dict's metadata, and the checks and warnings when one is loaded."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

from torch import nn

CLAMP_RECORD = "sparseattn_clamp"  # the key EdgeAttention adds to its state-dict metadata


def from_multihead_attention(cls: Any, mha: nn.MultiheadAttention, backend: str) -> Any:
    """`cls.from_multihead_attention(mha, backend=backend)` (its docstring), cls an EdgeAttention class."""
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(f"mha must be an nn.MultiheadAttention, got {type(mha).__name__}")
    no_node = "every query attends to, and sparseattn attends only along graph edges (no extra key row)"
    if mha.add_zero_attn:
        raise ValueError(f"mha.add_zero_attn is True: it appends a zero key/value row {no_node}")
    if mha.bias_k is not None or mha.bias_v is not None:
        raise ValueError(f"mha.bias_k/bias_v exist (add_bias_kv=True): a learned key/value row {no_node}")
    weight = mha.out_proj.weight
    attn = cls(
        mha.embed_dim,
        mha.num_heads,
        bias=mha.in_proj_bias is not None,
        dropout=mha.dropout,
        clamp=None,
        backend=backend,
        kdim=mha.kdim,
        vdim=mha.vdim,
    ).to(device=weight.device, dtype=weight.dtype)
    attn.load_state_dict(mha.state_dict())
    return attn.train(mha.training)


def record_clamp(destination: Any, prefix: str, clamp: Optional[Tuple[float, float]]) -> None:
    """Put the module's clamp into the metadata of the state dict being saved (when it has some)."""
    metadata = getattr(destination, "_metadata", None)
    if metadata is not None and prefix[:-1] in metadata:
        metadata[prefix[:-1]][CLAMP_RECORD] = clamp


def check_loading(state_dict: Any, prefix: str, local_metadata: dict, clamp: Optional[Tuple[float, float]]) -> None:
    """Refuse MHA's bias_k/bias_v; warn where the clamp would change results (EdgeAttention's docstring)."""
    for name in ("bias_k", "bias_v"):
        if prefix + name in state_dict:
            raise ValueError(
                f"state dict key {prefix + name!r} comes from an nn.MultiheadAttention with add_bias_kv=True: "
                "its learned key/value row has no counterpart in EdgeAttention, which attends only along edges"
            )
    if prefix + "in_proj_weight" in state_dict or prefix + "q_proj_weight" in state_dict:
        warn_if_clamp_changes(clamp, local_metadata)


def warn_if_clamp_changes(clamp: Optional[Tuple[float, float]], metadata: dict) -> None:
    """Warn when weights loaded into a module with `clamp` were saved under another clamp, or come
    with a module's metadata but no record of a clamp while this module is in clamp mode (a plain
    dict has no metadata: nothing is known). One text per case: shown once, not per layer."""
    if CLAMP_RECORD not in metadata:
        if clamp is not None and "version" in metadata:  # metadata of a module other than EdgeAttention
            warnings.warn(
                "EdgeAttention.load_state_dict: these weights carry no record of an EdgeAttention's clamp (they "
                "come from nn.MultiheadAttention, or from sparseattn before it kept the record); with this "
                f"module's clamp={clamp} its outputs differ from nn.MultiheadAttention's wherever a scaled score "
                "leaves the clamp: use clamp=None or EdgeAttention.from_multihead_attention",
                stacklevel=4,
            )
        return
    saved = metadata[CLAMP_RECORD]
    saved = tuple(saved) if isinstance(saved, (list, tuple)) else saved
    if saved != clamp:
        warnings.warn(
            f"EdgeAttention.load_state_dict: weights saved with clamp={saved} load into a module with "
            f"clamp={clamp}; outputs change wherever a scaled score lies outside either clamp",
            stacklevel=4,
        )


__all__ = ["CLAMP_RECORD", "check_loading", "from_multihead_attention", "record_clamp", "warn_if_clamp_changes"]
