"""UniversalTransformer: one shared encoder layer and one shared decoder layer applied
repeatedly, with Adaptive Computation Time (ACT) deciding per token how many times.

As in DGL's UTransformer example, with cross attention that has its own projections and a
model that can decode. At ACT step t every still-active node gets
x <- dropout(x + pos_enc(position) + time_enc(t)), passes through the shared layer, and a
halting unit p = sigmoid(Linear(LN(x))) (bias initialised to 1) updates
    sum_p += p;  continue while sum_p < threshold (0.99) and t < max_steps - 1 (8 steps at most)
    continuing:  r = 1 - sum_p,  s += p * x          halting:  s += r * x  (r from the previous step)
so each node's weights over its steps sum to exactly 1; the stack output is LN(s). The ACT loss
is act_loss_weight (0.01) * mean(r) over all encoder and decoder nodes.

Halted nodes stop costing compute: the layers run with `rows=` the active nodes, so queries, the
feed-forward and the halting unit see the active rows only and attention runs along the edges
into them. Halted nodes keep their state and their last keys and values (a `NodeKV`), which
active nodes still attend to. The layers are the `EncoderLayer`/`DecoderLayer` of
`GraphTransformer`, shared across steps.

Shapes as in `GraphTransformer`; forward(batch).stats holds "act_steps_enc" (N_enc,) and
"act_steps_dec" (N_dec,) int64 step counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import EdgeAttention, Graph, KeyValue, NodeKV, graphs
from .batch import GraphBatch
from .blocks import PositionalEncoding
from .seq2seq import (
    DecodeState,
    NewDecoderLayer,
    NewEncoderLayer,
    Seq2SeqModel,
    Seq2SeqOptions,
    Seq2SeqOutput,
    cross_graph_for_hyps,
)

if TYPE_CHECKING:
    from typing import Unpack


class HaltingUnit(nn.Module):
    """p = sigmoid(Linear(LN(x))): (N, d) -> (N,), bias initialised to 1 (start by pondering little)."""

    def __init__(self, d_model: int, bias_init: float = 1.0) -> None:
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(d_model), nn.Linear(d_model, 1)
        self.bias_init = bias_init

    def reset_bias(self) -> None:
        nn.init.constant_(self.linear.bias, self.bias_init)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, d) -> halting probabilities (N,), sigmoid(Linear(LN(x)))."""
        return torch.sigmoid(self.linear(self.norm(x))).squeeze(-1)


LayerStep = Callable[[Tensor, Tensor], Tensor]  # (x of the active rows (R, d), their ids (R,)) -> (R, d)


