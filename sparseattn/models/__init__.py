"""Models built only from sparseattn's public API (`EdgeAttention`, `edge_attention`, `graphs`,
`KVCache`/`NodeKV`): the graph Transformer, the Universal Transformer with ACT, decoding, and
the sequence taggers, with the batches they take."""

from .batch import GraphBatch, GraphPool, bucket_batches, token_batches
from .bilstm import BiLSTMTagger
from .blocks import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    PositionalEncoding,
    residual,
    sinusoid,
    source_target_embeddings,
    xavier_init_,
)
from .decoding import beam_search, decode, greedy_decode
from .seq2seq import DecodeState, Seq2SeqModel, Seq2SeqOptions, Seq2SeqOutput
from .tagger import TransformerTagger
from .token_features import CAPS_CLASSES, IGNORE, Tagger, TaggingBatch, TokenFeatures
from .transformer import GraphTransformer
from .universal import UniversalTransformer

__all__ = [
    "GraphBatch",
    "GraphPool",
    "bucket_batches",
    "token_batches",
    "EncoderLayer",
    "DecoderLayer",
    "FeedForward",
    "PositionalEncoding",
    "residual",
    "sinusoid",
    "source_target_embeddings",
    "xavier_init_",
    "GraphTransformer",
    "UniversalTransformer",
    "Seq2SeqModel",
    "Seq2SeqOptions",
    "Seq2SeqOutput",
    "DecodeState",
    "greedy_decode",
    "beam_search",
    "decode",
    "TransformerTagger",
    "BiLSTMTagger",
    "Tagger",
    "TokenFeatures",
    "TaggingBatch",
    "CAPS_CLASSES",
    "IGNORE",
]
