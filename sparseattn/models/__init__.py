"""Models on graph batches, and the model registry the training CLI builds them from.

Extension point: `register_model(name, cls, kwargs_from_config)` makes `sparseattn train
--model NAME` build `cls(**kwargs_from_config(cfg, task))`; the kwargs are stored in the
checkpoint, so `model_from_checkpoint` rebuilds the model with no config at hand. A model's
forward(batch) returns whatever its task's `loss` expects (seq2seq: `Seq2SeqOutput`); models
that decode also implement start_decoding / decode_next / reorder_state (see decoding.py).
"""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Tuple

from torch import nn

from .bilstm import BiLSTMTagger
from .decoding import beam_search, decode, greedy_decode
from .layers import AttentionRecorder
from .tagger import TransformerTagger
from .tagging import Tagger, TokenFeatures
from .transformer import GraphTransformer, Seq2SeqOutput
from .universal import UniversalTransformer


class ModelEntry(NamedTuple):
    cls: type
    kwargs_from_config: Callable  # (TrainConfig, Task) -> dict of constructor kwargs


MODELS: Dict[str, ModelEntry] = {}


def register_model(name: str, cls: type, kwargs_from_config: Callable) -> None:
    MODELS[name] = ModelEntry(cls, kwargs_from_config)


def build_model(name: str, cfg, task) -> Tuple[nn.Module, dict]:
    """The registered model `name` for this config and task, and the kwargs that rebuild it."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; registered models: {', '.join(sorted(MODELS))}")
    entry = MODELS[name]
    kwargs = entry.kwargs_from_config(cfg, task)
    return entry.cls(**kwargs), kwargs


def model_from_checkpoint(name: str, kwargs: dict) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"checkpoint needs model {name!r}, which is not registered ({', '.join(sorted(MODELS))})")
    return MODELS[name].cls(**kwargs)


def _seq2seq_kwargs(cfg, task) -> dict:
    info = dict(task.model_kwargs())  # src_vocab_size, tgt_vocab_size, shared_vocab
    shared = info.pop("shared_vocab", False)
    return dict(info, d_model=cfg.d_model, num_heads=cfg.num_heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
                clamp=cfg.clamp if cfg.clamp > 0 else None, backend=cfg.backend,
                share_embeddings=bool(cfg.share_embeddings and shared), tie_generator=cfg.tie_generator)


register_model("transformer", GraphTransformer, lambda cfg, task: dict(_seq2seq_kwargs(cfg, task),
                                                                      num_layers=cfg.num_layers))
register_model("ut", UniversalTransformer, lambda cfg, task: dict(
    _seq2seq_kwargs(cfg, task), max_steps=cfg.act_max_steps, threshold=cfg.act_threshold,
    act_loss_weight=cfg.act_loss_weight))



def _token_features(cfg) -> dict:
    return dict(word_dim=cfg.word_dim, pos_dim=cfg.pos_dim, caps_dim=cfg.caps_dim, use_chars=cfg.use_chars,
                char_out=cfg.char_out, dropout=cfg.input_dropout, word_dropout=cfg.word_dropout)


register_model("tagger", TransformerTagger, lambda cfg, task: dict(
    task.model_kwargs(), dim=cfg.d_model, heads=cfg.num_heads, layers=cfg.num_layers, ffn_dim=cfg.d_ff, ffn=cfg.ffn,
    window=cfg.window or None, rel_pos=cfg.rel_pos, dropout=cfg.dropout,
    clamp=(-cfg.clamp, cfg.clamp) if cfg.clamp > 0 else None, backend=cfg.backend, features=_token_features(cfg)))
register_model("bilstm", BiLSTMTagger, lambda cfg, task: dict(
    task.model_kwargs(), hidden=cfg.lstm_hidden, layers=cfg.lstm_layers, dropout=cfg.lstm_dropout,
    features=_token_features(cfg)))

__all__ = ["TransformerTagger", "BiLSTMTagger", "Tagger", "TokenFeatures",
           "GraphTransformer", "UniversalTransformer", "Seq2SeqOutput", "AttentionRecorder", "greedy_decode",
           "beam_search", "decode", "MODELS", "register_model", "build_model", "model_from_checkpoint"]
