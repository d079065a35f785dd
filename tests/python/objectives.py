"""Objectives for the minimize tests, at module level so that worker processes
(started with "spawn") can import them by name."""

from __future__ import annotations

import numpy as np

from optex import problems


def rosenbrock(x: np.ndarray) -> tuple[float, np.ndarray]:
    return problems.Rosenbrock().value_and_grad(x)


def pure_python_quadratic(x: np.ndarray) -> tuple[float, list[float]]:
    """Holds the GIL the whole time: the case worker processes exist for."""
    values = [float(v) for v in x]
    loss = sum((i + 1) * (v - 1.0) ** 2 for i, v in enumerate(values))
    grad = [2.0 * (i + 1) * (v - 1.0) for i, v in enumerate(values)]
    return loss, grad


def noisy_sphere(x: np.ndarray, seed: int) -> tuple[float, np.ndarray]:
    """A stochastic gradient whose noise is a pure function of the seed."""
    rng = np.random.default_rng(seed)
    g = 2.0 * x.astype(np.float64) + 0.1 * rng.standard_normal(x.size)
    return float(np.dot(x, x)), g


def fails_far_from_start(x: np.ndarray) -> tuple[float, np.ndarray]:
    if float(x[0]) > -1.15:  # the start is -1.2: fails once Adam has moved it
        raise RuntimeError("simulation diverged")
    return problems.Rosenbrock().value_and_grad(x)


def wrong_shape(x: np.ndarray) -> tuple[float, np.ndarray]:
    return 0.0, np.zeros(x.size + 1)


def not_a_pair(x: np.ndarray) -> float:
    return 0.0


def first_time(marker: str) -> bool:
    """True for the first caller anywhere (any process): it creates `marker`."""
    import os

    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class DiesOnce:
    """Rosenbrock, except that the first evaluation anywhere kills its worker
    process (os._exit, as a crash or the OOM killer would): `marker` records it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if first_time(self.marker):
            import os

            os._exit(1)
        return problems.Rosenbrock().value_and_grad(x)


class Unpicklable:
    """Rosenbrock behind an object that cannot be pickled (it holds a lock)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        return problems.Rosenbrock().value_and_grad(x)


# ---- objectives that hold on to memory (test_memory_contract.py) ----------------

_GRADIENT_BUFFERS: dict = {}  # (process, thread, d, dtype) -> the one buffer it reuses


def _reused_buffer(like: np.ndarray) -> np.ndarray:
    import os
    import threading

    key = (os.getpid(), threading.get_ident(), like.shape, like.dtype.str)
    buffer = _GRADIENT_BUFFERS.get(key)
    if buffer is None:
        buffer = _GRADIENT_BUFFERS[key] = np.empty_like(like)
    return buffer


def half_square(x: np.ndarray) -> tuple[float, np.ndarray]:
    """0.5 ||x||^2 and its gradient x, in float64 (fresh arrays)."""
    x64 = x.astype(np.float64)
    return 0.5 * float(np.sum(x64**2)), x64


class Thrifty:
    """`fresh`'s (loss, gradient) as an objective that saves memory computes it:
    it keeps every x it receives (a memo), with a copy taken at the call, in
    `kept`, and writes every gradient into one buffer (one per thread), which it
    returns. On processes `kept` stays in the workers (it is not pickled)."""

    def __init__(self, fresh=None) -> None:
        self.fresh = fresh if fresh is not None else rosenbrock
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []

    def __getstate__(self) -> dict:
        return {"fresh": self.fresh}  # not `kept`: it stays in the sending process

    def __setstate__(self, state: dict) -> None:
        self.fresh = state["fresh"]
        self.kept = []

    def __call__(self, x: np.ndarray, seed: int | None = None) -> tuple[float, np.ndarray]:
        self.kept.append((x, np.array(x, copy=True)))  # append is atomic under the GIL
        loss, grad = self.fresh(x)
        buffer = _reused_buffer(np.asarray(grad))
        buffer[...] = grad
        return loss, buffer

    def changed(self) -> int:
        """How many kept points differ from their copy taken at the call, bit for bit."""
        return sum(x.tobytes() != at_call.tobytes() for x, at_call in self.kept)


def rosenbrock_with_seed(x: np.ndarray, seed: int | None = None) -> tuple[float, np.ndarray]:
    """Rosenbrock with fresh arrays, taking (and ignoring) a seed as ThriftyRosenbrock does."""
    return problems.Rosenbrock().value_and_grad(x)


def point_is_read_only(x: np.ndarray) -> tuple[float, np.ndarray]:
    """Rosenbrock, after checking that the point it was given cannot be written."""
    if x.flags.writeable:
        raise AssertionError("the objective's point is writable")
    return problems.Rosenbrock().value_and_grad(x)


def raises_keyboard_interrupt(x: np.ndarray) -> tuple[float, np.ndarray]:
    raise KeyboardInterrupt("interrupted inside the objective")


def raises_system_exit(x: np.ndarray) -> tuple[float, np.ndarray]:
    raise SystemExit(3)


def raises_generator_exit(x: np.ndarray) -> tuple[float, np.ndarray]:
    raise GeneratorExit("closed inside the objective")


def returns_string_loss(x: np.ndarray) -> tuple[str, np.ndarray]:
    """A loss that is not a real number (refused by optex's rule for values)."""
    return "abc", rosenbrock(x)[1]
