"""torch.distributed: the ranks of a process group share the N points of a round.

Every rank runs its own engine. Rank r evaluates the points
``optex.point_range(N, W, r)`` (the C++ DistributedEngine's split), then the
gradients (float32) and losses (float64) are all-gathered and every rank tells
its engine the same full batch, so the engines stay identical and the result
is bit for bit the single-process one. This module holds what crosses between
the ranks: the agreement on the settings, the start point, and the gather.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

from .._optex import point_range


def distributed_available() -> bool:
    """torch.distributed is built in and initialised."""
    return bool(dist.is_available() and dist.is_initialized())


def distributed_enabled(flag: bool | None) -> bool:
    """Whether to share the rounds: ``distributed=None`` follows torch.distributed,
    False never shares (every rank evaluates all points itself)."""
    return flag is not False and distributed_available()


class Ranks:
    """This rank's view of ``process_group`` (None: the world) for one step.

    ``device`` is where the exchanged tensors live: the parameters' GPU with
    NCCL, the CPU otherwise.
    """

    def __init__(self, process_group: Any, param_device: torch.device) -> None:
        self.group = process_group
        self.world = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        backend = str(dist.get_backend(process_group)).lower()
        nccl = "nccl" in backend and param_device.type == "cuda"
        self.device = param_device if nccl else torch.device("cpu")

    def points(self, n: int, rank: int | None = None) -> range:
        """The points of ``rank`` (default: this one) among the N of a round."""
        return point_range(n, self.world, self.rank if rank is None else rank)

    def width(self, n: int) -> int:
        """The most points any rank evaluates: every rank sends that many rows, so
        that the all-gathered tensors have one shape."""
        return max(len(self.points(n, r)) for r in range(self.world))

    def agree(self, settings: str) -> None:
        """ValueError on every rank unless every rank passes the same ``settings``
        (the hyperparameters, options and dimension, as text)."""
        digest = int.from_bytes(hashlib.sha256(settings.encode()).digest()[:7], "little")
        mine = torch.tensor([digest], dtype=torch.int64, device=self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine, group=self.group)
        values = [int(t.item()) for t in gathered]
        if len(set(values)) != 1:
            differ = [r for r, v in enumerate(values) if v != values[0]]
            raise ValueError(
                "optex.torch.OptEx: the ranks disagree on the hyperparameters, options or the "
                f"number of parameters (ranks {differ} differ from rank 0; this rank: {settings})"
            )

    def broadcast_start(self, x0: torch.Tensor) -> torch.Tensor:
        """The group's first rank's ``x0``, on every rank (on ``x0``'s device)."""
        comm = x0.to(self.device)
        first = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.broadcast(comm, src=first, group=self.group)
        return comm.to(x0.device)

    def broadcast_from_owner(self, tensors: list[torch.Tensor], values: list[torch.Tensor] | None,
                             row: int, n: int) -> None:
        """Sets ``tensors`` on every rank to ``values``, which the rank that evaluated
        ``row`` (of ``n``) holds (None elsewhere)."""
        owner = next(r for r in range(self.world) if row in self.points(n, r))
        source = dist.get_global_rank(self.group, owner) if self.group is not None else owner
        for i, t in enumerate(tensors):
            comm = (values[i] if values is not None else t).to(self.device, copy=True)
            dist.broadcast(comm, src=source, group=self.group)
            t.copy_(comm)

    def any_rank(self, flags: list[bool]) -> list[bool]:
        """Element-wise: whether any rank's ``flags`` (the same length on every rank) is True."""
        mine = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32, device=self.device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(v) for v in mine.tolist()]

    # The losses a rank sends: `width` losses, then a failure flag (0: none,
    # 1 + i: the closure raised at point i), so that one all-gather tells every
    # rank whether to go on before the gradients travel.

    def losses_buffer(self, width: int) -> torch.Tensor:
        """Zeroed room for this rank's losses and its failure flag."""
        return torch.zeros(width + 1, dtype=torch.float64, device=self.device)

    @staticmethod
    def flag_failure(losses: torch.Tensor, point: int) -> None:
        """Records in ``losses`` (a losses_buffer) that the closure raised at ``point``."""
        losses[-1] = 1.0 + point

    def gather_losses(self, losses: torch.Tensor, n: int, failure: BaseException | None) -> torch.Tensor:
        """All-gathers the ranks' losses (a losses_buffer, with the failure flag) and
        returns the (N,) float64 host losses in point order. RuntimeError on every
        rank, naming the ranks and points, when a closure raised anywhere
        (``failure``: this rank's error), before any gradient travels."""
        width = losses.shape[0] - 1
        gathered = [torch.empty_like(losses) for _ in range(self.world)]
        dist.all_gather(gathered, losses, group=self.group)
        failed = [(r, int(t[width].item()) - 1) for r, t in enumerate(gathered)
                  if t[width].item() != 0.0]
        if failed:
            where = ", ".join(f"rank {r} at point {i}" for r, i in failed)
            message = (f"step: the closure raised on {where}; the round stays pending and every "
                       "rank's engine is unchanged")
            if failure is not None:
                raise RuntimeError(f"{message} (this rank: {type(failure).__name__}: {failure})") from failure
            raise RuntimeError(message)
        all_losses = torch.empty(n, dtype=torch.float64)
        for r in range(self.world):
            block = self.points(n, r)
            all_losses[block.start:block.stop].copy_(gathered[r][:len(block)])
        return all_losses

    def gather(self, grads: torch.Tensor, losses: torch.Tensor, rows: torch.Tensor,
               failure: BaseException | None) -> torch.Tensor:
        """gather_losses, then all-gathers the ranks' gradients into the engine's
        (N, d) ``rows`` in point order; returns the (N,) float64 host losses."""
        n = rows.shape[0]
        all_losses = self.gather_losses(losses, n, failure)
        gathered_grads = [torch.empty_like(grads) for _ in range(self.world)]
        dist.all_gather(gathered_grads, grads, group=self.group)
        for r in range(self.world):
            block = self.points(n, r)
            rows[block.start:block.stop].copy_(gathered_grads[r][:len(block)])
        return all_losses


