"""optex.minimize(workers=<any concurrent.futures.Executor>): the threads' trajectory
bit for bit, and every way an executor can fail: a clear error naming the point,
the engine unchanged with its round pending, and a retry that continues the run
as if nothing had happened. (Dask, Ray and mpi4py themselves: test_cluster_executors.py.)"""

from __future__ import annotations

import concurrent.futures as cf
import math
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from objectives import DiesOnce, Unpicklable, fails_far_from_start, noisy_sphere, rosenbrock

import optex
from optex import problems

X0 = problems.Rosenbrock().standard_start(12)
RUN = dict(optimizer=optex.Adam(lr=0.01), parallelism=4, max_iters=12)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_run(a: optex.OptimizeResult, b: optex.OptimizeResult) -> bool:
    return (same_bits(a.x, b.x) and a.fun == b.fun and a.loss_history == b.loss_history
            and a.nit == b.nit and a.n_gradient_evaluations == b.n_gradient_evaluations)


class ReversedExecutor(cf.Executor):
    """Runs each batch of submissions in reverse order, on one thread, when asked
    for a result: results arrive in the opposite order to the threads'."""

    def __init__(self) -> None:
        self.queue: list[tuple[cf.Future, object, tuple]] = []
        self.lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: cf.Future = cf.Future()
        with self.lock:
            self.queue.append((future, fn, args))
        threading.Timer(0.0, self._drain).start()
        return future

    def _drain(self) -> None:
        with self.lock:
            batch, self.queue = self.queue, []
        for future, fn, args in reversed(batch):
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001
                    future.set_exception(e)


