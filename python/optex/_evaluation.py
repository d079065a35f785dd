"""What runs on a worker for :func:`optex.minimize`, and the check of what it returns.

The worker side catches the objective's own exception and sends it back as a
value (:class:`Raised`), so that the parent can tell "the objective raised"
(re-raised as it is, on every executor) from "the executor could not deliver a
result" (optex.EvaluationError): with Dask, Ray or processes both would
otherwise surface the same way, as an exception of the future.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable

import numpy as np

from ._values import consumed_loss, real_gradient


@dataclasses.dataclass
class Raised:
    """The objective's exception, and its traceback as text (lost when pickled)."""

    exception: BaseException
    traceback: str


def evaluate_point(fun_and_grad: Callable[..., Any], x: np.ndarray,
                   seed: int | None) -> "tuple[float, Any] | Raised":
    """One evaluation on a worker: (loss, grad), or the objective's exception as a value."""
    try:
        out = fun_and_grad(x) if seed is None else fun_and_grad(x, seed=seed)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                "fun_and_grad: must return a (loss, grad) tuple, got " + type(out).__name__
            )
        loss, grad = out
        return consumed_loss(loss), grad
    except Exception as e:  # noqa: BLE001 - every exception of the objective travels back
        return Raised(e, traceback.format_exc())


def evaluate_or_raise(fun_and_grad: Callable[..., Any], x: np.ndarray,
                      seed: int | None) -> "tuple[float, Any]":
    """One evaluation in the calling thread (the final loss, Proxy::target's oracle)."""
    out = evaluate_point(fun_and_grad, x, seed)
    if isinstance(out, Raised):
        raise out.exception
    return out


def checked_gradient(grad: Any, dim: int, i: int) -> np.ndarray:
    """The gradient of point i under optex's rule for gradients (_values.py: a
    float32 or float64 array, or a list or tuple of real numbers read as float64;
    shape (dim,)), or a ValueError naming the point. Checked before tell()."""
    return real_gradient(grad, dim, f"fun_and_grad: the gradient at point {i}")
