"""UniversalTransformer: one shared encoder layer and one shared decoder layer applied
repeatedly, with Adaptive Computation Time (ACT) deciding per token how many times.

As in the seed (DGL's UTransformer), with its bugs fixed (cross attention has its own
projections and is used; the model can decode). At ACT step t every still-active node gets
x <- dropout(x + pos_enc(position) + time_enc(t)), passes through the shared layer, and a
halting unit p = sigmoid(Linear(LN(x))) (bias initialised to 1) updates
    sum_p += p;  continue while sum_p < threshold (0.99) and t < max_steps - 1 (8 steps at most)
    continuing:  r = 1 - sum_p,  s += p * x          halting:  s += r * x  (r from the previous step)
so each node's weights over its steps sum to exactly 1; the stack output is LN(s). The ACT loss
is act_loss_weight (0.01) * mean(r) over all encoder and decoder nodes.

Halted nodes stop costing compute: queries, the feed-forward and the halting unit run on the
active rows only, and attention runs on `graph.dst_subgraph(active)`, the edges into active
destinations. Halted nodes keep their state and their last keys/values, which active nodes
still attend to.

Shapes as in `GraphTransformer`; forward(batch).stats holds "act_steps_enc" (N_enc,) and
"act_steps_dec" (N_dec,) int64 step counts.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import Graph, graphs
from ..data.batching import GraphBatch
from .layers import (AttentionRecorder, DecoderLayer, EncoderLayer, PositionalEncoding, attend, project_kv, project_q,
                     source_target_embeddings, xavier_init_)
from .transformer import DecodeState, Seq2SeqOutput, cross_graph_for_hyps


class HaltingUnit(nn.Module):
    """p = sigmoid(Linear(LN(x))): (N, d) -> (N,), bias initialised to 1 (start by pondering little)."""

    def __init__(self, d_model: int, bias_init: float = 1.0) -> None:
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(d_model), nn.Linear(d_model, 1)
        self.bias_init = bias_init

    def reset_bias(self) -> None:
        nn.init.constant_(self.linear.bias, self.bias_init)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.linear(self.norm(x))).squeeze(-1)


class UniversalTransformer(nn.Module):
    """Universal Transformer with ACT on graph batches (arguments as `GraphTransformer`, plus
    max_steps, threshold and act_loss_weight; there is one shared layer per stack)."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 128, num_heads: int = 4,
                 d_ff: int = 512, dropout: float = 0.1, max_steps: int = 8, threshold: float = 0.99,
                 act_loss_weight: float = 0.01, share_embeddings: bool = False, tie_generator: bool = False,
                 clamp: Optional[float] = 5.0, backend: str = "auto", max_len: int = 1024) -> None:
        super().__init__()
        attn_kw = dict(clamp=None if clamp is None else (-clamp, clamp), backend=backend)
        self.d_model, self.num_heads = d_model, num_heads
        self.max_steps, self.threshold, self.act_loss_weight = max_steps, threshold, act_loss_weight
        self.src_embed, self.tgt_embed = source_target_embeddings(src_vocab_size, tgt_vocab_size, d_model,
                                                                  share_embeddings)
        self.pos_enc = PositionalEncoding(d_model, max_len)
        self.time_enc = PositionalEncoding(d_model, max_steps)
        self.dropout = nn.Dropout(dropout)
        self.enc_layer = EncoderLayer(d_model, num_heads, d_ff, dropout, **attn_kw)
        self.dec_layer = DecoderLayer(d_model, num_heads, d_ff, dropout, **attn_kw)
        self.halt_enc, self.halt_dec = HaltingUnit(d_model), HaltingUnit(d_model)
        self.enc_norm, self.dec_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if tie_generator:
            self.generator.weight = self.tgt_embed.lut.weight
        xavier_init_(self)
        self.halt_enc.reset_bias()
        self.halt_dec.reset_bias()
        self.trace: Optional[list] = None  # set to [] to record per-step ACT tensors (tests)

    # ---- ACT ----------------------------------------------------------------------------------
    def _act(self, x: Tensor, pos: Tensor, layer_step: Callable[[Tensor, Tensor, Tensor, int], Tensor],
             halt: HaltingUnit, name: str) -> Tuple[Tensor, Tensor, Tensor]:
        """Run `layer_step(x_active, idx, active, t)` until every node halts.
        x: (N, d) embeddings, pos: (N,). Returns s (N, d) weighted states, steps (N,), r (N,)."""
        n = x.shape[0]
        s = torch.zeros_like(x)
        sum_p, r = x.new_zeros(n), x.new_ones(n)
        steps = torch.zeros(n, dtype=torch.long, device=x.device)
        active = torch.ones(n, dtype=torch.bool, device=x.device)
        for t in range(self.max_steps):
            idx = active.nonzero().squeeze(1)  # (n_a,) active nodes, only shrinks
            if idx.numel() == 0:
                break
            time = self.time_enc(torch.full((1,), t, dtype=torch.long, device=x.device))  # (1, d)
            xa = self.dropout(x[idx] + self.pos_enc(pos[idx]) + time)  # (n_a, d)
            xa = layer_step(xa, idx, active, t)
            p = halt(xa)  # (n_a,)
            sp = sum_p[idx] + p
            cont = sp < self.threshold if t < self.max_steps - 1 else torch.zeros_like(sp, dtype=torch.bool)
            r_a = torch.where(cont, 1.0 - sp, r[idx])
            weight = torch.where(cont, p, r_a)  # this step's share of the output
            s = s.index_copy(0, idx, s[idx] + weight[:, None] * xa)
            sum_p, r = sum_p.index_copy(0, idx, sp), r.index_copy(0, idx, r_a)
            x = x.index_copy(0, idx, xa)
            steps = steps.index_add(0, idx, torch.ones_like(idx))
            if self.trace is not None:
                self.trace.append(dict(name=name, t=t, idx=idx, weight=weight.detach(), x=x.detach(),
                                       active=active.clone()))
            active = active.clone()
            active[idx] = cont
        return s, steps, r

    def _self_attention_step(self, attn, norm: nn.Module, graph: Graph, kv: list, record, kind: str):
        """Self-attention of the active nodes; kv holds every node's latest (k, v), updated in place."""
        def step(xa: Tensor, idx: Tensor, active: Tensor, t: int) -> Tensor:
            h = norm(xa)
            q = project_q(attn, h)  # (n_a, H, D)
            k, v = project_kv(attn, h)
            kv[0] = k if kv[0] is None else kv[0].index_copy(0, idx, k)  # (N, H, D): halted keep theirs
            kv[1] = v if kv[1] is None else kv[1].index_copy(0, idx, v)
            q_all = q.new_zeros(graph.num_dst, *q.shape[1:]).index_copy(0, idx, q)
            return _attend_active(attn, q_all, kv[0], kv[1], graph, active, idx, record, kind, t)
        return step

    def encode_with_stats(self, batch: GraphBatch, record: Optional[AttentionRecorder] = None):
        layer, kv = self.enc_layer, [None, None]
        attn_step = self._self_attention_step(layer.self_attn, layer.norm1, batch.enc_graph, kv, record, "encoder")

        def step(xa, idx, active, t):
            xa = xa + layer.dropout(attn_step(xa, idx, active, t))
            return xa + layer.dropout(layer.ff(layer.norm2(xa)))

        s, steps, r = self._act(self.src_embed(batch.src), batch.src_pos, step, self.halt_enc, "enc")
        return self.enc_norm(s), steps, r

    def encode(self, batch: GraphBatch, record: Optional[AttentionRecorder] = None) -> Tensor:
        return self.encode_with_stats(batch, record)[0]

    def _decode(self, memory_kv: Tuple[Tensor, Tensor], tgt_in: Tensor, tgt_pos: Tensor, dec_graph: Graph,
                cross_graph: Graph, record: Optional[AttentionRecorder] = None):
        layer, kv = self.dec_layer, [None, None]
        attn_step = self._self_attention_step(layer.self_attn, layer.norm1, dec_graph, kv, record, "decoder")

        def step(xa, idx, active, t):
            xa = xa + layer.dropout(attn_step(xa, idx, active, t))
            q = project_q(layer.cross_attn, layer.norm2(xa))
            q_all = q.new_zeros(cross_graph.num_dst, *q.shape[1:]).index_copy(0, idx, q)
            o = _attend_active(layer.cross_attn, q_all, *memory_kv, cross_graph, active, idx, record, "cross", t)
            xa = xa + layer.dropout(o)
            return xa + layer.dropout(layer.ff(layer.norm3(xa)))

        s, steps, r = self._act(self.tgt_embed(tgt_in), tgt_pos, step, self.halt_dec, "dec")
        return self.dec_norm(s), steps, r

    def decode(self, memory: Tensor, batch: GraphBatch, record: Optional[AttentionRecorder] = None) -> Tensor:
        kv = project_kv(self.dec_layer.cross_attn, memory)  # memory is fixed: project once for all steps
        return self._decode(kv, batch.tgt_in, batch.tgt_pos, batch.dec_graph, batch.cross_graph, record)[0]

    def forward(self, batch: GraphBatch, record: Optional[AttentionRecorder] = None) -> Seq2SeqOutput:
        memory, enc_steps, enc_r = self.encode_with_stats(batch, record)
        kv = project_kv(self.dec_layer.cross_attn, memory)
        states, dec_steps, dec_r = self._decode(kv, batch.tgt_in, batch.tgt_pos, batch.dec_graph,
                                                batch.cross_graph, record)
        act_loss = self.act_loss_weight * torch.cat([enc_r, dec_r]).mean()
        stats: Dict[str, object] = {"act_steps_enc": enc_steps, "act_steps_dec": dec_steps}
        return Seq2SeqOutput(self.generator(states), act_loss, stats)

    # ---- decoding: the decoder is recomputed on the prefix (ACT makes every step's depth differ) --
    def start_decoding(self, batch: GraphBatch, hyp_sent: Tensor) -> DecodeState:
        memory = self.encode(batch)
        lens = torch.tensor(batch.src_lens, device=memory.device)
        state = DecodeState(memory, torch.cumsum(lens, 0) - lens, lens, hyp_sent)
        state.cross_kv = [project_kv(self.dec_layer.cross_attn, memory)]
        state.prefix = torch.zeros(hyp_sent.numel(), 0, dtype=torch.long, device=memory.device)
        return state

    def decode_next(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed one token per hypothesis, (Nh,) -> log-probabilities of the next, (Nh, V)."""
        state.prefix = torch.cat([state.prefix, tokens[:, None]], 1)  # (Nh, t+1)
        nh, m = state.prefix.shape
        dec_graph = graphs.batch([graphs.causal(m, device=tokens.device)] * nh)
        cross = cross_graph_for_hyps(state.src_ptr, state.src_lens, state.hyp_sent, m, state.memory.shape[0])
        pos = torch.arange(m, device=tokens.device).repeat(nh)
        states = self._decode(state.cross_kv[0], state.prefix.flatten(), pos, dec_graph, cross)[0]
        last = states.reshape(nh, m, -1)[:, -1]  # (Nh, d)
        state.step += 1
        return F.log_softmax(self.generator(last), dim=-1)

    def reorder_state(self, state: DecodeState, index: Tensor) -> None:
        state.hyp_sent = state.hyp_sent[index]
        state.prefix = state.prefix[index]


def _attend_active(attn, q_all: Tensor, k: Tensor, v: Tensor, graph: Graph, active: Tensor, idx: Tensor,
                   record: Optional[AttentionRecorder], kind: str, t: int) -> Tensor:
    """Attention along the edges into active destinations only; returns the active rows (n_a, d)."""
    sub = graph.dst_subgraph(active)
    if record is None:
        return attend(attn, q_all, k, v, sub, rows=idx)
    out, w = attend(attn, q_all, k, v, sub, return_weights=True, rows=idx)
    record.add(kind, t, sub, w)
    return out
