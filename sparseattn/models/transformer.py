"""GraphTransformer: an encoder-decoder Transformer whose attention runs along graph edges.

The seed's architecture (DGL's "Transformer as a GNN") with pre-norm sublayers
x + dropout(f(LN(x))), a final LayerNorm on each stack, sinusoidal positions, embeddings
scaled by sqrt(d_model), Xavier init, and optional shared source/target/generator weights.
A batch is a `GraphBatch` (three block-diagonal graphs), so there is no padding and no mask.

Shapes: N_enc source tokens, N_dec decoder tokens, d = d_model, V vocabulary.
    encode(batch)            -> memory (N_enc, d)
    decode(memory, batch)    -> states (N_dec, d)
    forward(batch)           -> Seq2SeqOutput(logits (N_dec, V_tgt), aux_loss 0, stats {})
Incremental decoding (models/decoding.py) uses start_decoding / decode_next / reorder_state:
each step adds one decoder node per hypothesis and attends along a one-row causal graph to the
cached keys and values of all earlier steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import Graph
from ..data.batching import GraphBatch
from .layers import (AttentionRecorder, DecoderLayer, EncoderLayer, PositionalEncoding, attend, project_kv, project_q,
                     source_target_embeddings, xavier_init_)


class Seq2SeqOutput(NamedTuple):
    """logits: (N_dec, V) unnormalised scores; aux_loss: scalar added to the training loss
    (ACT ponder cost for the UT, 0 otherwise); stats: extra numbers to log (e.g. ACT steps)."""

    logits: Tensor
    aux_loss: Tensor
    stats: Dict[str, object]


def cross_graph_for_hyps(src_ptr: Tensor, src_lens: Tensor, hyp_sent: Tensor, steps: int, num_src: int) -> Graph:
    """Complete bipartite graph from each hypothesis' source sentence into its `steps` decoder
    nodes (hypothesis-major: hyp h owns nodes h*steps .. h*steps+steps-1), destination-major.
    src_ptr/src_lens: (B,) start and length of each sentence's encoder nodes; hyp_sent: (Nh,)."""
    n = src_lens[hyp_sent].repeat_interleave(steps)  # sources per destination, (Nh*steps,)
    start = src_ptr[hyp_sent].repeat_interleave(steps)
    dst = torch.arange(n.numel(), device=n.device).repeat_interleave(n)
    first = torch.cumsum(n, 0) - n  # first edge of each destination
    src = start.repeat_interleave(n) + torch.arange(dst.numel(), device=n.device) - first.repeat_interleave(n)
    return Graph(torch.stack([src, dst]), num_src=num_src, num_dst=n.numel())


@dataclass
class DecodeState:
    """What incremental decoding carries between steps (see GraphTransformer.decode_next)."""

    memory: Tensor                     # (N_enc, d)
    src_ptr: Tensor                    # (B,) first encoder node of each sentence
    src_lens: Tensor                   # (B,)
    hyp_sent: Tensor                   # (Nh,) sentence of each hypothesis
    step: int = 0                      # tokens fed so far
    cache: Optional[list] = None       # per decoder layer: [k (Nh, t, H, D), v (Nh, t, H, D)]
    cross_kv: Optional[list] = None    # per decoder layer: (k, v) of the memory, (N_enc, H, D)
    cross_graph: Optional[Graph] = None
    prefix: Optional[Tensor] = None    # (Nh, t) tokens fed so far (models that recompute)


