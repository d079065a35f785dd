"""``optex.torch.OptEx.step``: one OptEx round over the closure.

The engine's ``ask()`` gives the N points (calling the closure as the gradient
oracle first under proxy='target'); this process evaluates its share of them
(all N alone, its ``point_range`` block under torch.distributed; all of its rows
in one vectorized call for a ``BatchedClosure`` with ``vectorize=True``); the
gradients and losses go straight into the engine's rows, or are exchanged
between the ranks first (exchange.py, sharded.py); ``tell()`` commits, and the
committed iterate goes back into the parameters.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import engine_lifecycle as _lifecycle
from .batched import BatchedClosure
from .closure import Closure, check_closure, committed_rows, evaluate, loss_at
from .committed_buffers import CommittedBuffers
from .exchange import Ranks
from .trainable import merged_segments

if TYPE_CHECKING:
    from .optimizer import OptEx


def run(opt: OptEx, closure: Closure | None) -> Any:
    """The body of ``OptEx.step`` (under its ``torch.no_grad()``): one round."""
    check_closure(closure)
    if isinstance(closure, BatchedClosure):
        closure._bind_to(opt)  # its sequential form evaluates this optimizer's current_point
    _lifecycle.prepare(opt)
    engine, layout = opt._engine, opt._layout
    assert engine is not None and layout is not None and opt._iterate is not None
    n, d = engine.parallelism, layout.dim
    dev = layout.device
    shards = opt._shards

    # The engine's own point and gradient rows, wrapped without a copy
    # (DLPack): on a CUDA engine they stay in GPU memory. Under shard_state
    # they are this rank's (N, size) slices.
    target = engine.options.proxy == "target"
    if target:
        run_seed = int(engine.options.seed)
        # The engine asks for the points in order, once each per round.
        oracle_rows = itertools.count(0, int(engine.options.evaluations_per_point))
        engine.set_gradient_oracle(lambda x: _oracle(opt, closure, run_seed, next(oracle_rows), x))
    try:
        points = torch.from_dlpack(engine.device_points())
    finally:
        if target:
            engine.set_gradient_oracle(None)
    rows = torch.from_dlpack(engine.device_grads())
    seeds = engine.seeds

    # This process's points (`block`, the rows `mine`), and where their gradients
    # and losses go: alone or as a replica (distributed=False under
    # torch.distributed: every rank evaluates every point), straight into the
    # engine's rows; sharing the points, into buffers that the ranks then exchange.
    ranks = opt._ranks()
    replicas = opt._replicas() if ranks is None else None
    if ranks is None:
        mine, block, grads_local = range(n), points, rows
        losses_local = torch.zeros(n, dtype=torch.float64)
    else:
        mine, width = ranks.points(n), ranks.width(n)
        block = points[mine.start:mine.stop] if shards is None else shards.whole_points(points, n)
        grads_local = _scratch_tensor(opt, "grads_local", (width, d), torch.float32, ranks.device)
        losses_local = ranks.losses_buffer(width)
    batched = isinstance(closure, BatchedClosure) and closure.vectorize
    # Under vmap no evaluation can update a buffer in place (BatchedClosure refuses
    # such models), so there is nothing to keep.
    buffers = (CommittedBuffers(opt._buffer_tensors)
               if opt._buffer_tensors is not None and not batched else None)
    try:
        results, presence, failure = _evaluate(
            opt, closure, batched, block, seeds, mine, grads_local, losses_local,
            ranks, ranks is not None or replicas is not None, buffers)
        if replicas is not None:
            losses, presence = replicas.agree_round(losses_local, rows, presence, failure)
        elif ranks is None:
            losses = losses_local
        else:
            losses, presence = _share(ranks, opt._shards, grads_local, losses_local, rows,
                                      presence, failure)
        if rows.device.type == "cuda":
            torch.cuda.synchronize(rows.device)  # the engine reads the rows on its own stream
        decision = _round_parameters(presence, engine.options.mode == "verified")
        # torch.optim skips a parameter without a gradient: the commit leaves its
        # value and state alone, and the round does not count among its steps.
        unused = [p for p, got in zip(layout.params, decision.got_gradient) if not got]
        unchanged = merged_segments(layout, [not got for got in decision.got_gradient])
        if shards is not None:
            unchanged = shards.local_ranges(unchanged)
        steps_before = engine.optimizer_step
        told, drop = _verified_cut(opt, losses, rows, decision.first_other_row,
                                   ranks if shards is not None else None)
        info = engine.tell_device(told, drop_nonfinite=drop, unchanged=unchanged)
    except BaseException:
        if buffers is not None:
            buffers.restore_start()
        raise
    opt._offsets.skip(unused, engine.optimizer_step - steps_before)
    opt._last_info = info
    opt._iteration = int(engine.iteration)

    # A copy: the engine rewrites its iterate in place at the next commit.
    if shards is None:
        opt._iterate = torch.from_dlpack(engine.device_x()).to(dev, copy=True)
    else:
        opt._iterate = shards.whole_iterate(torch.from_dlpack(engine.device_x())).to(dev)
    layout.write(opt._iterate)
    committed = committed_rows(info.committed_point, info.point_evaluations)
    if buffers is not None:
        buffers.keep(committed.start, n, ranks if ranks is not None else replicas)
    return loss_at(committed, info.loss, results, losses)


def _share(ranks: Ranks, shards: Any, grads_local: torch.Tensor, losses_local: torch.Tensor,
           rows: torch.Tensor, presence: torch.Tensor,
           failure: tuple[int, BaseException] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranks sharing the points: the gradients go to the engines' rows (whole, or each
    slice to its owner under shard_state); returns the (N,) float64 host losses and
    the (N, P) presence, the same on every rank (a parameter has a gradient at a point
    when the rank that evaluated the point saw one)."""
    n, params = presence.shape
    error = None if failure is None else failure[1]
    if shards is None:
        losses = ranks.gather(grads_local, losses_local, rows, error)
    else:
        losses = ranks.gather_losses(losses_local, n, error)
        shards.send_gradients(grads_local, rows, n)
    anywhere = ranks.any_rank(presence.reshape(-1).tolist())
    return losses, torch.tensor(anywhere, dtype=torch.bool).reshape(n, params)


