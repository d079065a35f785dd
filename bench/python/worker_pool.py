"""A persistent pool of worker processes that evaluates batches of (params, seed) jobs.

Every method of every runner evaluates its gradients through ``WorkerPool.evaluate``,
so the N evaluations of a round run in parallel the same way for all of them.

- Processes start with the ``spawn`` context (safe beside threads in the parent,
  the same on every platform); each one imports the objectives' modules
  (``sys.path`` travels with spawn, so bench/python need only be on the parent's).
- The pool is created once per runner invocation and reused, so process start-up
  and imports (gymnasium, scikit-learn) are paid before any timed round:
  ``WorkerPool`` returns only after every worker has finished its initializer.
- An objective is pickled with each job; objectives are small frozen dataclasses
  that build their heavy state (environments, data sets) once per process, on
  first use, and cache it.
- ``workers=0`` evaluates in the calling process (no parallelism), for debugging.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Sequence

from methods import Evaluation, Job, StochasticObjective


def default_workers(parallelism: int) -> int:
    """min(N, CPU count): one process per gradient evaluation of a round, at most one per core."""
    return max(1, min(parallelism, os.cpu_count() or 1))


_initialization_error: BaseException | None = None


def _initialize(barrier: Any, objectives: Sequence[StochasticObjective]) -> None:
    """Runs once in each worker: warm the objectives' caches, then wait for every worker.

    A failure is kept and raised by every job instead: an initializer that raises would
    make multiprocessing.Pool restart the worker forever.
    """
    global _initialization_error
    try:
        for objective in objectives:
            warm = getattr(objective, "warm_up", None)
            if warm is not None:
                warm()
    except BaseException as error:  # noqa: BLE001 - re-raised by the jobs
        _initialization_error = error
    barrier.wait()


def _check_initialized() -> None:
    if _initialization_error is not None:
        raise RuntimeError("worker initialization failed") from _initialization_error


def _ready(_: int) -> None:
    _check_initialized()


def _evaluate(job: tuple[StochasticObjective, Any, int]) -> Evaluation:
    _check_initialized()
    objective, params, seed = job
    return objective(params, seed)


class WorkerPool:
    """``workers`` spawned processes evaluating jobs; use as a context manager."""

    def __init__(self, workers: int, objectives: Sequence[StochasticObjective] = ()):
        if not (isinstance(workers, int) and workers >= 0):
            raise ValueError(f"workers: must be an int >= 0, got {workers!r}")
        self.workers = workers
        self._pool = None
        if workers == 0:
            for objective in objectives:
                warm = getattr(objective, "warm_up", None)
                if warm is not None:
                    warm()
            return
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(workers)
        self._pool = context.Pool(workers, initializer=_initialize, initargs=(barrier, tuple(objectives)))
        # A job runs only after its worker's initializer, which waits for all workers: when
        # these return, every process is up and warm.
        self._pool.map(_ready, range(workers), chunksize=1)

    def evaluate(self, objective: StochasticObjective, jobs: Sequence[Job]) -> list[Evaluation]:
        """Evaluates ``objective`` at every (params, seed) job; results in job order."""
        tasks = [(objective, params, seed) for params, seed in jobs]
        if self._pool is None:
            return [_evaluate(task) for task in tasks]
        # chunksize 1: jobs are few and long, so each goes to the next free worker.
        return self._pool.map(_evaluate, tasks, chunksize=1)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        self.close()
