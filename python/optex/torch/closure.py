"""The closure protocol of ``torch.optim.LBFGS``, as ``optex.torch.OptEx.step`` uses it.

The closure zeroes the gradients, computes the loss, calls ``backward()`` and
returns the loss. ``step`` calls it once per point: the point is written into
the parameters first, and the gradients are read from them afterwards.

What the closure hands back is taken when it returns, before the next call:
the gradients are copied out of ``.grad`` (which is then set to None, never
written into), and the loss is read and, as a tensor, copied. So a closure
that writes its loss or gradients into buffers it reuses, or keeps the
``.grad`` tensors it produced, gives the same round as one that makes fresh
tensors each call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._values import real_loss
from .layout import FlatLayout

Closure = Callable[[], Any]


def check_closure(closure: Any) -> None:
    """ValueError unless ``closure`` is a callable (step() has no closure-free form)."""
    if closure is None or not callable(closure):
        raise ValueError(
            "closure: optex.torch.OptEx.step needs a closure that zeroes the gradients, "
            "computes the loss, calls loss.backward() and returns the loss "
            f"(as torch.optim.LBFGS), got {closure!r}"
        )


def evaluate(closure: Closure, layout: FlatLayout, point: torch.Tensor,
             grad_out: torch.Tensor) -> tuple[Any, float, list[bool]]:
    """Writes ``point`` (float32, on the parameters' device) into the parameters, calls
    the closure, writes the gradient into ``grad_out``; returns (the closure's value as
    received: ``received_loss``, the loss as a float, per parameter whether it got a
    gradient). ValueError when
    no parameter got one: the closure did not call ``backward()`` (a step on zero
    gradients would move the parameters on momentum alone)."""
    layout.write(point)
    layout.clear_grads()
    with torch.enable_grad():
        result = closure()
    loss = _loss_of(result)
    had = layout.read_grads(grad_out)
    if not any(had):
        raise ValueError(
            "closure: no trainable parameter received a gradient (every .grad is still None "
            "after the call); the closure must call loss.backward() before returning the loss"
        )
    return received_loss(result), loss, had


def received_loss(result: Any) -> Any:
    """The closure's loss as ``step`` keeps it until the round ends: a tensor is
    copied (detached: its graph was used by ``backward()``), since a closure may
    write every call's loss into one tensor; a number is kept as it is."""
    if isinstance(result, torch.Tensor):
        return result.detach().clone()
    return result


def _loss_of(result: Any) -> float:
    if result is None:
        raise ValueError(
            "closure: returned None; it must return the loss (the closure zeroes the "
            "gradients, computes the loss, calls loss.backward() and returns the loss)"
        )
    if isinstance(result, torch.Tensor):
        if result.numel() != 1:
            raise ValueError(
                f"closure: must return a scalar loss, got a tensor of shape {tuple(result.shape)}"
            )
    # optex's one rule for a loss (optex._values), as minimize, tell and plan apply it:
    # a real number, a one-element tensor or array; no bool, complex, str or None.
    return real_loss(result, "closure: must return the loss (a scalar tensor or a real "
                             "number); the value it returned")


def committed_rows(point: int, point_evaluations: list[int]) -> range:
    """The batch rows of the round's distinct ``point`` (the rows of a point are
    consecutive; ``point_evaluations`` is IterationInfo's)."""
    first = sum(point_evaluations[:point])
    return range(first, first + point_evaluations[point])


def loss_at(rows: range, point_loss: float, results: dict[int, Any], losses: torch.Tensor) -> Any:
    """What step returns for the committed point, evaluated at batch ``rows``. With one
    evaluation, the closure's own value if this process evaluated it, otherwise the
    gathered loss; with several, ``point_loss``, the mean of its admissible evaluations
    (IterationInfo.loss). A value that is not the closure's own is a 0-dim tensor of the
    dtype and device of this process's own results (a float if they are not tensors)."""
    if len(rows) == 1:
        (row,) = rows
        if row in results:
            return results[row]
        value = float(losses[row])
    else:
        value = float(point_loss)
    like = next((r for r in results.values() if isinstance(r, torch.Tensor)), None)
    if like is None:
        return value
    return torch.tensor(value, dtype=like.dtype, device=like.device)
