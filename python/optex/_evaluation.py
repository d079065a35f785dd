"""What runs on a worker for :func:`optex.minimize`, and the check of what it returns.

The worker side catches the objective's own exception and sends it back as a
value (:class:`Raised`), so that the parent can tell "the objective raised"
(re-raised as it is, on every executor) from "the executor could not deliver a
result" (optex.EvaluationError): with Dask, Ray or processes both would
otherwise surface the same way, as an exception of the future. Every
exception counts, BaseExceptions too (KeyboardInterrupt, SystemExit,
GeneratorExit): a thread pool would otherwise end the future with it, and a
process pool's worker would exit.

Memory (the contract of DESIGN.md, "Memory handed to user code"). The objective
receives a point of its own (:func:`objective_point`, made by the caller
before the evaluation is submitted: the engine's batch rows are rewritten at
the next ask(), possibly while a straggler of a closed round has not started),
read-only on every executor; it may keep it. What it returns is copied
(:func:`owned_gradient`) the moment it returns, on the worker, before the
objective can be called again: an objective that writes its gradient into one
reused buffer gives the same result as one that returns fresh arrays, on a
thread pool (whose results are read once the whole round is in) as on the
executors that pickle.
"""

from __future__ import annotations

import dataclasses
import numbers
import traceback
from typing import Any, Callable

import numpy as np

from ._values import consumed_loss, real_gradient


@dataclasses.dataclass
class Raised:
    """The objective's exception, and its traceback as text (lost when pickled)."""

    exception: BaseException
    traceback: str


def as_raised(error: BaseException) -> BaseException:
    """The objective's exception as it was raised, after its trip back from a worker.

    Some pickling routes rebuild an exception without calling its __init__ (the
    reducer that Dask's distributed installs, through tblib, for every exception
    class of the process): state that __init__ derives from ``args`` is lost.
    SystemExit's exit code is such state: SystemExit(3) would come back with
    code None, an exit status of 0. It is restored from ``args``.
    """
    if isinstance(error, SystemExit) and error.code is None and error.args:
        error.code = error.args[0] if len(error.args) == 1 else error.args
    return error


def objective_point(row: Any) -> np.ndarray:
    """A point for the objective: a float32 (d,) C-contiguous copy of `row`, which
    nothing of optex writes to afterwards (evaluate_point makes it read-only)."""
    return np.array(row, dtype=np.float32, order="C", copy=True)


def owned_gradient(grad: Any) -> Any:
    """`grad` as the objective returned it, in memory the objective cannot write to
    again. Whatever holds memory (a numpy array, a tensor, a memoryview, anything
    numpy reads through ``__array__`` or the buffer protocol) becomes a numpy copy
    of the same dtype and shape, what checked_gradient's np.asarray would read; a
    list or tuple a new one, its elements copied alike. Everything else (numbers,
    str, None, what numpy cannot read) passes as it is, for checked_gradient to
    accept or refuse by name."""
    if type(grad) is list or type(grad) is tuple:
        return type(grad)(map(_owned, grad))
    return _owned(grad)


def _owned(value: Any) -> Any:
    if type(value) is float or type(value) is int:  # the common element, fast
        return value
    if isinstance(value, (list, tuple)):
        return owned_gradient(value)
    if not _holds_memory(value):
        return value
    try:
        return np.asarray(value).copy()  # not np.array(copy=True): torch has no copy=
    except Exception:  # noqa: BLE001 - a CUDA tensor, one that requires grad: named later
        return value


def _holds_memory(value: Any) -> bool:
    """Whether `value` may share memory the objective writes to again."""
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, (str, bytes, numbers.Number)) or value is None:
        return False
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        return True  # torch tensors, pandas, array-likes of other libraries
    try:
        memoryview(value)
    except TypeError:
        return False
    return True  # memoryview, bytearray, array.array, ...


def evaluate_point(fun_and_grad: Callable[..., Any], x: np.ndarray,
                   seed: int | None) -> "tuple[float, Any] | Raised":
    """One evaluation on a worker: (loss, grad), or the objective's exception as a value.

    `x` must be the evaluation's own array (objective_point's); the objective
    receives it read-only. The loss is consumed and the gradient copied
    (owned_gradient) as soon as the objective returns.
    """
    x = x.view()
    x.flags.writeable = False  # the objective's copy: writing to it is a mistake, refused
    try:
        out = fun_and_grad(x) if seed is None else fun_and_grad(x, seed=seed)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                "fun_and_grad: must return a (loss, grad) tuple, got " + type(out).__name__
            )
        loss, grad = out
        return consumed_loss(loss), owned_gradient(grad)
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt too: re-raised as it is
        return Raised(e, traceback.format_exc())


def evaluate_or_raise(fun_and_grad: Callable[..., Any], x: Any,
                      seed: int | None) -> "tuple[float, Any]":
    """One evaluation in the calling thread (the final loss, Proxy::target's oracle),
    at a copy of `x` (the final x is also the result's)."""
    out = evaluate_point(fun_and_grad, objective_point(x), seed)
    if isinstance(out, Raised):
        raise out.exception
    return out


def checked_gradient(grad: Any, dim: int, i: int) -> np.ndarray:
    """The gradient of point i under optex's rule for gradients (_values.py: a
    float32 or float64 array, or a list or tuple of real numbers read as float64;
    shape (dim,)), or a ValueError naming the point. Checked before tell()."""
    return real_gradient(grad, dim, f"fun_and_grad: the gradient at point {i}")
