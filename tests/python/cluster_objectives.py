"""Objectives for test_cluster_executors.py that take time, at module level so
that Dask, Ray and MPI workers import them by name (objectives.py has the rest)."""

from __future__ import annotations

import time

import numpy as np

from objectives import first_time

from optex import problems


class SleepsOnce:
    """Rosenbrock, except that the first evaluation anywhere sleeps `seconds`
    (`marker` records that it happened): a round that hangs once."""

    def __init__(self, marker: str, seconds: float) -> None:
        self.marker = marker
        self.seconds = seconds

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if first_time(self.marker):
            time.sleep(self.seconds)
        return problems.Rosenbrock().value_and_grad(x)


def straggler(x: np.ndarray, seed: int) -> tuple[float, np.ndarray]:
    """Rosenbrock whose evaluations take 10 ms, except one in four (by seed) 200 ms."""
    time.sleep(0.2 if seed % 4 == 0 else 0.01)
    return problems.Rosenbrock().value_and_grad(x)