class GraphTransformer(nn.Module):
    """Encoder-decoder Transformer on graph batches.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        num_layers: encoder and decoder layers each. d_model, num_heads, d_ff: widths.
        dropout: on embeddings, sublayer outputs, attention weights and the feed-forward.
        share_embeddings: one embedding table for source and target (needs equal vocabularies).
        tie_generator: the output projection reuses the target embedding matrix.
        clamp: score clamp c (scores limited to [-c, c], the seed's scaled_exp), or None for exact softmax.
        backend: edge-attention backend ("auto", "reference", ...).
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, num_layers: int = 1, d_model: int = 128,
                 num_heads: int = 1, d_ff: int = 128, dropout: float = 0.1, share_embeddings: bool = False,
                 tie_generator: bool = False, clamp: Optional[float] = 5.0, backend: str = "auto",
                 max_len: int = 1024) -> None:
        super().__init__()
        attn_kw = dict(clamp=None if clamp is None else (-clamp, clamp), backend=backend)
        self.d_model, self.num_heads = d_model, num_heads
        self.src_embed, self.tgt_embed = source_target_embeddings(src_vocab_size, tgt_vocab_size, d_model,
                                                                  share_embeddings)
        self.pos_enc = PositionalEncoding(d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, **attn_kw) for _ in range(num_layers))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout, **attn_kw) for _ in range(num_layers))
        self.enc_norm, self.dec_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if tie_generator:
            self.generator.weight = self.tgt_embed.lut.weight
        xavier_init_(self)

    def encode(self, batch: GraphBatch, record: Optional[AttentionRecorder] = None) -> Tensor:
        x = self.dropout(self.src_embed(batch.src) + self.pos_enc(batch.src_pos))  # (N_enc, d)
        for i, layer in enumerate(self.encoder):
            x = layer(x, batch.enc_graph, record, i)
        return self.enc_norm(x)

    def decode(self, memory: Tensor, batch: GraphBatch, record: Optional[AttentionRecorder] = None) -> Tensor:
        x = self.dropout(self.tgt_embed(batch.tgt_in) + self.pos_enc(batch.tgt_pos))  # (N_dec, d)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, batch.dec_graph, batch.cross_graph, record, i)
        return self.dec_norm(x)

    def forward(self, batch: GraphBatch, record: Optional[AttentionRecorder] = None) -> Seq2SeqOutput:
        logits = self.generator(self.decode(self.encode(batch, record), batch, record))
        return Seq2SeqOutput(logits, logits.new_zeros(()), {})

    # ---- incremental decoding ---------------------------------------------------------------
    def start_decoding(self, batch: GraphBatch, hyp_sent: Tensor) -> DecodeState:
        """Encode the sources once; hypothesis h continues sentence hyp_sent[h]."""
        memory = self.encode(batch)
        lens = torch.tensor(batch.src_lens, device=memory.device)
        ptr = torch.cumsum(lens, 0) - lens
        state = DecodeState(memory, ptr, lens, hyp_sent)
        state.cache = [[None, None] for _ in self.decoder]
        state.cross_kv = [project_kv(layer.cross_attn, memory) for layer in self.decoder]
        state.cross_graph = cross_graph_for_hyps(ptr, lens, hyp_sent, 1, memory.shape[0])
        return state

    def decode_next(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed one token per hypothesis, (Nh,) -> log-probabilities of the next, (Nh, V)."""
        nh, t = tokens.shape[0], state.step
        pos = torch.full((nh,), t, dtype=torch.long, device=tokens.device)
        x = self.dropout(self.tgt_embed(tokens) + self.pos_enc(pos))  # (Nh, d)
        # hypothesis h's new node attends to its own t + 1 cached nodes h*(t+1) .. h*(t+1)+t
        dst = torch.arange(nh, device=tokens.device).repeat_interleave(t + 1)
        self_graph = Graph(torch.stack([torch.arange(nh * (t + 1), device=tokens.device), dst]),
                           num_src=nh * (t + 1), num_dst=nh)
        for i, layer in enumerate(self.decoder):
            h = layer.norm1(x)
            q = project_q(layer.self_attn, h)
            k, v = project_kv(layer.self_attn, h)  # (Nh, H, D)
            ck, cv = state.cache[i]
            ck = k[:, None] if ck is None else torch.cat([ck, k[:, None]], 1)  # (Nh, t+1, H, D)
            cv = v[:, None] if cv is None else torch.cat([cv, v[:, None]], 1)
            state.cache[i] = [ck, cv]
            x = x + layer.dropout(attend(layer.self_attn, q, ck.flatten(0, 1), cv.flatten(0, 1), self_graph))
            q = project_q(layer.cross_attn, layer.norm2(x))
            x = x + layer.dropout(attend(layer.cross_attn, q, *state.cross_kv[i], state.cross_graph))
            x = x + layer.dropout(layer.ff(layer.norm3(x)))
        state.step += 1
        return F.log_softmax(self.generator(self.dec_norm(x)), dim=-1)

    def reorder_state(self, state: DecodeState, index: Tensor) -> None:
        """Keep hypotheses `index` (Nh',) in that order (beam search); same sentences only."""
        state.hyp_sent = state.hyp_sent[index]
        state.cache = [[ck[index], cv[index]] for ck, cv in state.cache]
        state.cross_graph = cross_graph_for_hyps(state.src_ptr, state.src_lens, state.hyp_sent, 1,
                                                 state.memory.shape[0])
