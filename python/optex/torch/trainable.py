"""Which parameters the engine optimizes, and the optimizer state of the others.

torch.optim steps a parameter only when it has a gradient, counts steps per
parameter, and keeps the state of a parameter it stops stepping. The engine
optimizes one flat float32 vector with one step count. This module reconciles
the two:

- The engine's vector holds the *trainable* parameters, those with
  ``requires_grad``, group by group (``trainable_groups``). When that set
  changes (``add_param_group``, a parameter frozen or unfrozen), ``rebuild``
  makes a new engine over the new set: the parameters that stay keep their
  optimizer state, those that leave put theirs on the ``Shelf``, those that
  come back take theirs from it, and new ones start from zeros. The GP history
  restarts then: its points and gradients live in the old vector's space.
- Each parameter has a *step offset*: its own step count is the engine's minus
  the offset. A parameter that joins when the engine's step count is k gets
  offset k (so Adam's bias correction starts at 1 for it, as torch.optim's
  per-parameter ``step``), and a round in which a parameter had no gradient
  adds that round's steps to its offset (``StepOffsets.skip``).
- ``engine_ranges`` gives the engine its hyperparameters per range: one range
  per run of consecutive parameters with one optimizer value and one offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .layout import FlatLayout, Segment


def trainable_groups(param_groups: Sequence[dict[str, Any]]) -> list[list[torch.Tensor]]:
    """The parameters with ``requires_grad`` of each param group, in order."""
    return [[p for p in group["params"] if p.requires_grad] for group in param_groups]


def same_parameters(layout: FlatLayout, groups: Sequence[Sequence[torch.Tensor]]) -> bool:
    """Whether ``layout`` holds exactly ``groups`` (the same tensors, in the same groups, in order)."""
    wanted = [(g, id(p)) for g, params in enumerate(groups) for p in params]
    have = [(layout.group_of(j), id(p)) for j, p in enumerate(layout.params)]
    return wanted == have


class StepOffsets:
    """Each parameter's step offset (by identity); 0 unless set."""

    def __init__(self) -> None:
        self._offsets: dict[int, int] = {}

    def of(self, p: torch.Tensor) -> int:
        return self._offsets.get(id(p), 0)

    def set(self, p: torch.Tensor, offset: int) -> None:
        self._offsets[id(p)] = int(offset)

    def forget(self, p: torch.Tensor) -> None:
        self._offsets.pop(id(p), None)

    def skip(self, params: Sequence[torch.Tensor], steps: int) -> None:
        """``params`` were left unchanged by a round that advanced the engine ``steps`` steps."""
        for p in params:
            self.set(p, self.of(p) + steps)


def engine_ranges(layout: FlatLayout, optimizers: Sequence[Any],
                  offsets: StepOffsets) -> list[tuple[int, Any, int]]:
    """(size, optimizer, step offset) for each run of consecutive parameters of
    ``layout`` with one optimizer value and one offset (``optimizers[g]`` is param
    group g's): groups with equal hyperparameters share a range."""
    ranges: list[tuple[int, Any, int]] = []
    for j, (p, segment) in enumerate(zip(layout.params, layout.segments())):
        if segment.size == 0:
            continue
        optimizer, offset = optimizers[layout.group_of(j)], offsets.of(p)
        if ranges and ranges[-1][1] == optimizer and ranges[-1][2] == offset:
            ranges[-1] = (ranges[-1][0] + segment.size, optimizer, offset)
        else:
            ranges.append((segment.size, optimizer, offset))
    return ranges


def engine_optimizer(ranges: Sequence[tuple[int, Any, int]]) -> Any:
    """The engine's ``optimizer=`` for ``ranges``: the lone optimizer when one range
    with offset 0 covers everything (the engine's plain form), else the list of
    (size, optimizer, step offset)."""
    if len(ranges) == 1 and ranges[0][2] == 0:
        return ranges[0][1]
    return [tuple(r) for r in ranges]