class _RoundParameters:
    """Which parameters a round steps: ``got_gradient`` per parameter, and in the
    verified mode ``first_other_row``, the first point whose parameters with a
    gradient differ from point 0's (None when none does)."""

    def __init__(self, got_gradient: list[bool], first_other_row: int | None) -> None:
        self.got_gradient = got_gradient
        self.first_other_row = first_other_row


def _round_parameters(presence: torch.Tensor, verified: bool) -> _RoundParameters:
    """From ``presence`` ((N, P) bool: parameter p had a gradient at point i, on
    any rank). In OptEx's mode the round steps a parameter when any point gave
    it a gradient. In the verified mode the commit is the base optimizer's steps
    from point 0 on, each of which torch.optim would take with that point's own
    parameters: the commit stops before the first point whose parameters differ
    from point 0's (_verified_cut), and steps point 0's parameters."""
    if not verified:
        return _RoundParameters(presence.any(dim=0).tolist(), None)
    same = (presence == presence[0]).all(dim=1)
    other = (~same).nonzero()
    return _RoundParameters(presence[0].tolist(), int(other[0]) if len(other) else None)


def _verified_cut(opt: OptEx, losses: torch.Tensor, rows: torch.Tensor,
                  first_other_row: int | None, slices: Ranks | None) -> tuple[Any, bool]:
    """The losses to tell and drop_nonfinite. In the verified mode, when point
    ``first_other_row`` gives another set of parameters a gradient than point 0,
    its loss and those after it are told as NaN, so that the engine's commit
    (the admissible prefix of the points) ends before it; the next round starts
    there with the new set. Without drop_nonfinite, a round that holds a
    non-finite value of its own is told as it is (the engine refuses it); under
    shard_state (``slices``: the ranks whose rows are slices) the ranks agree on
    that, as each sees only its slice of the gradients."""
    if first_other_row is None:
        return losses.numpy(), opt._drop_nonfinite
    if not opt._drop_nonfinite:
        nonfinite = not (bool(torch.isfinite(losses).all()) and bool(torch.isfinite(rows).all()))
        if slices is not None:
            nonfinite = slices.any_rank([nonfinite])[0]
        if nonfinite:
            return losses.numpy(), False
    told = losses.clone()
    told[first_other_row:] = float("nan")
    return told.numpy(), True


