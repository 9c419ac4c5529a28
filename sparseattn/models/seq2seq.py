"""What the graph Transformer and the Universal Transformer share: embeddings, positions, output
layer, the forward's output type and the state of incremental decoding.

Shapes: N_enc source tokens, N_dec decoder tokens, Nh hypotheses, d = d_model, V vocabulary.
Decoding (decoding.py) drives any `Seq2SeqModel` through
    state = model.start_decoding(batch, hyp_sent)   encode once; hypothesis h continues sentence hyp_sent[h]
    logp = model.decode_next(state, tokens)         (Nh,) last tokens -> (Nh, V) next-token log-probabilities
    model.reorder_state(state, index)               keep hypotheses `index` (beam reordering, pruning)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple, TypedDict

import torch
from torch import Tensor, nn

from .. import EdgeAttention, Graph, KeyValue, KVCache, graphs
from .batch import GraphBatch
from .blocks import DecoderLayer, Embeddings, EncoderLayer, PositionalEncoding, source_target_embeddings, xavier_init_

NewEncoderLayer = Callable[[], EncoderLayer]  # a new layer of the model's widths
NewDecoderLayer = Callable[[], DecoderLayer]


class Seq2SeqOptions(TypedDict, total=False):
    """The keyword arguments every encoder-decoder model passes on to `Seq2SeqModel` unchanged
    (defaults: `Seq2SeqModel`'s).

    share_embeddings: one embedding table for source and target (needs equal vocabularies).
    tie_generator: the output projection reuses the target embedding matrix.
    clamp: (lo, hi) bounds of the attention scores (DGL's scaled_exp), or None for exact softmax.
    backend: edge-attention backend ("auto", "csr", ...).
    max_len: longest sentence the positional table covers.
    """

    share_embeddings: bool
    tie_generator: bool
    clamp: Optional[Tuple[float, float]]
    backend: str
    max_len: int


class Seq2SeqOutput(NamedTuple):
    """logits: (N_dec, V) unnormalised scores; aux_loss: scalar added to the training loss
    (ACT ponder cost for the UT, 0 otherwise); stats: extra numbers to log (e.g. ACT steps)."""

    logits: Tensor
    aux_loss: Tensor
    stats: Dict[str, object]


def cross_graph_for_hyps(src_ptr: Tensor, src_lens: Tensor, hyp_sent: Tensor, steps: int, num_src: int) -> Graph:
    """Complete bipartite graph from each hypothesis' source sentence into its `steps` decoder
    nodes (hypothesis-major: hyp h owns nodes h*steps .. h*steps+steps-1), destination-major.
    src_ptr/src_lens: (B,) start and length of each sentence's encoder nodes; hyp_sent: (Nh,).
    Built without validation (`graphs.from_row_pointers(..., validate=False)`); its blocks are
    the ones a validated `Graph` would detect on first use (runs of hypotheses reading one
    sentence), found at once."""
    n = src_lens[hyp_sent].repeat_interleave(steps)  # sources per destination, (Nh*steps,)
    start = src_ptr[hyp_sent].repeat_interleave(steps)
    ptr = torch.cat([n.new_zeros(1), torch.cumsum(n, 0)])  # (Nh*steps + 1,) first edge of each destination
    num_edges = int(ptr[-1])
    src = (start - ptr[:-1]).repeat_interleave(n, output_size=num_edges) + torch.arange(num_edges, device=n.device)
    return graphs.from_row_pointers(ptr, src, num_src, validate=False)


@dataclass
class DecodeState:
    """What incremental decoding carries between steps."""

    memory: Tensor  # (N_enc, d)
    src_ptr: Tensor  # (B,) first encoder node of each sentence
    src_lens: Tensor  # (B,)
    hyp_sent: Tensor  # (Nh,) sentence of each hypothesis
    memory_kv: List[KeyValue]  # per decoder layer: cross-attention keys/values of the memory
    step: int = 0  # tokens fed so far
    caches: List[KVCache] = field(default_factory=list)  # per decoder layer (models that cache)
    prefix: Optional[Tensor] = None  # (Nh, t) tokens fed so far (models that recompute)
    _one_step_graph: Optional[Graph] = None

    def cross_graph(self, steps: int = 1) -> Graph:
        """Each hypothesis' source sentence into its `steps` decoder nodes (steps=1: cached until
        the hypotheses change)."""
        if steps == 1 and self._one_step_graph is not None:
            return self._one_step_graph
        g = cross_graph_for_hyps(self.src_ptr, self.src_lens, self.hyp_sent, steps, self.memory.shape[0])
        if steps == 1:
            self._one_step_graph = g
        return g


class Seq2SeqModel(nn.Module):
    """Base of the encoder-decoder models, and their one constructor: source/target embeddings
    (optionally shared), sinusoidal positions, dropout, the layer stacks (`build_stacks`, each
    model's own), final LayerNorms, generator (optionally tied to the target embedding), then Xavier
    init of every matrix. Subclasses implement build_stacks, encode, forward, decode_next and
    `decoder_cross_attentions` (for start_decoding).

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        d_model, num_heads, d_ff: widths of every layer.
        dropout: on embeddings, sublayer outputs, attention weights and the feed-forward.
        share_embeddings, tie_generator, clamp, backend, max_len: see `Seq2SeqOptions`.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        share_embeddings: bool = False,
        tie_generator: bool = False,
        clamp: Optional[Tuple[float, float]] = (-5.0, 5.0),
        backend: str = "auto",
        max_len: int = 1024,
    ) -> None:
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.src_embed: nn.Module
        self.tgt_embed: Embeddings
        self.src_embed, self.tgt_embed = source_target_embeddings(
            src_vocab_size, tgt_vocab_size, d_model, share_embeddings
        )
        self.pos_enc = PositionalEncoding(d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.build_stacks(
            lambda: EncoderLayer(d_model, num_heads, d_ff, dropout, clamp=clamp, backend=backend),
            lambda: DecoderLayer(d_model, num_heads, d_ff, dropout, clamp=clamp, backend=backend),
        )
        self.enc_norm, self.dec_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if tie_generator:
            self.generator.weight = self.tgt_embed.lut.weight
        xavier_init_(self)

    def build_stacks(self, new_encoder_layer: NewEncoderLayer, new_decoder_layer: NewDecoderLayer) -> None:
        """Register the encoder and decoder layers (and whatever else the model adds between the
        embeddings and the final norms), made by calling the two factories."""
        raise NotImplementedError

    def encode(self, batch: GraphBatch) -> Tensor:
        """Source tokens (N_enc,) along batch.enc_graph -> memory (N_enc, d_model)."""
        raise NotImplementedError

    def decoder_cross_attentions(self) -> List[EdgeAttention]:
        """The decoder's cross attentions, whose keys and values `start_decoding` projects once."""
        raise NotImplementedError

    def start_decoding(self, batch: GraphBatch, hyp_sent: Tensor) -> DecodeState:
        """Encode the sources once and project the memory once per decoder layer."""
        memory = self.encode(batch)
        lens = torch.tensor(batch.src_lens, device=memory.device)
        memory_kv = [attn.project_kv(memory) for attn in self.decoder_cross_attentions()]
        return DecodeState(memory, torch.cumsum(lens, 0) - lens, lens, hyp_sent, memory_kv)

    def reorder_state(self, state: DecodeState, index: Tensor) -> None:
        """Keep hypotheses `index` (Nh',) in that order (beam search); same sentences only."""
        state.hyp_sent = state.hyp_sent[index]
        state._one_step_graph = None
        for cache in state.caches:
            cache.reorder(index)
        if state.prefix is not None:
            state.prefix = state.prefix[index]

    def decode_next(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed one token per hypothesis, (Nh,) -> log-probabilities of the next, (Nh, V)."""
        raise NotImplementedError
