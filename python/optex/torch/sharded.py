"""``shard_state=True``: each torch.distributed rank keeps only its slice of the state.

The flat parameter vector (layout.py's order) is cut by ``optex.shard_of(d, W, r)``:
rank r's engine (``optex.OptEx(..., shard=...)``) holds coordinates
[offset, offset + size) of the iterate, the optimizer state and the GP history,
and completes every sum over coordinates through ``TorchSums``. A round (the C++
ShardedEngine's, over torch.distributed; DESIGN.md section 3):

1. ask(): every rank's engine gives the (N, size) slices of the round's N points
   (collective: its sums);
2. one all_to_all_single gives each rank the slices of its own rows (the
   contiguous ``point_range`` split, as without sharding), which it assembles into
   whole points;
3. each rank evaluates its rows (the closure and its backward pass);
4. the losses are all-gathered (``Ranks.gather_losses``);
5. one all_to_all_single sends each slice of each evaluated gradient to the rank
   that owns it, straight into its engine's (N, size) gradient rows;
6. tell(): the commit, its sums completed across the ranks;
7. one all_gather of the new iterate's slices gives every rank the whole iterate,
   which the model's parameters hold.

No rank holds more than its own rows of the points and gradients whole.
``all_to_all_single`` with uneven splits works with the gloo backend (CPU tensors)
in the torch this is tested with (2.x) and with NCCL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .._optex import OptEx as _Engine
from .._optex import Options, shard_of, slice_ranges
from .exchange import Ranks
from .trainable import engine_optimizer

# The option that asks for all this, as errors name it.
OPTION = "shard_state"


def slices(dim: int, world: int) -> list[tuple[int, int]]:
    """Every rank's (offset, size) of a d-vector; ValueError naming ``shard_state``
    when d has fewer blocks of 4096 coordinates than there are ranks."""
    try:
        return [tuple(shard_of(dim, world, r)) for r in range(world)]
    except ValueError as error:
        raise ValueError(
            f"{OPTION}: the trainable parameters have {dim} elements, too few to shard over "
            f"{world} ranks ({error}); use shard_state=False here (every rank holds the whole "
            "state)"
        ) from None


class _NoSums:
    """The sums of a one-coordinate slice that only validates options (never called)."""

    def sum(self, values: np.ndarray) -> None:
        raise AssertionError("never called")

    def all(self, flags: np.ndarray) -> None:
        raise AssertionError("never called")


def check_options(optimizer: Any, options: Options) -> None:
    """ValueError naming ``shard_state`` for options a slice engine refuses
    (proxy='target', whose oracle needs whole points), checked by building one."""
    try:
        _Engine(np.zeros(1, np.float32), optimizer, options, shard=(1, 0, _NoSums()))
    except ValueError as error:
        raise ValueError(f"{OPTION}=True: {error}") from None


class TorchSums:
    """What a slice engine completes its sums with, over torch.distributed.

    ``sum``: an all_gather of the float64 partials, added on the CPU in rank order,
    so that every rank gets the same bits (all_reduce adds in an unspecified
    order). ``all``: an all_reduce MIN of int32 flags, which is exact. Counts the
    collectives and the bytes this rank sends (``collectives``, ``bytes_sent``).
    """

    def __init__(self, ranks: Ranks, counter: Counter) -> None:
        self._ranks = ranks
        self._counter = counter

    def sum(self, values: np.ndarray) -> None:
        ranks = self._ranks
        mine = torch.from_numpy(values).to(ranks.device)
        parts = [torch.empty_like(mine) for _ in range(ranks.world)]
        dist.all_gather(parts, mine, group=ranks.group)
        total = parts[0].cpu().clone()
        for part in parts[1:]:
            total += part.cpu()
        values[...] = total.numpy()
        self._counter.add(values.nbytes)

    def all(self, flags: np.ndarray) -> None:
        ranks = self._ranks
        mine = torch.from_numpy(flags.astype(np.int32)).to(ranks.device)
        dist.all_reduce(mine, op=dist.ReduceOp.MIN, group=ranks.group)
        flags[...] = (mine.cpu().numpy() != 0).astype(np.uint8)
        self._counter.add(mine.numel() * mine.element_size())


class Counter:
    """The collectives of the sharded exchange and the bytes this rank sent in them."""

    def __init__(self) -> None:
        self.collectives = 0
        self.bytes_sent = 0

    def add(self, nbytes: int) -> None:
        self.collectives += 1
        self.bytes_sent += int(nbytes)


class Shards:
    """This rank's slice of the flat vector of dimension ``dim``, every rank's, and
    the exchanges of a sharded round (see the module's documentation)."""

    def __init__(self, ranks: Ranks, dim: int) -> None:
        self.ranks = ranks
        self.dim = dim
        self.slices = slices(dim, ranks.world)
        self.offset, self.size = self.slices[ranks.rank]
        self.counter = Counter()
        self.sums = TorchSums(ranks, self.counter)

    # -- the slice engine --

    def cut(self, ranges: Sequence[tuple[int, Any, int]]) -> list[tuple[int, Any, int]]:
        """The (size, optimizer, step offset) ranges of this rank's slice, from the
        whole vector's."""
        cut = slice_ranges(engine_optimizer(ranges), self.dim, self.offset, self.size)
        if not isinstance(cut, list):
            return [(self.size, cut, 0)]
        return [(r[0], r[1], r[2] if len(r) > 2 else 0) for r in cut]

    def engine(self, x0: torch.Tensor, ranges: Sequence[tuple[int, Any, int]],
               options: Options) -> _Engine:
        """This rank's slice engine, starting from the whole vector ``x0``."""
        mine = x0[self.offset:self.offset + self.size].detach().cpu().numpy()
        return _Engine(mine, engine_optimizer(self.cut(ranges)), options, shard=self.shard())

    def engine_from_state(self, state: dict[str, Any]) -> _Engine:
        """This rank's slice engine continuing a slice's ``state_arrays()``."""
        return _Engine.from_state_arrays(state, shard=self.shard())

    def shard(self) -> tuple[int, int, TorchSums]:
        return (self.dim, self.offset, self.sums)

    def local_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """(offset, size) ranges of the whole vector, cut to this slice and counted from
        its first coordinate."""
        lo, hi = self.offset, self.offset + self.size
        local = []
        for offset, size in ranges:
            begin, end = max(lo, offset), min(hi, offset + size)
            if begin < end:
                local.append((begin - lo, end - begin))
        return local

    # -- the round's exchanges --

    def _rows(self, n: int) -> tuple[list[int], int]:
        """How many of the round's n rows each rank evaluates, and this rank's count."""
        counts = [len(self.ranks.points(n, q)) for q in range(self.ranks.world)]
        return counts, counts[self.ranks.rank]

    def whole_points(self, points: torch.Tensor, n: int) -> torch.Tensor:
        """This rank's rows of the round, whole ((count, d) float32), from every rank's
        (N, size) slices ``points``: the slices of rank q's rows go to rank q. The rows
        of the ranks are contiguous and in rank order, so the send buffer is the slice
        matrix itself."""
        ranks, device = self.ranks, self.ranks.device
        counts, mine = self._rows(n)
        send = points.reshape(-1).to(device)
        received = torch.empty(mine * self.dim, dtype=torch.float32, device=device)
        dist.all_to_all_single(received, send,
                               output_split_sizes=[mine * s for _, s in self.slices],
                               input_split_sizes=[c * self.size for c in counts],
                               group=ranks.group)
        self.counter.add((n - mine) * self.size * 4)
        whole = torch.empty(mine, self.dim, dtype=torch.float32, device=device)
        start = 0
        for offset, size in self.slices:
            whole[:, offset:offset + size] = received[start:start + mine * size].view(mine, size)
            start += mine * size
        return whole

    def send_gradients(self, grads: torch.Tensor, rows: torch.Tensor, n: int) -> None:
        """Each slice of this rank's evaluated gradients (the first ``count`` rows of
        ``grads``, whole) to the rank that owns it; this rank's slices of every rank's
        gradients arrive in the engine's (N, size) gradient ``rows``, in point order."""
        ranks, device = self.ranks, self.ranks.device
        counts, mine = self._rows(n)
        send = torch.cat([grads[:mine, offset:offset + size].reshape(-1)
                          for offset, size in self.slices]).to(device)
        flat = rows.reshape(-1)
        received = flat if flat.device == device else torch.empty_like(flat, device=device)
        dist.all_to_all_single(received, send,
                               output_split_sizes=[c * self.size for c in counts],
                               input_split_sizes=[mine * s for _, s in self.slices],
                               group=ranks.group)
        self.counter.add((self.dim - self.size) * mine * 4)
        if received is not flat:
            flat.copy_(received)

    def whole_iterate(self, mine: torch.Tensor) -> torch.Tensor:
        """The whole iterate (d,) on every rank from each rank's slice ``mine``: one
        all_gather, each slice padded to the largest."""
        ranks, device = self.ranks, self.ranks.device
        width = max(size for _, size in self.slices)
        padded = torch.zeros(width, dtype=torch.float32, device=device)
        padded[:self.size] = mine
        parts = [torch.empty_like(padded) for _ in range(ranks.world)]
        dist.all_gather(parts, padded, group=ranks.group)
        self.counter.add(width * 4)
        return torch.cat([part[:size] for part, (_, size) in zip(parts, self.slices)])
