"""Buffers (BatchNorm running statistics and the like) kept from the committed point.

A round calls the closure at N points. A module that updates a buffer in its
forward pass (BatchNorm in training mode) would update it N times per round,
at points the round then mostly leaves behind. With ``buffers=`` given,
``optex.torch.OptEx.step`` evaluates every point from the buffers as they were
at the start of the round and keeps the buffers that the evaluation at the
committed point left: one update per round, from the point the run continues
from, as one step of a plain optimizer makes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def buffers_of(source: Any) -> list[torch.Tensor] | None:
    """The tensors ``buffers=`` names: a module's ``buffers()``, or an iterable of
    tensors; None for None. ValueError for anything else."""
    if source is None:
        return None
    if isinstance(source, torch.nn.Module):
        tensors = list(source.buffers())
    elif isinstance(source, torch.Tensor) or not isinstance(source, Iterable):
        raise ValueError(
            "buffers: must be a torch.nn.Module, an iterable of tensors or None, "
            f"got {type(source).__name__}"
        )
    else:
        tensors = list(source)
        for j, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"buffers[{j}]: must be a tensor, got {type(t).__name__}")
    if len({id(t) for t in tensors}) != len(tensors):
        raise ValueError("buffers: contains the same tensor twice")
    return tensors


class CommittedBuffers:
    """One round's buffer values: at its start, and after each evaluation."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self._tensors = tensors
        self._start = [t.detach().clone() for t in tensors]
        self._after: dict[int, list[torch.Tensor]] = {}

    @torch.no_grad()
    def before_evaluation(self) -> None:
        """Every evaluation starts from the buffers as they were at the round's start."""
        for t, start in zip(self._tensors, self._start):
            t.copy_(start)

    def after_evaluation(self, row: int) -> None:
        """Records what evaluation ``row`` left."""
        self._after[row] = [t.detach().clone() for t in self._tensors]

    @torch.no_grad()
    def restore_start(self) -> None:
        """The round failed: the buffers as they were at its start."""
        self.before_evaluation()

    @torch.no_grad()
    def keep(self, row: int, n: int, ranks: Any = None) -> None:
        """The buffers evaluation ``row`` (of ``n``) left, on every rank: ``ranks`` (an
        exchange.Ranks, or None alone) broadcasts them from the rank that evaluated it."""
        if ranks is None:
            for t, value in zip(self._tensors, self._after[row]):
                t.copy_(value)
            return
        ranks.broadcast_from_owner(self._tensors, self._after.get(row), row, n)