def _evaluate(opt: OptEx, closure: Closure, batched: bool, points: torch.Tensor, seeds: Any,
              mine: range, grads_local: torch.Tensor, losses_local: torch.Tensor,
              ranks: Ranks | None, collective: bool, buffers: CommittedBuffers | None
              ) -> tuple[dict[int, Any], torch.Tensor, tuple[int, BaseException] | None]:
    """Evaluates the closure at this process's points ``mine`` (``points[k]`` is row
    ``mine[k]``, whole) into ``grads_local`` and ``losses_local``; returns (the
    closure's losses by row, as received: copies, see closure.received_loss;
    ``presence``, (N, P) bool: whether parameter p got a gradient at row i, False
    for the rows of other ranks; the (point, error) of a closure that raised when
    ``collective`` (the ranks learn of it in the exchange: the sharing ``ranks``
    from the flag in ``losses_local``), else it propagates).
    The parameters hold the iterate again afterwards."""
    layout = opt._layout
    assert layout is not None and opt._iterate is not None
    dev, d = layout.device, layout.dim
    n = len(seeds)
    # The closure needs its point, and gives its gradient, on the parameters' device.
    scratch_point = (_scratch_tensor(opt, "point", (d,), torch.float32, dev)
                     if points.device != dev else None)
    scratch_grad = (_scratch_tensor(opt, "grad", (d,), torch.float32, dev)
                    if grads_local.device != dev else None)
    results: dict[int, Any] = {}
    presence = torch.zeros(n, len(layout.params), dtype=torch.bool)
    try:
        if batched:
            # batched.py: all of this process's rows in one vectorized call, not one
            # by one; every trainable parameter gets a gradient (zeros where unused).
            try:
                results = closure.evaluate_rows(layout, points, mine, grads_local, losses_local)
            except Exception as error:
                if not collective:
                    raise
                if ranks is not None:
                    ranks.flag_failure(losses_local, mine.start)
                return results, presence, (mine.start, error)
            presence[mine.start:mine.stop] = True
            return results, presence, None
        for k, i in enumerate(mine):
            point = points[k] if scratch_point is None else scratch_point.copy_(points[k])
            out = grads_local[k] if scratch_grad is None else scratch_grad
            opt._current_point, opt._current_seed = i, int(seeds[i])
            if buffers is not None:
                buffers.before_evaluation()
            try:
                results[i], losses_local[k], had = evaluate(closure, layout, point, out)
            except Exception as error:
                if not collective:
                    raise
                # The other ranks must learn of it in the exchange, not hang in it.
                if ranks is not None:
                    ranks.flag_failure(losses_local, i)
                return results, presence, (i, error)
            presence[i] = torch.tensor(had, dtype=torch.bool)
            if buffers is not None:
                buffers.after_evaluation(i)
            if scratch_grad is not None:
                grads_local[k].copy_(scratch_grad)
        return results, presence, None
    finally:
        opt._current_point = opt._current_seed = None
        layout.write(opt._iterate)


def _oracle(opt: OptEx, closure: Closure, seed: int, row: int, x: np.ndarray) -> tuple[float, np.ndarray]:
    """The true gradient for proxy='target', called by the engine inside ask()
    (`seed`: the run's seed; `row`: the first batch row of the point `x`)."""
    assert opt._layout is not None
    point = torch.from_numpy(x).to(opt._layout.device)
    grad = torch.empty_like(point)
    opt._current_point, opt._current_seed, opt._current_oracle_row = None, seed, row
    try:
        _, loss, _ = evaluate(closure, opt._layout, point, grad)
    finally:
        opt._current_point = opt._current_seed = opt._current_oracle_row = None
    return loss, grad.cpu().numpy()


def _scratch_tensor(opt: OptEx, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """A cached scratch tensor (pinned host memory when the parameters are on a GPU)."""
    buf = opt._scratch.get(name)
    if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
        pin = device.type == "cpu" and opt._param_device().type == "cuda"
        buf = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
        opt._scratch[name] = buf
    return buf