class CancellingExecutor(cf.Executor):
    """Cancels every future it is given (as a cluster that drops a job would)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: cf.Future = cf.Future()
        future.cancel()
        future.set_running_or_notify_cancel()  # what a worker does with a cancelled job
        return future


@pytest.mark.parametrize(
    "make", [lambda: cf.ThreadPoolExecutor(3), ReversedExecutor,
             lambda: cf.ProcessPoolExecutor(2)],
    ids=["thread-pool", "reversed-order", "process-pool"],
)
def test_any_executor_gives_the_threads_trajectory(make) -> None:
    threads = optex.minimize(rosenbrock, X0, **RUN)
    pool = make()
    try:
        other = optex.minimize(rosenbrock, X0, workers=pool, **RUN)
        # minimize does not shut down an executor it was given.
        assert pool.submit(abs, -1).result() == 1
    finally:
        pool.shutdown()
    assert same_run(threads, other)
    assert other.n_dropped == other.n_observed == 0


def test_seeds_travel_to_any_executor() -> None:
    kwargs = dict(optimizer=optex.Sgd(lr=0.05), parallelism=4, max_iters=8, pass_seed=True,
                  seed=3, evaluations_per_point=2)
    threads = optex.minimize(noisy_sphere, X0, **kwargs)
    with cf.ProcessPoolExecutor(2) as pool:
        processes = optex.minimize(noisy_sphere, X0, workers=pool, **kwargs)
    assert same_run(threads, processes)


def test_an_objective_exception_is_reraised_as_with_threads() -> None:
    with pytest.raises(RuntimeError, match="simulation diverged") as by_threads:
        optex.minimize(fails_far_from_start, X0, **RUN)
    with cf.ProcessPoolExecutor(2) as pool, \
            pytest.raises(RuntimeError, match="simulation diverged") as by_pool:
        optex.minimize(fails_far_from_start, X0, workers=pool, **RUN)
    assert type(by_threads.value) is type(by_pool.value) is RuntimeError
    assert not isinstance(by_pool.value, optex.EvaluationError)
    if sys.version_info >= (3, 11):
        for raised in (by_threads.value, by_pool.value):
            assert any(re.search(r"fun_and_grad at point \d+ of iteration [1-9]", note)
                       for note in raised.__notes__)


def engine_for_retry() -> optex.OptEx:
    return optex.OptEx(X0, optex.Adam(lr=0.01), parallelism=4)


def check_pending_and_unchanged(err: optex.EvaluationError, before_x: np.ndarray) -> None:
    engine = err.engine
    assert engine.pending and engine.iteration == err.iteration == 0
    assert same_bits(engine.x, before_x)
    assert engine.evaluations == 0


def test_a_shut_down_executor_is_an_evaluation_error_and_the_call_can_be_retried() -> None:
    engine = engine_for_retry()
    pool = cf.ThreadPoolExecutor(2)
    pool.shutdown()
    with pytest.raises(optex.EvaluationError, match="point 0 of iteration 0") as err:
        optex.minimize(rosenbrock, engine, workers=pool, max_iters=12)
    assert err.value.point == 0 and err.value.engine is engine
    assert isinstance(err.value.__cause__, RuntimeError)
    check_pending_and_unchanged(err.value, X0)
    retried = optex.minimize(rosenbrock, engine, max_iters=12)
    assert same_run(retried, optex.minimize(rosenbrock, X0, **RUN))


def test_a_worker_that_dies_is_an_evaluation_error_and_the_call_can_be_retried(
        tmp_path: Path) -> None:
    engine = engine_for_retry()
    objective = DiesOnce(str(tmp_path / "died"))
    with cf.ProcessPoolExecutor(2) as pool, \
            pytest.raises(optex.EvaluationError, match="ended without a result") as err:
        optex.minimize(objective, engine, workers=pool, max_iters=12)
    assert isinstance(err.value.__cause__, cf.process.BrokenProcessPool)
    # Whichever worker opens the marker first dies; the other may finish its point first.
    assert 0 <= err.value.point < 4
    assert f"point {err.value.point} of iteration 0" in str(err.value)
    check_pending_and_unchanged(err.value, X0)
    with cf.ProcessPoolExecutor(2) as fresh:
        retried = optex.minimize(objective, engine, workers=fresh, max_iters=12)
    assert same_run(retried, optex.minimize(rosenbrock, X0, **RUN))


def test_an_objective_the_executor_cannot_pickle_is_an_evaluation_error() -> None:
    engine = engine_for_retry()
    with cf.ProcessPoolExecutor(2) as pool, \
            pytest.raises(optex.EvaluationError, match="point 0 of iteration 0") as err:
        optex.minimize(Unpicklable(), engine, workers=pool, max_iters=3)
    assert "pickle" in str(err.value).lower()
    check_pending_and_unchanged(err.value, X0)
    # The same objective runs on threads, where nothing is pickled.
    assert optex.minimize(Unpicklable(), engine, max_iters=3).nit == 3


def test_a_cancelled_future_is_an_evaluation_error() -> None:
    engine = engine_for_retry()
    with pytest.raises(optex.EvaluationError, match="cancelled") as err:
        optex.minimize(rosenbrock, engine, workers=CancellingExecutor(), max_iters=3)
    check_pending_and_unchanged(err.value, X0)


def test_a_continued_engine_keeps_its_own_configuration() -> None:
    engine = engine_for_retry()
    first = optex.minimize(rosenbrock, engine, max_iters=5)
    second = optex.minimize(rosenbrock, engine, max_iters=12)  # max_iters bounds nit: 7 more
    whole = optex.minimize(rosenbrock, X0, **RUN)
    assert same_bits(second.x, whole.x) and second.nit == 12
    assert first.loss_history + second.loss_history == whole.loss_history
    with pytest.raises(ValueError, match="x0: an optex.OptEx.*optimizer, parallelism"):
        optex.minimize(rosenbrock, engine, optimizer=optex.Sgd(lr=0.1), parallelism=2)
    assert engine.iteration == 12  # refused before anything ran


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(workers=42), "workers"),
        (dict(workers="dask"), "workers"),
        (dict(workers=cf.ThreadPoolExecutor), "workers"),  # the class, not an executor
        (dict(min_results=0), "min_results"),
        (dict(min_results=5), "min_results"),  # N = 4
        (dict(min_results=True), "min_results"),
        (dict(min_results=2.0), "min_results"),
        (dict(min_results="3"), "min_results"),
        (dict(round_timeout=0), "round_timeout"),
        (dict(round_timeout=-1.0), "round_timeout"),
        (dict(round_timeout=math.nan), "round_timeout"),
        (dict(round_timeout="1"), "round_timeout"),
        (dict(round_timeout=False), "round_timeout"),
    ],
)
def test_bad_executor_and_round_arguments_name_themselves(kwargs: dict, name: str) -> None:
    engine = engine_for_retry()
    with pytest.raises(ValueError, match=name):
        optex.minimize(rosenbrock, engine, **kwargs)
    assert engine.iteration == 0 and not engine.pending
