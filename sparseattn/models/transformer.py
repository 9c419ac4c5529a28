"""GraphTransformer: an encoder-decoder Transformer whose attention runs along graph edges.

DGL's "Transformer as a GNN" architecture with pre-norm sublayers x + dropout(f(LN(x))), a final
LayerNorm on each stack, sinusoidal positions, embeddings scaled by sqrt(d_model), Xavier init,
and optional shared source/target/generator weights. A batch is a `GraphBatch` (three
block-diagonal graphs), so there is no padding and no mask.

Shapes: N_enc source tokens, N_dec decoder tokens, d = d_model, V vocabulary.
    encode(batch)            -> memory (N_enc, d)
    decode(memory, batch)    -> states (N_dec, d)
    forward(batch)           -> Seq2SeqOutput(logits (N_dec, V_tgt), aux_loss 0, stats {})
Incremental decoding adds one decoder node per hypothesis and step; each layer's self-attention
reads the keys and values of the earlier steps from a `KVCache`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import EdgeAttention, KVCache
from .batch import GraphBatch
from .seq2seq import DecodeState, NewDecoderLayer, NewEncoderLayer, Seq2SeqModel, Seq2SeqOptions, Seq2SeqOutput

if TYPE_CHECKING:
    from typing import Unpack


class GraphTransformer(Seq2SeqModel):
    """Encoder-decoder Transformer on graph batches.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        num_layers: encoder and decoder layers each. d_model, num_heads, d_ff: widths.
        dropout: on embeddings, sublayer outputs, attention weights and the feed-forward.
        options: share_embeddings, tie_generator, clamp, backend, max_len (`Seq2SeqOptions`).
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        num_layers: int = 1,
        d_model: int = 128,
        num_heads: int = 1,
        d_ff: int = 128,
        dropout: float = 0.1,
        **options: Unpack[Seq2SeqOptions],
    ) -> None:
        self.num_layers = num_layers
        super().__init__(
            src_vocab_size, tgt_vocab_size, d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout, **options
        )

    def build_stacks(self, new_encoder_layer: NewEncoderLayer, new_decoder_layer: NewDecoderLayer) -> None:
        """num_layers encoder and num_layers decoder layers (`self.encoder`, `self.decoder`)."""
        self.encoder = nn.ModuleList(new_encoder_layer() for _ in range(self.num_layers))
        self.decoder = nn.ModuleList(new_decoder_layer() for _ in range(self.num_layers))

    def encode(self, batch: GraphBatch) -> Tensor:
        """The encoder stack over batch.enc_graph: source tokens (N_enc,) -> memory (N_enc, d_model)."""
        top = max(batch.src_lens, default=0) - 1  # positions run 0..len-1: known here, no GPU sync
        x = self.dropout(self.src_embed(batch.src) + self.pos_enc(batch.src_pos, top))  # (N_enc, d)
        for layer in self.encoder:
            x = layer(x, batch.enc_graph)
        return self.enc_norm(x)

    def decode(self, memory: Tensor, batch: GraphBatch) -> Tensor:
        """The decoder stack, teacher-forced: memory (N_enc, d_model) and batch.tgt_in (N_dec,) ->
        decoder states (N_dec, d_model), before the generator."""
        top = max(batch.tgt_lens, default=0) - 1
        x = self.dropout(self.tgt_embed(batch.tgt_in) + self.pos_enc(batch.tgt_pos, top))  # (N_dec, d)
        for layer in self.decoder:
            x = layer(x, *batch.target_graphs(), memory)
        return self.dec_norm(x)

    def forward(self, batch: GraphBatch) -> Seq2SeqOutput:
        """Teacher-forced logits (N_dec, tgt_vocab) of a batch with targets; aux_loss 0, no stats."""
        logits = self.generator(self.decode(self.encode(batch), batch))
        return Seq2SeqOutput(logits, logits.new_zeros(()), {})

    def decoder_cross_attentions(self) -> List[EdgeAttention]:
        """Each decoder layer's cross attention, in order (their keys and values of the memory are
        projected once per decoding)."""
        return [layer.cross_attn for layer in self.decoder]  # type: ignore[misc]

    def start_decoding(self, batch: GraphBatch, hyp_sent: Tensor) -> DecodeState:
        """Encode a source-only batch once; hyp_sent: (Nh,) the source sentence of each hypothesis.
        Each decoder layer gets an empty `KVCache` for the steps to come."""
        state = super().start_decoding(batch, hyp_sent)
        state.caches = [KVCache() for _ in self.decoder]
        return state

    def decode_next(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed one token per hypothesis, (Nh,) -> log-probabilities of the next, (Nh, V)."""
        nh = tokens.shape[0]
        pos = torch.full((nh,), state.step, dtype=torch.long, device=tokens.device)
        x = self.dropout(self.tgt_embed(tokens) + self.pos_enc(pos))  # (Nh, d)
        self_graph = state.caches[0].step_graph(nh, tokens.device)  # every earlier step -> the new node
        cross_graph = state.cross_graph()
        for layer, cache, memory_kv in zip(self.decoder, state.caches, state.memory_kv):
            x = layer(x, self_graph, cross_graph, memory_kv, cache=cache)
        state.step += 1
        return F.log_softmax(self.generator(self.dec_norm(x)), dim=-1)
