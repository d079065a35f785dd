"""The flat parameter layout: every parameter of every param group in one vector.

The engine optimizes one float32 vector x of dimension d; torch.optim holds a
list of param groups, each a list of tensors. A ``FlatLayout`` maps one onto
the other: the param groups in order, then the parameters of each group, each
flattened in row-major order. Parameters of another floating dtype hold the
float32 values cast to their dtype, and their gradients are rounded to
float32. All parameters are on one device (``optex.torch.OptEx`` checks that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch


class Segment(NamedTuple):
    """Where a parameter, or a param group, lies in the flat vector."""

    offset: int
    size: int

    @property
    def stop(self) -> int:
        return self.offset + self.size


class FlatLayout:
    """The parameters of ``param_groups`` (a list of lists of tensors) laid end to end.

    ValueError when they have no elements at all. ``group_of(j)`` is the index in
    ``param_groups`` of parameter j.
    """

    def __init__(self, param_groups: Sequence[Sequence[torch.Tensor]]) -> None:
        self._params: list[torch.Tensor] = []
        self._segments: list[Segment] = []
        self._groups: list[Segment] = []
        self._group_of: list[int] = []
        offset = 0
        for g, params in enumerate(param_groups):
            group_start = offset
            for p in params:
                self._params.append(p)
                self._segments.append(Segment(offset, p.numel()))
                self._group_of.append(g)
                offset += p.numel()
            self._groups.append(Segment(group_start, offset - group_start))
        if offset == 0:
            raise ValueError("params: the parameters have no elements")
        self._dim = offset

    @property
    def dim(self) -> int:
        """d, the length of the flat vector."""
        return self._dim

    @property
    def params(self) -> list[torch.Tensor]:
        """The parameters, in the order of the flat vector."""
        return list(self._params)

    @property
    def device(self) -> torch.device:
        """The parameters' device."""
        return self._params[0].device

    def group_of(self, j: int) -> int:
        """The param group of parameter j (an index into the ``param_groups`` given)."""
        return self._group_of[j]

    def segments(self) -> list[Segment]:
        """Where each parameter lies, in the order of :attr:`params`."""
        return list(self._segments)

    def group_ranges(self) -> list[Segment]:
        """Where each param group lies: its parameters are contiguous in the flat
        vector (size 0 for a group without elements)."""
        return list(self._groups)

    def _pairs(self) -> Iterator[tuple[torch.Tensor, Segment]]:
        return zip(self._params, self._segments)

    @torch.no_grad()
    def flatten(self) -> torch.Tensor:
        """The parameters' values as a new float32 vector on their device."""
        flat = torch.empty(self._dim, dtype=torch.float32, device=self.device)
        for p, (offset, n) in self._pairs():
            flat[offset:offset + n].copy_(p.reshape(-1))
        return flat

    @torch.no_grad()
    def write(self, flat: torch.Tensor) -> None:
        """Copies ``flat`` (dimension d) into the parameters, cast to each one's dtype."""
        for p, (offset, n) in self._pairs():
            p.copy_(flat[offset:offset + n].view(p.shape))

    def clear_grads(self) -> None:
        """Sets every parameter's ``.grad`` to None."""
        for p in self._params:
            p.grad = None

    @torch.no_grad()
    def read_grads(self, out: torch.Tensor) -> list[bool]:
        """Copies the parameters' gradients into ``out`` (dimension d, float32); a
        parameter whose ``.grad`` is None contributes zeros. Returns, per parameter,
        whether it had a gradient. ValueError for a sparse gradient."""
        had = []
        for p, (offset, n) in self._pairs():
            g = p.grad
            had.append(g is not None)
            if g is None:
                out[offset:offset + n].zero_()
            elif g.is_sparse:
                raise ValueError("closure: produced a sparse gradient; optex.torch.OptEx needs dense gradients")
            else:
                out[offset:offset + n].copy_(g.reshape(-1))
        return had

    @torch.no_grad()
    def check_holds(self, flat: torch.Tensor, skip: Callable[[torch.Tensor], bool] | None = None) -> None:
        """RuntimeError unless the parameters (but those ``skip`` names) hold ``flat``,
        the iterate the engine committed (the engine cannot adopt values changed
        behind its back)."""
        for j, (p, (offset, n)) in enumerate(self._pairs()):
            if skip is not None and skip(p):
                continue
            expected = flat[offset:offset + n].view(p.shape).to(p.dtype)
            if not torch.equal(p, expected):
                raise RuntimeError(
                    f"step: parameter {j} (in the order param groups, then parameters) no "
                    "longer holds the iterate that the last step (or load_state_dict) "
                    "committed: it was changed outside step(). The OptEx engine owns the "
                    "iterate and cannot adopt new values without losing its history; "
                    "restore the values (e.g. load the matching model checkpoint) or "
                    "construct a new optimizer"
                )
