"""What a loss and a gradient may be: one rule for every entry point of optex.

optex.minimize (the objective's return), OptEx.tell and OptEx.observe (their
lists, through the compiled module's float_array) and optex.plan (its
objective's first result) all apply the functions below, so that each accepts
and refuses the same values with the same words.

A **loss** is a real number: a Python ``int`` or ``float``, a numpy real scalar
(integer or floating), or an array holding exactly one of those (0-d or
one-element numpy arrays such as ``np.array([loss])``, as scipy.optimize
accepts; a 0-d or one-element torch tensor). Refused, with a ValueError naming
the value: ``str``, ``bytes``, ``bool`` and ``numpy.bool_``, ``complex``,
``None``, lists, arrays of more than one element or of a non-real dtype, any
other object, and an ``int`` beyond the float64 range. NaN and infinities are
real numbers: accepted here (minimize drops such a pair, as
``tell(drop_nonfinite=True)`` does).

A **gradient** is a float32 or float64 array (an array of any other dtype,
integer, float16, bool, complex, str or object, is refused naming the dtype,
never cast: almost always a bug upstream), or a list or tuple of real
numbers (nested for several rows), read as float64. Inside a list, the same
scalars as a loss, or real arrays; ``bool``, ``str`` (numeric strings
included: ``["1.0", "2.0"]``), ``bytes``, ``complex``, ``None`` and other
objects are refused.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import reprlib
from typing import Any

import numpy as np

_REAL_KINDS = "fiu"  # numpy dtype kinds of real numbers: floating, signed, unsigned
_GRADIENT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_short = reprlib.Repr()
_short.maxstring = 40
_short.maxother = 40


def shown(value: Any) -> str:
    """A value as a refusal names it: its (shortened) repr and its type."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype} (ndarray)"
    return f"{_short.repr(value)} ({type(value).__name__})"


@functools.lru_cache(maxsize=None)
def _is_real_type(kind: type) -> bool:
    """Whether values of type `kind` are real numbers: int, float, numpy real scalars
    (any numbers.Real), not bool or numpy.bool_."""
    if issubclass(kind, (bool, np.bool_)):
        return False
    return issubclass(kind, (numbers.Real, np.integer, np.floating))


def _is_real_scalar(value: Any) -> bool:
    return _is_real_type(type(value))


def _is_torch_tensor(value: Any) -> bool:
    # Duck-typed: `import optex` never imports torch.
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _as_real(value: Any) -> "float | str":
    """The loss `value` as a float, or the reason it is not one (a str)."""
    if _is_torch_tensor(value):
        if value.numel() != 1:
            return f"must be a real number, got a tensor of shape {tuple(value.shape)}"
        item = value.detach().reshape(-1)[0].item()  # a Python float, int, bool or complex
        if not _is_real_scalar(item):
            return f"must be a real number, got a tensor of dtype {value.dtype}"
        value = item
    elif isinstance(value, np.ndarray):
        if value.size != 1:
            return f"must be a real number, got {shown(value)}"
        if value.dtype.kind not in _REAL_KINDS:
            return f"must be a real number, got {shown(value)}"
        value = value.reshape(-1)[0]
    if not _is_real_scalar(value):
        return f"must be a real number, got {shown(value)}"
    try:
        return float(value)
    except OverflowError:
        return f"must be a real number within the float64 range, got {shown(value)}"


@dataclasses.dataclass(frozen=True)
class RefusedLoss:
    """Why a loss was refused, sent from a worker to the parent that names the point."""

    reason: str


def consumed_loss(value: Any) -> "float | RefusedLoss":
    """The loss as a float the moment the objective returns it (on the worker), or
    why it is refused: the parent, which knows the point, raises (received_loss)."""
    real = _as_real(value)
    return RefusedLoss(real) if isinstance(real, str) else real


def real_loss(value: Any, subject: str) -> float:
    """The loss `value` as a float; ValueError "<subject> must be a real number,
    got 'abc' (str)" otherwise. Accepts what consumed_loss returned too."""
    if isinstance(value, RefusedLoss):
        raise ValueError(f"{subject} {value.reason}")
    real = _as_real(value)
    if isinstance(real, str):
        raise ValueError(f"{subject} {real}")
    return real


def _first_non_real(values: Any, index: tuple[int, ...]) -> "tuple[tuple[int, ...], Any] | None":
    """The index and value of the first element of a (nested) list or tuple that is
    not a real number or a real array; None when all are."""
    if all(_is_real_type(kind) for kind in set(map(type, values))):
        return None  # one check per distinct type: a list of a million floats costs little
    for i, v in enumerate(values):
        if _is_real_scalar(v):
            continue
        if isinstance(v, (list, tuple)):
            found = _first_non_real(v, index + (i,))
            if found is not None:
                return found
            continue
        if isinstance(v, np.ndarray) or _is_torch_tensor(v):
            try:
                kind = np.asarray(v).dtype.kind
            except Exception:  # noqa: BLE001 - a tensor numpy cannot read (CUDA, grad)
                return index + (i,), v
            if kind in _REAL_KINDS:
                continue
        return index + (i,), v
    return None


def real_list(values: "list | tuple", subject: str) -> np.ndarray:
    """A (nested) list or tuple of real numbers as a float64 array; ValueError naming
    the first element that is not one ("<subject> must hold real numbers, got '1.0'
    (str) at index (3,)"), or saying that it cannot be converted (ragged, too large)."""
    found = _first_non_real(values, ())
    if found is not None:
        where, value = found
        raise ValueError(f"{subject} must hold real numbers, got {shown(value)} at index {where}")
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{subject} cannot be converted to a float array ({e})") from e


def real_gradient(value: Any, dim: int, subject: str) -> np.ndarray:
    """The gradient `value` as a float32 or float64 (dim,) array (no copy of an array
    that already is one; a list or tuple becomes float64), or a ValueError naming
    `subject` and what is wrong: the kind of value, the dtype, or the shape."""
    if isinstance(value, (list, tuple)):
        grad = real_list(value, subject)
    else:
        if isinstance(value, (str, bytes)) or value is None:
            raise ValueError(f"{subject} must be an array of real numbers, got {shown(value)}")
        try:
            grad = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - whatever numpy cannot read
            raise ValueError(f"{subject} cannot be converted to a float array ({e})") from e
        # The compiled module's wording for an array of any other dtype (arrays.cpp).
        if grad.dtype not in _GRADIENT_DTYPES:
            raise ValueError(
                f"{subject}: dtype {grad.dtype} is not supported: return float32 or float64 "
                "(for example grad.astype(numpy.float32))"
            )
    if grad.shape != (dim,):
        raise ValueError(f"{subject} has shape {grad.shape}, expected ({dim},)")
    return grad