class UniversalTransformer(Seq2SeqModel):
    """Universal Transformer with ACT on graph batches (arguments as `GraphTransformer`, less
    num_layers: there is one shared layer per stack; plus max_steps, threshold and act_loss_weight)."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 128,
        num_heads: int = 4,
        d_ff: int = 512,
        dropout: float = 0.1,
        max_steps: int = 8,
        threshold: float = 0.99,
        act_loss_weight: float = 0.01,
        **options: Unpack[Seq2SeqOptions],
    ) -> None:
        self.max_steps, self.threshold, self.act_loss_weight = max_steps, threshold, act_loss_weight
        super().__init__(
            src_vocab_size, tgt_vocab_size, d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout, **options
        )
        self.halt_enc.reset_bias()
        self.halt_dec.reset_bias()
        self.trace: Optional[list] = None  # set to [] to record per-step ACT tensors (tests)

    def build_stacks(self, new_encoder_layer: NewEncoderLayer, new_decoder_layer: NewDecoderLayer) -> None:
        """The time encoding, one shared encoder and one shared decoder layer, and their halting units."""
        self.time_enc = PositionalEncoding(self.d_model, self.max_steps)
        self.enc_layer, self.dec_layer = new_encoder_layer(), new_decoder_layer()
        self.halt_enc, self.halt_dec = HaltingUnit(self.d_model), HaltingUnit(self.d_model)

    # ---- ACT ----------------------------------------------------------------------------------
    def _act(
        self, x: Tensor, pos: Tensor, layer_step: LayerStep, halt: HaltingUnit, name: str
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """Run `layer_step(x_active, active_ids)` until every node halts.
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
            xa = layer_step(xa, idx)
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
                self.trace.append(
                    dict(name=name, t=t, idx=idx, weight=weight.detach(), x=x.detach(), active=active.clone())
                )
            active = active.clone()
            active[idx] = cont
        return s, steps, r

    def encode_with_stats(self, batch: GraphBatch) -> Tuple[Tensor, Tensor, Tensor]:
        """(memory (N_enc, d), ACT steps (N_enc,), remainders (N_enc,))."""
        kv = NodeKV()
        step = lambda xa, idx: self.enc_layer(xa, batch.enc_graph, cache=kv, rows=idx)  # noqa: E731
        s, steps, r = self._act(self.src_embed(batch.src), batch.src_pos, step, self.halt_enc, "enc")
        return self.enc_norm(s), steps, r

    def encode(self, batch: GraphBatch) -> Tensor:
        """The shared encoder layer with ACT: source tokens (N_enc,) -> memory (N_enc, d_model)."""
        return self.encode_with_stats(batch)[0]

    def _decode(
        self, memory_kv: KeyValue, tgt_in: Tensor, tgt_pos: Tensor, dec_graph: Graph, cross_graph: Graph
    ) -> Tuple[Tensor, Tensor, Tensor]:
        kv = NodeKV()
        step = lambda xa, idx: self.dec_layer(xa, dec_graph, cross_graph, memory_kv, cache=kv, rows=idx)  # noqa: E731
        s, steps, r = self._act(self.tgt_embed(tgt_in), tgt_pos, step, self.halt_dec, "dec")
        return self.dec_norm(s), steps, r

    def decode(self, memory: Tensor, batch: GraphBatch) -> Tensor:
        """The shared decoder layer with ACT, teacher-forced: memory (N_enc, d_model) and
        batch.tgt_in (N_dec,) -> decoder states (N_dec, d_model), before the generator."""
        kv = self.dec_layer.cross_attn.project_kv(memory)  # memory is fixed: project once for all steps
        return self._decode(kv, batch.tgt_in, batch.tgt_pos, *batch.target_graphs())[0]

    def forward(self, batch: GraphBatch) -> Seq2SeqOutput:
        """Teacher-forced logits (N_dec, tgt_vocab), the weighted ACT loss (remainders) as aux_loss,
        and stats "act_steps_enc" (N_enc,) and "act_steps_dec" (N_dec,): the steps each token took."""
        memory, enc_steps, enc_r = self.encode_with_stats(batch)
        kv = self.dec_layer.cross_attn.project_kv(memory)
        states, dec_steps, dec_r = self._decode(kv, batch.tgt_in, batch.tgt_pos, *batch.target_graphs())
        act_loss = self.act_loss_weight * torch.cat([enc_r, dec_r]).mean()
        stats: Dict[str, object] = {"act_steps_enc": enc_steps, "act_steps_dec": dec_steps}
        return Seq2SeqOutput(self.generator(states), act_loss, stats)

    # ---- decoding: the decoder is recomputed on the prefix (ACT makes every step's depth differ) --
    def decoder_cross_attentions(self) -> List[EdgeAttention]:
        """The shared decoder layer's cross attention (one for every step)."""
        return [self.dec_layer.cross_attn]

    def start_decoding(self, batch: GraphBatch, hyp_sent: Tensor) -> DecodeState:
        """Encode a source-only batch once; hyp_sent: (Nh,) the source sentence of each hypothesis.
        The decoder is recomputed on each hypothesis' prefix at every step (ACT halts per node)."""
        state = super().start_decoding(batch, hyp_sent)
        state.prefix = torch.zeros(hyp_sent.numel(), 0, dtype=torch.long, device=state.memory.device)
        return state

    def decode_next(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed one token per hypothesis, (Nh,) -> log-probabilities of the next, (Nh, V)."""
        assert state.prefix is not None, "start_decoding sets the prefix"
        state.prefix = torch.cat([state.prefix, tokens[:, None]], 1)  # (Nh, t+1)
        nh, m = state.prefix.shape
        dec_graph = graphs.batch([graphs.causal(m, device=tokens.device)] * nh)
        cross = cross_graph_for_hyps(state.src_ptr, state.src_lens, state.hyp_sent, m, state.memory.shape[0])
        pos = torch.arange(m, device=tokens.device).repeat(nh)
        states = self._decode(state.memory_kv[0], state.prefix.flatten(), pos, dec_graph, cross)[0]
        last = states.reshape(nh, m, -1)[:, -1]  # (Nh, d)
        state.step += 1
        return F.log_softmax(self.generator(last), dim=-1)
