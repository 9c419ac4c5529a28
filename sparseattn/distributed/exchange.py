"""Halo exchange over torch.distributed and attention on a shard."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, NoReturn, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from .._checks import check_qkv
from ..functional import check_arguments, edge_attention
from . import agreement
from .shard import Shard


class HaloExchange:
    """Trades one shard's halo rows with the other ranks: one `all_to_all_single` per call, sending
    exactly the rows the peers' edges read (`shard.send_index`) and receiving exactly `shard.halo`.
    Backward sends the halo rows' gradients back the same way and adds them into the owners' rows.

    One object serves every layer of a model (the plan is the shard's; the tensors are per call) and
    counts what it moved.

    Args:
        shard: this rank's `Shard`.
        group: the process group (default: the world). A group of its own
            (`dist.new_group()`) keeps the exchange apart from DDP's gradient all-reduces.
        timed: wait at a barrier before each collective and time both, so that `seconds` holds the
            transfer alone and `wait_seconds` the time spent waiting for slower ranks (benchmarks).
        check_each_call: before every forward exchange, the ranks trade a header of a few ints (one
            small `all_gather`) and all raise the same ValueError when their shards are not
            `shards[rank]` of one partition or the tensors' dtypes or trailing shapes differ, rather
            than one rank aborting in the collective or reading rows that were never sent. A rank
            whose own call is wrong (rows, device, a keyword, a shard of another number of parts
            than the group's ranks, a named backend missing there: any error before the exchange)
            sends its header marked failed, and every rank raises one line naming it, instead of
            its peers waiting for it. False checks the first
            call only (after it, such a rank raises alone): under nccl the header is read back to
            the host, a sync per call.

    Counters (this rank, since construction or `reset_counters()`): calls, rows_sent,
    rows_received, bytes_sent, bytes_received (forward and backward together, halo rows only),
    seconds, wait_seconds (with timed=True, the header exchange counts as waiting).
    """

    def __init__(
        self, shard: Shard, group: Optional[Any] = None, *, timed: bool = False, check_each_call: bool = True
    ) -> None:
        if not isinstance(shard, Shard):
            raise TypeError(f"shard must be a sparseattn.distributed.Shard, got {type(shard).__name__}")
        self.shard = shard
        self.group = group
        self.timed = timed
        self.check_each_call = check_each_call
        self._agreed = False  # a header exchange has passed
        self.reset_counters()

    def reset_counters(self) -> None:
        """Zero the traffic counters: `calls`, `rows_sent`/`rows_received`, `bytes_sent`/
        `bytes_received` (forward and backward exchanges of this rank) and `seconds`/`wait_seconds`."""
        self.calls = 0
        self.rows_sent = self.rows_received = 0
        self.bytes_sent = self.bytes_received = 0
        self.seconds = self.wait_seconds = 0.0

    def __call__(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        """xs: tensors of (N_src_own, ...) rows of this rank's sources -> their (N_halo, ...) halo
        rows, differentiable. Several tensors (k and v) travel in one collective."""
        self._collectively(self._check_rows, xs)
        return _HaloRows.apply(self, False, *xs)

    def with_halo(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        """Each x: (N_src_own, ...) -> (N_src_own + N_halo, ...), its rows followed by the halo's:
        the source rows of the local graph. Backward adds the returned halo gradients into x's
        gradient in place (no zero-filled or full-size intermediate beyond that gradient)."""
        self._collectively(self._check_rows, xs)
        return _HaloRows.apply(self, True, *xs)

    def _collectively(self, check: Callable[..., None], *args: Any) -> None:
        """Run the local checks of this call (the group's size against the shard's parts, then
        `check`); if one raises while the peers will wait in this call's header exchange, take part
        in it marked failed (`_fail_with_peers`)."""
        try:
            self._check_group()
            check(*args)
        except Exception as error:
            self._fail(error)

    def _fail(self, error: Exception) -> NoReturn:
        """Raise `error` of this rank's call: with the peers where they wait in a header exchange."""
        if self._agreed and not self.check_each_call:
            raise error  # the peers do not wait in a header: this rank raises alone (documented)
        _fail_with_peers(error, self.shard, self.group)

    def _check_group(self) -> None:
        if not dist.is_available() or not dist.is_initialized():
            return  # a shard of several parts then raises in _agree: no peer to wait
        world = dist.get_world_size(self.group)
        if world != self.shard.num_parts:  # (a shard of one part would not communicate at all)
            raise ValueError(
                f"the shard is part {self.shard.rank} of {self.shard.num_parts} but the group has {world} "
                f"ranks: pass shards[rank] of partition(graph, {world})"
            )

    def _check_rows(self, xs: Sequence[Tensor]) -> None:
        n = self.shard.src_nodes.numel()
        for x in xs:
            if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[0] != n:
                shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"an exchanged tensor must have one row per owned source ({n}), got {shape}")
        if len({x.dtype for x in xs}) > 1:
            raise ValueError("tensors exchanged together must share a dtype")

    def _agree(self, xs: Sequence[Tensor]) -> None:
        """Collectively check that the ranks' shards and tensors fit together (`agreement.check`)."""
        if self._agreed and not self.check_each_call:
            return
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"a shard of {self.shard.num_parts} parts exchanges rows over torch.distributed: call "
                "dist.init_process_group first (torchrun sets up the environment for it)"
            )
        agreement.check(self.shard, xs, self.group)
        self._agreed = True

    def _trade(self, rows: Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> Tensor:
        """all_to_all_single of (n, F) rows grouped by receiving rank -> (m, F) grouped by sender."""
        out = rows.new_empty((sum(recv_counts), rows.shape[1]))
        if self.shard.num_parts == 1:
            return out  # nothing to trade with
        if self.timed:
            start = time.perf_counter()
            dist.barrier(group=self.group)
            self.wait_seconds += time.perf_counter() - start
        start = time.perf_counter()
        dist.all_to_all_single(out, rows.contiguous(), list(recv_counts), list(send_counts), group=self.group)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.rows_sent += rows.shape[0]
        self.rows_received += out.shape[0]
        self.bytes_sent += rows.numel() * rows.element_size()
        self.bytes_received += out.numel() * out.element_size()
        return out

    def _forward(self, xs: Sequence[Tensor]) -> Tuple[Tensor, ...]:
        if self.shard.num_parts > 1:  # backward's gradients have the forward's shapes and dtype: no header
            start = time.perf_counter()
            self._agree(xs)
            if self.timed:  # the header's all_gather also waits for the slowest rank
                self.wait_seconds += time.perf_counter() - start
        index = self.shard.send_index
        rows = torch.cat([_as_rows(x).index_select(0, index) for x in xs], 1)  # only the rows sent
        halo = self._trade(rows, self.shard.send_counts, self.shard.recv_counts)
        pieces = halo.split([_as_rows(x).shape[1] for x in xs], 1)
        return tuple(p.reshape(p.shape[0], *x.shape[1:]) for p, x in zip(pieces, xs))

    def _backward(
        self, grads: Sequence[Tensor], shapes: Sequence[Tuple[int, ...]], appended: bool
    ) -> Tuple[Tensor, ...]:
        """grads: of the halo rows, or (appended) of [x; halo] rows -> the gradients of the xs."""
        own = [shape[0] if appended else 0 for shape in shapes]
        grad_rows = torch.cat([_as_rows(g)[n:] for g, n in zip(grads, own)], 1)
        sent = self._trade(grad_rows, self.shard.recv_counts, self.shard.send_counts)
        out = []
        for piece, g, n, shape in zip(sent.split([_as_rows(g).shape[1] for g in grads], 1), grads, own, shapes):
            # x's own rows' gradient (a copy: autograd's grad must not change), or zeros
            grad = _as_rows(g)[:n].clone() if appended else piece.new_zeros((shape[0], piece.shape[1]))
            grad.index_add_(0, self.shard.send_index, piece)  # a row sent to several ranks sums their gradients
            out.append(grad.view(shape))
        return tuple(out)

    def __repr__(self) -> str:
        return f"HaloExchange({self.shard!r}, calls={self.calls}, rows_sent={self.rows_sent})"


def _fail_with_peers(error: Exception, shard: Optional[Shard], group: Optional[Any]) -> NoReturn:
    """This rank failed before the header exchange its peers wait in: take part in it marked failed,
    so that every rank of `group` raises the same one-line ValueError naming this rank and its error
    (here chained from `error`). Without peers (no process group, or a group of one), raise `error`."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) < 2:
        raise error
    try:
        agreement.check(shard, (), group, failure=agreement.one_line(error))
    except ValueError as every_rank:
        raise every_rank from error
    raise error  # not reached: a header marked failed always disagrees


def _as_rows(x: Tensor) -> Tensor:
    """(N, ...) -> (N, F), also for N = 0 and 1-D tensors."""
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


class _HaloRows(torch.autograd.Function):
    """The halo rows of xs (append=False), or each x with its halo rows appended (append=True)."""

    @staticmethod
    def forward(ctx: Any, exchange: HaloExchange, append: bool, *xs: Tensor) -> Tuple[Tensor, ...]:
        ctx.exchange, ctx.append, ctx.shapes = exchange, append, [tuple(x.shape) for x in xs]
        halos = exchange._forward(xs)
        return tuple(torch.cat([x, h]) for x, h in zip(xs, halos)) if append else halos

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Tuple[Optional[Tensor], ...]:
        return (None, None, *ctx.exchange._backward(grads, ctx.shapes, ctx.append))


def sharded_edge_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    shard: Union[Shard, HaloExchange],
    *,
    group: Optional[Any] = None,
    **edge_attention_kwargs: Any,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """`edge_attention` over a graph partitioned across ranks: this rank's destinations' outputs.

    The halo rows of k and v are fetched from their owners in one `all_to_all_single` (k and v
    travel together), the local kernel runs on `shard.graph`, and backward returns the halo rows'
    gradients to their owners. Every rank of the group must call it (collectively, in the same
    order); together the ranks compute exactly what `edge_attention` computes on the whole graph.

    Args:
        q: (N_own, H, D) queries of `shard.nodes`, in that order.
        k: (N_src_own, H, D) keys of `shard.src_nodes`, in that order (self-attention: `shard.nodes`).
        v: (N_src_own, H, Dv) values of the same rows.
        shard: this rank's `Shard` (`partition(...)[rank]` or `local_shard`), or a `HaloExchange`
            over it (to reuse one across layers, a group, counters).
        group: the process group, when `shard` is a Shard (default: the world).
        **edge_attention_kwargs: as `edge_attention` (scale, clamp, bias, edge_key, edge_value,
            edge_scale, eps, dropout_p, edge_weight, backend, return_weights). Per-edge tensors hold one row per
            edge of `shard.graph`, in its order (global per-edge tensors: index with `shard.edge_ids`).

    Returns:
        out: (N_own, H, Dv); with return_weights=True also the (E_local, H) weights.
    """
    exchange = _exchange_of(shard, group)
    exchange._collectively(_check_call, q, k, v, exchange.shard, edge_attention_kwargs)
    k_all, v_all = exchange.with_halo(k, v)  # one trade for both: (N_src_own + N_halo, H, .)
    return edge_attention(q, k_all, v_all, exchange.shard.graph, **edge_attention_kwargs)


def _exchange_of(shard: Union[Shard, HaloExchange], group: Optional[Any]) -> HaloExchange:
    """The exchange a call runs on; a rank whose `shard` or `group` argument is wrong fails with its
    peers (`_fail_with_peers`, on the group the peers' exchanges use), not alone."""
    try:
        if isinstance(shard, HaloExchange):
            if group is not None:
                raise ValueError("pass group= to the HaloExchange, not with one")
            return shard
        if not isinstance(shard, Shard):
            raise TypeError(f"shard must be a sparseattn.distributed Shard or HaloExchange, got {type(shard).__name__}")
        return HaloExchange(shard, group)
    except Exception as error:
        if isinstance(shard, HaloExchange):
            shard._fail(error)
        _fail_with_peers(error, None, group)


def _check_call(q: Tensor, k: Tensor, v: Tensor, s: Shard, kwargs: Dict[str, Any]) -> None:
    """sharded_edge_attention's checks of q, k and v against this rank's shard, and of the local
    edge_attention call's arguments (with stand-ins of k and v's shape after the exchange), so that a
    rank fails before the exchange, where its peers hear of it, not after."""
    check_qkv(q, k, v)
    if q.device != s.graph.device:
        raise ValueError(f"the shard is on {s.graph.device} but q is on {q.device}: move it with shard.to(q.device)")
    if q.shape[0] != s.nodes.numel():
        raise ValueError(f"q must have one row per node of the shard ({s.nodes.numel()}), got {q.shape[0]}")
    if k.shape[0] != s.src_nodes.numel():
        raise ValueError(f"k and v must have one row per source of the shard ({s.src_nodes.numel()}), got {k.shape[0]}")
    k_all, v_all = (x.new_zeros((1, *x.shape[1:])).expand(s.graph.num_src, *x.shape[1:]) for x in (k, v))
    check_arguments(q, k_all, v_all, s.graph, **kwargs)
