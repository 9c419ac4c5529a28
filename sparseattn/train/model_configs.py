"""The models `sparseattn train --model NAME` builds, each with its config dataclass.

Extension point: `register_model("name", Config)` with a dataclass whose `build(info)` returns the
model; `info` is what the task tells models (`Task.model_info()`: vocabulary sizes, ...). The model
config is saved in checkpoints, so `evaluate`/`plot` rebuild the model from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
from torch import nn

from .. import backend_names, max_clamp_bound
from ..kernels import available_backends, backends_for
from ..models import BiLSTMTagger, GraphTransformer, TransformerTagger, UniversalTransformer
from .config import MODEL_CONFIGS, Clamp, at_least, cfg_field, in_range, one_of


def register_model(name: str, config: type) -> None:
    MODEL_CONFIGS[name] = config


def _positive(v: Any) -> Optional[str]:
    return None if v >= 1 else "must be >= 1"


MAX_WIDTH = 1 << 16  # widths beyond this are typos: one d_model x d_model matrix would need 16 GiB


def _width(v: Any) -> Optional[str]:
    return None if 1 <= v <= MAX_WIDTH else f"must be in [1, {MAX_WIDTH}]"


def _count(v: Any) -> Optional[str]:
    return None if 1 <= v <= 1024 else "must be in [1, 1024]"


@dataclass
class AttentionStackConfig:
    """What every model made of EdgeAttention layers has: depth, widths, dropout, clamp, backend."""

    num_layers: int = cfg_field(1, "layers (per stack: encoder and decoder each)", check=_count)
    d_model: int = cfg_field(128, "model width", check=_width)
    num_heads: int = cfg_field(1, "attention heads (must divide d_model)", check=_positive)
    d_ff: int = cfg_field(128, "feed-forward hidden width", check=_width)
    dropout: float = cfg_field(
        0.1,
        "dropout of sublayer outputs, attention weights, the feed-forward (and embeddings)",
        check=in_range(0, 1, hi_open=True),
    )
    clamp: Clamp = cfg_field(
        (-5.0, 5.0), "attention score bounds 'lo,hi' (exp of the clamped score), or 'none' for exact softmax"
    )
    backend: str = cfg_field("auto", "edge-attention backend", check=one_of(*backend_names()))

    def validate(self, cfg) -> None:
        """What would otherwise fail at the first forward, after the run folder is written."""
        if self.d_model % self.num_heads:
            raise ValueError(f"--num_heads={self.num_heads} must divide --d_model={self.d_model}")
        bound = max_clamp_bound(torch.float32)  # training runs in float32 (bfloat16 autocast on CUDA)
        if self.clamp is not None and max(-self.clamp[0], self.clamp[1]) > bound:
            raise ValueError(
                f"--clamp={self.clamp[0]:g},{self.clamp[1]:g}: bounds must lie in [-{bound:g}, {bound:g}] "
                "(exp of a larger bound overflows float32 sums), or use --clamp=none for exact softmax"
            )
        device = "cuda" if cfg.run.device == "auto" and torch.cuda.is_available() else cfg.run.device
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        if self.backend != "auto" and self.backend not in backends_for(device_type):
            why = "is not available here" if self.backend not in available_backends() else f"does not run on {device}"
            raise ValueError(
                f"--backend={self.backend} {why} (backends for {device_type}: "
                f"{', '.join(backends_for(device_type))}); use --backend=auto"
            )


@dataclass
class TransformerConfig(AttentionStackConfig):
    """The graph Transformer (`sparseattn.models.GraphTransformer`)."""

    share_embeddings: bool = cfg_field(
        True, "one embedding table for source and target when their vocabularies are equal"
    )
    tie_generator: bool = cfg_field(False, "the output layer reuses the target embedding matrix")

    def common(self, info: Dict[str, Any]) -> Dict[str, Any]:
        return dict(
            src_vocab_size=info["src_vocab_size"],
            tgt_vocab_size=info["tgt_vocab_size"],
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            clamp=self.clamp,
            backend=self.backend,
            tie_generator=self.tie_generator,
            share_embeddings=bool(self.share_embeddings and info.get("shared_vocab", False)),
        )

    def build(self, info: Dict[str, Any]) -> nn.Module:
        return GraphTransformer(num_layers=self.num_layers, **self.common(info))


@dataclass
class UniversalConfig(TransformerConfig):
    """The Universal Transformer with ACT (`sparseattn.models.UniversalTransformer`); num_layers is unused."""

    num_heads: int = cfg_field(4, "attention heads (must divide d_model)", check=_positive)
    d_ff: int = cfg_field(512, "feed-forward hidden width", check=_positive)
    act_max_steps: int = cfg_field(8, "ACT: most steps per token", check=_count)
    act_threshold: float = cfg_field(
        0.99,
        "ACT: halt when the summed halting probability reaches this",
        check=lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
    )
    act_loss_weight: float = cfg_field(0.01, "ACT: weight of the ponder cost", check=at_least(0))

    def build(self, info: Dict[str, Any]) -> nn.Module:
        return UniversalTransformer(
            max_steps=self.act_max_steps,
            threshold=self.act_threshold,
            act_loss_weight=self.act_loss_weight,
            **self.common(info),
        )


@dataclass
class TokenFeatureConfig:
    """Token features of both taggers: lowercased word, POS tag, capitalization, character CNN."""

    word_dim: int = cfg_field(100, "word embedding size", check=_width)
    pos_dim: int = cfg_field(25, "POS tag embedding size (0: none)", check=at_least(0))
    caps_dim: int = cfg_field(5, "capitalization-class embedding size (0: none)", check=at_least(0))
    use_chars: bool = cfg_field(True, "add a character CNN")
    char_out: int = cfg_field(50, "character CNN output size", check=_width)
    input_dropout: float = cfg_field(0.2, "dropout on the concatenated features", check=in_range(0, 1, hi_open=True))
    word_dropout: float = cfg_field(
        0.05, "training words replaced by <unk> with this probability", check=in_range(0, 1, hi_open=True)
    )

    def features(self) -> Dict[str, Any]:
        return dict(
            word_dim=self.word_dim,
            pos_dim=self.pos_dim,
            caps_dim=self.caps_dim,
            use_chars=self.use_chars,
            char_out=self.char_out,
            dropout=self.input_dropout,
            word_dropout=self.word_dropout,
        )


@dataclass
class TaggerConfig(AttentionStackConfig, TokenFeatureConfig):
    """The Transformer tagger (`sparseattn.models.TransformerTagger`)."""

    ffn: str = cfg_field(
        "linear", "feed-forward: linear, or conv (width 3 within each sentence)", check=one_of("linear", "conv")
    )
    window: int = cfg_field(0, "attention graph: 0 complete per sentence, r: only |i - j| <= r", check=at_least(0))
    rel_pos: int = cfg_field(0, "clip distance of a learned relative-position bias; 0: none", check=at_least(0))

    def build(self, info: Dict[str, Any]) -> nn.Module:
        return TransformerTagger(
            **info,
            dim=self.d_model,
            heads=self.num_heads,
            layers=self.num_layers,
            ffn_dim=self.d_ff,
            ffn=self.ffn,
            window=self.window or None,
            rel_pos=self.rel_pos,
            dropout=self.dropout,
            clamp=self.clamp,
            backend=self.backend,
            features=self.features(),
        )


@dataclass
class BiLSTMConfig(TokenFeatureConfig):
    """The BiLSTM tagger baseline (`sparseattn.models.BiLSTMTagger`)."""

    lstm_hidden: int = cfg_field(200, "units per direction", check=_width)
    lstm_layers: int = cfg_field(1, "stacked layers", check=_count)
    lstm_dropout: float = cfg_field(
        0.3, "dropout between layers and before the classifier", check=in_range(0, 1, hi_open=True)
    )

    def validate(self, cfg) -> None:
        if not cfg.run.lr_dim:
            raise ValueError("model bilstm has no d_model: set --lr_dim for the Noam schedule (the preset uses 128)")

    def build(self, info: Dict[str, Any]) -> nn.Module:
        return BiLSTMTagger(
            **info,
            hidden=self.lstm_hidden,
            layers=self.lstm_layers,
            dropout=self.lstm_dropout,
            features=self.features(),
        )


register_model("transformer", TransformerConfig)
register_model("ut", UniversalConfig)
register_model("tagger", TaggerConfig)
register_model("bilstm", BiLSTMConfig)


def lr_dim(cfg) -> int:
    """The d of the Noam schedule: --lr_dim, else the model's d_model."""
    return cfg.run.lr_dim or cfg.model_cfg.d_model
