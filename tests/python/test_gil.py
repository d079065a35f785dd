"""ask(), tell(), save() and the problems release the GIL while the C++ code works.

Deterministic, no timing: the switch interval is made huge, so a thread holding
the GIL keeps it until it releases it itself. The worker thread calls the
operation; the main thread can only run again when the worker releases the
GIL. If that happens inside the operation, the main thread finds the engine
busy (or the operation unfinished); if the operation never released it, the
main thread runs only after the worker has finished.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest

import optex
from optex import problems

D = 2_000_000  # large enough that the C++ work lasts milliseconds, not microseconds


def observe_during(operation: Callable[[], object], probe: Callable[[], object]) -> object:
    """Runs operation() on a worker thread and probe() on this one as soon as this
    thread gets the GIL back; returns probe's result or the exception it raised."""
    finished = []

    def worker() -> None:
        operation()
        finished.append(True)

    old_interval = sys.getswitchinterval()
    gc.collect()
    gc.disable()  # no finalizer may release the GIL behind our back
    sys.setswitchinterval(1000.0)
    try:
        thread = threading.Thread(target=worker)
        thread.start()  # waits for the worker to start: the worker holds the GIL from then on
        try:
            observed: object = probe()
        except RuntimeError as error:
            observed = error
        was_finished = bool(finished)
        thread.join()
    finally:
        sys.setswitchinterval(old_interval)
        gc.enable()
    assert finished, "the operation failed on the worker thread"
    return observed if not was_finished else "finished before this thread ran"


def big_engine() -> optex.OptEx:
    opt = optex.OptEx(np.ones(D, dtype=np.float32), optimizer=optex.Sgd(lr=0.01), parallelism=4,
                      history=4)
    for _ in range(2):
        points = opt.ask()
        opt.tell(2.0 * points, np.zeros(4))
    return opt


@pytest.fixture(scope="module")
def engine() -> optex.OptEx:
    return big_engine()


def assert_busy(observed: object) -> None:
    assert isinstance(observed, RuntimeError) and "busy" in str(observed), (
        f"the main thread did not run while the engine worked (observed: {observed!r}): "
        "the GIL was not released"
    )


def test_tell_releases_the_gil(engine: optex.OptEx) -> None:
    grads = 2.0 * engine.ask()  # outside the worker: numpy releases the GIL for it
    losses = np.zeros(4)
    assert_busy(observe_during(lambda: engine.tell(grads, losses), lambda: engine.iteration))


def test_ask_releases_the_gil(engine: optex.OptEx) -> None:
    assert not engine.pending
    assert_busy(observe_during(engine.ask, lambda: engine.pending))
    engine.tell(2.0 * engine.ask(), np.zeros(4))


def test_save_releases_the_gil(engine: optex.OptEx, tmp_path) -> None:
    assert_busy(observe_during(lambda: engine.save(tmp_path / "big.ckpt"), lambda: engine.x))


def test_problem_batches_release_the_gil() -> None:
    f = problems.Rastrigin()
    points = np.ones((4, D // 4), dtype=np.float32)
    results = []
    observed = observe_during(lambda: results.append(f.value_and_grad(points)),
                              lambda: len(results))
    assert observed == 0, f"the main thread ran only after the evaluation ({observed!r})"


def test_a_second_thread_is_refused_not_raced(engine: optex.OptEx) -> None:
    # The same mechanism shows the guard: a call from another thread while the
    # engine works raises instead of racing.
    grads = 2.0 * engine.ask()  # outside the worker: numpy releases the GIL for it
    losses = np.zeros(4)
    observed = observe_during(lambda: engine.tell(grads, losses), engine.ask)
    assert_busy(observed)
    assert "must not be used from two threads at once" in str(observed)