def range_entries(ranges: Sequence[tuple[int, Any, int]]) -> list[dict[str, Any]]:
    """``ranges`` as ``optex.OptEx.state_arrays()``'s "optimizer" entry: per range its
    size, class name, step offset and hyperparameters by name."""
    entries = []
    for size, optimizer, offset in ranges:
        cls = type(optimizer)
        entry: dict[str, Any] = {"size": int(size), "kind": cls.__name__, "step_offset": int(offset)}
        entry.update({name: getattr(optimizer, name) for name in cls.hyperparameters})
        entries.append(entry)
    return entries


def merged_segments(layout: FlatLayout, which: Sequence[bool]) -> list[tuple[int, int]]:
    """(offset, size) of the runs of consecutive non-empty parameters j with ``which[j]``."""
    runs: list[tuple[int, int]] = []
    for chosen, segment in zip(which, layout.segments()):
        if not chosen or segment.size == 0:
            continue
        if runs and runs[-1][0] + runs[-1][1] == segment.offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + segment.size)
        else:
            runs.append((segment.offset, segment.size))
    return runs


class Shelf:
    """The optimizer state of parameters outside the engine: per parameter (by
    identity), its slots (name -> flat float32 CPU tensor) and its own step count."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[dict[str, torch.Tensor], int]] = {}

    def put(self, p: torch.Tensor, slots: dict[str, torch.Tensor], step: int) -> None:
        self._entries[id(p)] = (slots, int(step))

    def take(self, p: torch.Tensor) -> tuple[dict[str, torch.Tensor], int] | None:
        return self._entries.pop(id(p), None)

    def get(self, p: torch.Tensor) -> tuple[dict[str, torch.Tensor], int] | None:
        return self._entries.get(id(p))

    def clear(self) -> None:
        self._entries.clear()


def _slice(array: np.ndarray, segment: Segment) -> np.ndarray:
    return array[segment.offset:segment.stop]


def rebuild_state(state: dict[str, Any], old: FlatLayout, new: FlatLayout,
                  offsets: StepOffsets, shelf: Shelf) -> dict[str, Any]:
    """The engine state (``optex.OptEx.state_arrays(history=False)``'s dict) carried
    from layout ``old`` to layout ``new``: the iterate is the parameters' values
    (the caller checked that the staying ones hold the old iterate), the slots of a
    staying parameter are its old ones, a returning parameter's come from the shelf,
    a new one's are zeros; leaving parameters go onto the shelf. Sets the step
    offsets of the parameters that join. The optimizer entry is the caller's to set."""
    step = int(state["step"])
    old_slots: dict[str, np.ndarray] = state["slots"]
    old_index = {id(p): j for j, p in enumerate(old.params)}
    new_ids = {id(p) for p in new.params}
    segments = old.segments()
    for j, p in enumerate(old.params):
        if id(p) not in new_ids:
            slots = {name: torch.from_numpy(_slice(a, segments[j]).copy()) for name, a in old_slots.items()}
            shelf.put(p, slots, step - offsets.of(p))
            offsets.forget(p)
    x = new.flatten().cpu().numpy()
    slots = {name: np.zeros(new.dim, dtype=np.float32) for name in old_slots}
    for p, segment in zip(new.params, new.segments()):
        j = old_index.get(id(p))
        if j is not None:
            for name, a in old_slots.items():
                _slice(slots[name], segment)[:] = _slice(a, segments[j])
            continue
        shelved = shelf.take(p)
        own_step = 0
        if shelved is not None:
            saved, own_step = shelved
            for name, values in saved.items():
                if name in slots:
                    _slice(slots[name], segment)[:] = values.numpy()
        offsets.set(p, step - min(own_step, step))
    result = {key: value for key, value in state.items() if key != "history"}
    result["x"] = x
    result["slots"] = slots
    return result
