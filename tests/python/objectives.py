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


def returns_string_loss(x: np.ndarray) -> tuple[str, np.ndarray]:
    """A loss that is not a real number (refused by optex's rule for values)."""
    return "abc", rosenbrock(x)[1]
