"""``optex.torch.PointBatches``: a minibatch of its own for every evaluation of a round.

A step of ``optex.torch.OptEx`` evaluates the closure N times. A closure that
takes "the next batch" from a loop outside ``step`` gives all N evaluations the
same batch, so the round averages nothing and the history holds N gradients
of one batch. PointBatches numbers the evaluations densely (evaluation
``k = rounds committed * N + row``) and gives evaluation k the k-th batch of a
walk through the data epoch by epoch, so that the N rows of a round see N
different batches and the run is a pure function of the seed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from .optimizer import OptEx

Batch = tuple[torch.Tensor, ...]

_MASK64 = (1 << 64) - 1


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s order: SplitMix64's finaliser of (seed, epoch),
    so that neighbouring epochs and neighbouring seeds get unrelated permutations."""
    z = (seed + (epoch + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class PointBatches:
    """The minibatches of the evaluations of ``optex.torch.OptEx``'s rounds.

    ``PointBatches(optimizer, data, batch_size, *, shuffle=True, drop_last=True,
    seed=None, collate_fn=None)``

    **Data.** ``data`` is a tuple of tensors with the same first dimension, the
    samples, indexed together (``(inputs, labels)``; checked at construction:
    the floating-point ones must be finite), or a map-style
    ``torch.utils.data.Dataset`` with ``__len__``, whose items are collated with
    ``collate_fn`` (default ``torch.utils.data.default_collate``) into a tensor
    or a tuple/list of tensors (checked on item 0 at construction; a batch with
    NaN or infinite values raises ValueError naming its samples when drawn). A
    batch is a tuple of tensors, one per tensor of ``data`` (on its device) or
    of the collated structure.

    **Which batch.** The evaluations of a run are numbered densely: row ``row``
    (0..N-1) of the round that follows ``optimizer.iteration`` committed rounds
    is evaluation ``k = optimizer.iteration * N + row``. The number does not
    depend on which rank evaluates the row, and a round that failed and is
    retried gets the same numbers (a failed round is not committed). Evaluation
    k takes batch ``k % batches_per_epoch`` of epoch ``k // batches_per_epoch``.
    Each epoch visits every sample once, in the order of a permutation drawn
    with a ``torch.Generator`` seeded from (seed, epoch) (``shuffle=False``: in
    index order), cut into batches of ``batch_size`` samples; with ``drop_last``
    the ``len(data) % batch_size`` samples left over at the end of an epoch are
    not used in that epoch, without it they form a last, smaller batch. The
    global random state is never used or changed. The rows of a point
    evaluated several times (``evaluations_per_point`` D > 1) are distinct
    evaluations, so they see distinct batches: that is what averages them.

    **Seed.** ``seed`` (an int in [0, 2**64)) defaults to the optimizer's run
    seed (``optimizer.seed``, read at each call, so a ``load_state_dict`` that
    brings another run's seed also brings its batches); the optimizer's run seed
    itself follows ``torch.manual_seed`` unless given. The same seed gives the
    same batches, hence the same trajectory.

    **Use.** In the closure, ``inputs, labels = batches()`` (or
    ``batches.batches()``) gives the batch of the evaluation ``step`` is
    computing (``optimizer.current_point``); outside ``step``'s closure it raises
    RuntimeError. With ``proxy="target"`` the engine asks the closure for the true
    gradient at the round's points inside ``step`` (``current_point`` is None):
    the call at a point gets the batch of the point's first row
    (``optimizer.current_oracle_row``), the batch its evaluation gets, so that
    with D = 1 the N x T steps of T rounds (the oracle's N - 1 gradients and the
    last row's, each round) use batches 0 .. N x T - 1 in order, as N x T
    sequential steps would. ``batches_for(rows)``
    gives the batches of several rows of the round at once, each tensor with a
    new leading dimension of ``len(rows)`` (outside ``step``, of the next
    round); the batches must have equal shapes (``drop_last=True``, or
    ``batch_size`` dividing ``len(data)``).

    Bad arguments raise TypeError (wrong type) or ValueError (wrong value),
    naming the argument.
    """

    def __init__(
        self,
        optimizer: OptEx,
        data: tuple[torch.Tensor, ...] | Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = True,
        seed: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if not isinstance(optimizer, OptEx):
            raise TypeError(f"optimizer: must be an optex.torch.OptEx, got {type(optimizer).__name__}")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: must be a bool, got {flag!r}")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise TypeError(f"seed: must be an int or None, got {type(seed).__name__}")
            if not 0 <= seed <= _MASK64:
                raise ValueError(f"seed: must be in [0, 2**64), got {seed}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn: must be callable or None, got {type(collate_fn).__name__}")
        size = _sample_count(data, collate_fn)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"batch_size: must be an int, got {type(batch_size).__name__}")
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be positive, got {batch_size}")
        if drop_last and batch_size > size:
            raise ValueError(
                f"batch_size: {batch_size} is larger than the data ({size} samples); with "
                "drop_last=True no batch would be full"
            )
        self._optimizer = optimizer
        self._data = data
        self._tensors = isinstance(data, tuple)
        self._size = size
        self._batch_size = batch_size
        self._shuffle = shuffle
        self._drop_last = drop_last
        self._seed = seed
        self._collate = default_collate if collate_fn is None else collate_fn
        # The orders of the last epochs used: a round can straddle two epochs.
        self._orders: dict[tuple[int, int], torch.Tensor] = {}

    # ------------------------------------------------------------------ properties

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last batch of an epoch may be smaller without drop_last)."""
        return self._batch_size

    @property
    def batches_per_epoch(self) -> int:
        """Batches in one pass over the data."""
        full, rest = divmod(self._size, self._batch_size)
        return full + (1 if rest and not self._drop_last else 0)

    @property
    def seed(self) -> int:
        """The seed of the epochs' orders: ``seed=`` if given, else the optimizer's run seed."""
        return self._seed if self._seed is not None else self._optimizer.seed

    # ------------------------------------------------------------------ batches

    def __call__(self) -> Batch:
        """The same as :meth:`batches`."""
        return self.batches()

    def batches(self) -> Batch:
        """The batch of the evaluation the optimizer is computing now (inside the
        closure of ``step``); RuntimeError outside it."""
        optimizer = self._optimizer
        row = optimizer.current_point
        if row is None:
            row = optimizer.current_oracle_row
        if row is None:
            raise RuntimeError(
                "PointBatches.batches: called outside the closure of optimizer.step; the batch "
                "belongs to the evaluation step is computing (optimizer.current_point). Use "
                "batches_for(rows) to read the batches of a round's rows"
            )
        return self._batch(self._evaluation(row))

    def batches_for(self, rows: Sequence[int]) -> Batch:
        """The batches of ``rows`` (batch rows 0..N-1) of the round the optimizer is
        computing (outside ``step``: the next round), stacked: each tensor has a new
        leading dimension of ``len(rows)``, in the order of ``rows``. TypeError for
        rows that are not a sequence of ints, ValueError for an empty one, a row
        outside 0..N-1, or batches of different shapes (a smaller last batch
        without drop_last)."""
        if isinstance(rows, (str, bytes, torch.Tensor)) or not isinstance(rows, Sequence):
            raise TypeError(f"rows: must be a list of ints, got {type(rows).__name__}")
        if len(rows) == 0:
            raise ValueError("rows: must name at least one row")
        n = self._optimizer.parallelism
        for row in rows:
            if isinstance(row, bool) or not isinstance(row, int):
                raise TypeError(f"rows: must hold ints, got {row!r}")
            if not 0 <= row < n:
                raise ValueError(f"rows: {row} is not a row of a round of N = {n} evaluations")
        batches = [self._batch(self._evaluation(row)) for row in rows]
        shapes = {tuple(tuple(t.shape) for t in batch) for batch in batches}
        if len(shapes) > 1:
            raise ValueError(
                f"rows: their batches have different shapes {sorted(shapes)} and cannot be "
                "stacked (a smaller last batch of an epoch: use drop_last=True)"
            )
        return tuple(torch.stack(parts) for parts in zip(*batches))

    # ------------------------------------------------------------------ the walk

    def _evaluation(self, row: int) -> int:
        return self._optimizer.iteration * self._optimizer.parallelism + row

    def _batch(self, evaluation: int) -> Batch:
        epoch, index = divmod(evaluation, self.batches_per_epoch)
        order = self._order(epoch)
        samples = order[index * self._batch_size:(index + 1) * self._batch_size]
        if self._tensors:
            return tuple(t[samples.to(t.device)] for t in self._data)
        return self._collated(samples)

    def _order(self, epoch: int) -> torch.Tensor:
        seed = self.seed
        key = (seed, epoch)
        order = self._orders.get(key)
        if order is None:
            if self._shuffle:
                generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
                order = torch.randperm(self._size, generator=generator)
            else:
                order = torch.arange(self._size)
            if len(self._orders) >= 2:
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = order
        return order

    def _collated(self, samples: torch.Tensor) -> Batch:
        indices = samples.tolist()
        batch = _as_tensors(self._collate([self._data[i] for i in indices]), "collate_fn")
        for t in batch:
            if not _finite(t):
                raise ValueError(
                    f"data: the batch of samples {indices} holds NaN or infinite values"
                )
        return batch


def _sample_count(data: Any, collate_fn: Callable[[list[Any]], Any] | None) -> int:
    """The number of samples of ``data``, after checking it; TypeError/ValueError naming it."""
    if isinstance(data, tuple):
        if not data:
            raise ValueError("data: the tuple holds no tensors")
        for i, t in enumerate(data):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"data[{i}]: must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() == 0:
                raise ValueError(f"data[{i}]: a 0-dim tensor has no samples to index")
        sizes = [len(t) for t in data]
        if len(set(sizes)) > 1:
            raise ValueError(f"data: the tensors have different first dimensions {sizes}")
        for i, t in enumerate(data):
            if not _finite(t):
                raise ValueError(f"data[{i}]: holds NaN or infinite values")
        size = sizes[0]
    elif isinstance(data, Dataset) and not isinstance(data, IterableDataset):
        try:
            size = operator.index(len(data))  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"data: the Dataset {type(data).__name__} has no __len__; PointBatches needs a "
                "map-style Dataset of known length"
            ) from None
        if size > 0:
            # One item through the collate: a Dataset or collate_fn that cannot make a
            # batch fails here, not in the first step.
            _as_tensors((collate_fn or default_collate)([data[0]]), "collate_fn")
    else:
        raise TypeError(
            "data: must be a tuple of tensors or a map-style torch.utils.data.Dataset, got "
            f"{type(data).__name__}"
        )
    if size == 0:
        raise ValueError("data: holds no samples")
    return size


def _as_tensors(collated: Any, where: str) -> Batch:
    """A collated batch as a tuple of tensors; TypeError naming ``where`` otherwise."""
    parts = (collated,) if isinstance(collated, torch.Tensor) else collated
    if not isinstance(parts, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in parts):
        raise TypeError(
            f"{where}: must collate the items into a tensor or a tuple/list of tensors, got "
            f"{type(collated).__name__}"
        )
    return tuple(parts)


def _finite(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()):
        return True
    return bool(torch.isfinite(t).all())