class Replicas(Ranks):
    """The ranks of ``process_group`` under ``distributed=False``: each one evaluates
    all N points itself, as under DistributedDataParallel, whose backward
    all-reduces the gradients so that every rank holds the same ones, while each
    rank's losses are its own (its half of the batch).

    Every rank must still commit what the others commit (the engines are
    replicas), so what ``tell`` decides from is made the same everywhere before it
    is called: the losses are the mean over the ranks (added in rank order, so
    every rank gets the same bits; as DDP averages the gradients), a parameter has
    a gradient at a point when it has one on any rank, and the gradients must be
    the same bits on every rank (a checksum per point), else every rank raises
    instead of drifting apart. One all_gather of ``2 N + N P + 1`` int64 a round.
    """

    def points(self, n: int, rank: int | None = None) -> range:
        return range(n)  # every rank evaluates every point

    def width(self, n: int) -> int:
        return n

    def agree_round(self, losses: torch.Tensor, rows: torch.Tensor, presence: torch.Tensor,
                    failure: tuple[int, BaseException] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's collective decision. ``losses``: this rank's (N,) float64
        host losses; ``rows``: the engine's (N, d) gradient rows; ``presence``:
        (N, P) bool, whether parameter p had a gradient at point i here; ``failure``:
        (point, error) when this rank's closure raised. Returns (the mean losses,
        (N,) float64 host; presence on any rank, (N, P) bool), the same bits on
        every rank. RuntimeError on every rank, naming the ranks and points and
        what to do, when a closure raised on some rank or the ranks' gradients
        differ; the round then stays pending and no engine changes."""
        n, params = presence.shape
        mine = torch.zeros(2 * n + n * params + 1, dtype=torch.int64)
        mine[:n] = losses.to(torch.float64).view(torch.int64)
        if failure is None:
            mine[n:2 * n] = gradient_checksums(rows).cpu()
        else:
            mine[-1] = 1 + failure[0]
        mine[2 * n:2 * n + n * params] = presence.reshape(-1).to(torch.int64)
        comm = mine.to(self.device)
        gathered = [torch.empty_like(comm) for _ in range(self.world)]
        dist.all_gather(gathered, comm, group=self.group)
        views = [t.cpu() for t in gathered]
        failed = [(r, int(v[-1]) - 1) for r, v in enumerate(views) if int(v[-1]) != 0]
        if failed:
            where = ", ".join(f"rank {r} at point {i}" for r, i in failed)
            message = (f"step: the closure raised on {where}; the round stays pending and every "
                       "rank's engine is unchanged")
            if failure is not None:
                raise RuntimeError(f"{message} (this rank: {type(failure[1]).__name__}: "
                                   f"{failure[1]})") from failure[1]
            raise RuntimeError(message)
        differ = [(r, i) for r, v in enumerate(views) for i in range(n)
                  if int(v[n + i]) != int(views[0][n + i])]
        if differ:
            rank, point = differ[0]
            raise RuntimeError(
                f"step: with distributed=False every rank evaluates all {n} points and must get "
                f"the same gradients, but rank {rank}'s gradient at point {point} differs from "
                "rank 0's, so the ranks would commit different iterates; wrap the model in "
                "torch.nn.parallel.DistributedDataParallel (its backward averages the "
                "gradients), pass distributed=True to share the points between the ranks, or "
                "pass process_group=<a group of this rank alone> for independent runs. The "
                "round stays pending and every rank's engine is unchanged")
        mean = torch.zeros(n, dtype=torch.float64)
        for v in views:  # in rank order: the same sum on every rank
            mean += v[:n].view(torch.float64)
        mean /= self.world
        anywhere = torch.stack([v[2 * n:2 * n + n * params] for v in views]).amax(dim=0)
        return mean, anywhere.reshape(n, params).bool()


def gradient_checksums(rows: torch.Tensor) -> torch.Tensor:
    """Per row of the float32 (N, d) ``rows``: the sum modulo 2^64 of its bytes read
    as int64 words (a wrapping sum: the same in any order, so on every rank), which
    tells two ranks' gradients apart without sending them. Reading the floats in
    pairs costs about a tenth of a copy of the rows."""
    sums = torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
    for i in range(rows.shape[0]):
        sums[i] = _word_sum(rows[i])
    return sums


def _word_sum(row: torch.Tensor) -> torch.Tensor:
    """The wrapping int64 sum of a contiguous float32 row: its 8-byte-aligned middle as
    int64 words, the element before it and the one after (if any) as int32 values."""
    head = row.storage_offset() % 2  # an int64 view must start on an 8-byte boundary
    body = (row.shape[0] - head) // 2 * 2
    total = row[head:head + body].view(torch.int64).sum()
    ends = torch.cat([row[:head], row[head + body:]])
    return total + ends.view(torch.int32).to(torch.int64).sum()


def replicas_enabled(flag: bool | None, group: Any) -> bool:
    """``distributed=False`` under an initialised torch.distributed with more than
    one rank in ``group``: the ranks replicate the rounds (Replicas)."""
    return flag is False and distributed_available() and dist.get_world_size(group) > 1
