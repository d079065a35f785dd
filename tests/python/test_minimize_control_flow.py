"""optex.minimize's control flow keeps the run: a retry after an error ends where the
run without the error does, a callback stops the run by returning True or raising
StopIteration, a round with nothing finite raises an error that carries the engine,
every numeric argument that passes its check runs, and the verified mode refuses
partial rounds up front."""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading

import numpy as np
import pytest
from objectives import rosenbrock

import optex
from optex import problems
from optex.executors import VirtualClockExecutor

X0 = problems.Rosenbrock().standard_start(12)
CONFIG = dict(optimizer=optex.Adam(lr=0.01), parallelism=4)
N = 4
MAX_ITERS = 12
FAIL_AT = 5  # the round that fails once


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def engine() -> optex.OptEx:
    return optex.OptEx(X0, **CONFIG)


@pytest.fixture(scope="module")
def uninterrupted() -> optex.OptimizeResult:
    return optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS, **CONFIG)


class FailsOnceAt:
    """rosenbrock, raising once at the first call of round `fail_at` (calls are
    counted: every round makes exactly N of them before the next starts)."""

    def __init__(self, fail_at: int) -> None:
        self.first_failing_call = fail_at * N
        self.calls = 0
        self.failed = False
        self.lock = threading.Lock()

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        with self.lock:
            call, self.calls = self.calls, self.calls + 1
            fail = not self.failed and call >= self.first_failing_call
            self.failed |= fail
        if fail:
            raise ConnectionError("the simulator went away")
        return rosenbrock(x)


class SubmitFailsOnceAt(cf.ThreadPoolExecutor):
    """A thread pool whose submit() refuses once, at round `fail_at`: an EvaluationError."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(max_workers=N)
        self.failing_submit = fail_at * N + 2
        self.submits = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        self.submits += 1
        if self.submits == self.failing_submit:
            raise RuntimeError("lost the connection to the scheduler")
        return super().submit(fn, *args, **kwargs)


# ---- the documented retry ------------------------------------------------------------


def check_same_end(retried: optex.OptimizeResult, first_losses: list[float],
                   uninterrupted: optex.OptimizeResult) -> None:
    assert retried.nit == uninterrupted.nit == MAX_ITERS  # not 5 + 12 = 17
    assert same_bits(retried.x, uninterrupted.x)
    assert retried.fun == uninterrupted.fun
    assert retried.n_gradient_evaluations == uninterrupted.n_gradient_evaluations == N * 12 + 1
    assert retried.stop_reason == uninterrupted.stop_reason == "max_iters"
    # The retry's history is the rounds it committed, from the pending iteration on.
    assert len(retried.loss_history) == MAX_ITERS - FAIL_AT
    assert first_losses + retried.loss_history == uninterrupted.loss_history


def test_a_retry_with_err_engine_ends_where_the_uninterrupted_run_does(uninterrupted) -> None:
    first_losses: list[float] = []
    with SubmitFailsOnceAt(FAIL_AT) as pool, \
            pytest.raises(optex.EvaluationError, match=f"iteration {FAIL_AT}") as err:
        optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS, workers=pool,
                       callback=lambda info: first_losses.append(info.loss), **CONFIG)
    assert err.value.iteration == FAIL_AT and err.value.engine.pending
    assert len(first_losses) == FAIL_AT
    retried = optex.minimize(rosenbrock, err.value.engine, max_iters=MAX_ITERS)
    check_same_end(retried, first_losses, uninterrupted)


def test_a_retry_after_the_objective_raised_ends_where_the_uninterrupted_run_does(
        uninterrupted) -> None:
    objective = FailsOnceAt(FAIL_AT)
    first_losses: list[float] = []
    mine = engine()
    with pytest.raises(ConnectionError, match="went away"):
        optex.minimize(objective, mine, max_iters=MAX_ITERS,
                       callback=lambda info: first_losses.append(info.loss))
    assert mine.pending and mine.iteration == FAIL_AT
    retried = optex.minimize(objective, mine, max_iters=MAX_ITERS)
    check_same_end(retried, first_losses, uninterrupted)


def test_max_iters_bounds_the_engines_iterations_when_continued_on_purpose(
        uninterrupted) -> None:
    mine = engine()
    first = optex.minimize(rosenbrock, mine, max_iters=5)
    more = optex.minimize(rosenbrock, mine, max_iters=mine.iteration + 7)  # 7 more rounds
    assert (first.nit, more.nit) == (5, 12) and len(more.loss_history) == 7
    assert same_bits(more.x, uninterrupted.x)
    assert first.loss_history + more.loss_history == uninterrupted.loss_history
    # An engine already at max_iters runs no round: nothing changes but the final loss.
    x_before = mine.x
    again = optex.minimize(rosenbrock, mine, max_iters=MAX_ITERS)
    assert again.nit == 12 and again.loss_history == [] and again.stop_reason == "max_iters"
    assert same_bits(again.x, x_before) and mine.iteration == 12 and not mine.pending
    assert again.fun == rosenbrock(x_before)[0]
    below = optex.minimize(rosenbrock, mine, max_iters=3)
    assert below.nit == 12 and below.loss_history == []


# ---- callbacks -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["raises StopIteration", "returns True"])
def test_a_callback_stops_the_run_by_raising_stop_iteration_or_returning_true(how: str) -> None:
    seen: list[int] = []
    later: list[int] = []

    def stop_after_three(info: optex.IterationInfo) -> bool:
        seen.append(info.iteration)
        if len(seen) == 3:
            if how == "raises StopIteration":
                raise StopIteration
            return True
        return False

    res = optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS,
                         callback=[stop_after_three, lambda info: later.append(info.iteration)],
                         **CONFIG)
    three = optex.minimize(rosenbrock, X0, max_iters=3, **CONFIG)
    assert res.stop_reason == "callback"
    assert res.nit == 3 and len(res.loss_history) == 3
    assert same_bits(res.x, three.x) and res.fun == three.fun
    assert later == seen  # the callbacks after it still saw the last round


def test_any_other_exception_of_a_callback_propagates_with_the_round_committed() -> None:
    mine = engine()

    def broken(info: optex.IterationInfo) -> None:
        raise KeyError("log sink")

    with pytest.raises(KeyError, match="log sink"):
        optex.minimize(rosenbrock, mine, max_iters=MAX_ITERS, callback=broken)
    assert mine.iteration == 1 and not mine.pending


# ---- a round with nothing finite -------------------------------------------------------


class NonFiniteWhile:
    """rosenbrock, or NaN everywhere while `poisoned` is set."""

    def __init__(self) -> None:
        self.poisoned = False

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if self.poisoned:
            return math.nan, np.full(x.size, math.nan, np.float32)
        return rosenbrock(x)


@pytest.mark.parametrize("bad", ["nan", "inf gradient", "huge gradient"])
def test_a_round_with_no_finite_pair_raises_with_the_engine_and_the_run_continues(
        bad: str, uninterrupted) -> None:
    if bad == "nan":
        objective = NonFiniteWhile()
    else:
        value = math.inf if bad == "inf gradient" else 1e30  # above the magnitude bound

        class Bad(NonFiniteWhile):
            def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
                if self.poisoned:
                    return 1.0, np.full(x.size, value, np.float64)
                return rosenbrock(x)

        objective = Bad()

    committed: list[float] = []

    def poison_after_three(info: optex.IterationInfo) -> None:
        committed.append(info.loss)
        objective.poisoned = len(committed) == 3  # rounds 0, 1, 2 commit

    with pytest.raises(optex.NonFiniteRoundError, match="no evaluation of iteration 3") as err:
        optex.minimize(objective, X0, max_iters=MAX_ITERS, callback=poison_after_three,
                       **CONFIG)
    assert isinstance(err.value, optex.EvaluationError) and isinstance(err.value, RuntimeError)
    assert isinstance(err.value.__cause__, RuntimeError)
    left = err.value.engine
    assert err.value.iteration == 3 and err.value.point == 0
    assert left.pending and left.iteration == 3 and left.evaluations == 3 * N
    three = optex.minimize(rosenbrock, X0, max_iters=3, **CONFIG)
    assert same_bits(left.x, three.x)  # nothing of the round was committed
    objective.poisoned = False
    rest = optex.minimize(objective, left, max_iters=MAX_ITERS)
    assert rest.nit == MAX_ITERS and same_bits(rest.x, uninterrupted.x)
    assert rest.loss_history == uninterrupted.loss_history[3:]


# ---- numeric arguments: what passes the check runs -------------------------------------


@pytest.mark.parametrize("timeout", [1e9, 1e10, 1e300, math.inf, 10**400, np.float64(1e10)])
def test_any_round_timeout_that_passes_the_check_runs(timeout, uninterrupted) -> None:
    res = optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS, round_timeout=timeout, **CONFIG)
    # Every result arrives long before the timeout: the run waits for all, as without it.
    assert res.nit == MAX_ITERS and res.n_dropped == 0
    assert same_bits(res.x, uninterrupted.x)


@pytest.mark.parametrize("timeout", [1e10, 1e300, math.inf, 10**400])
def test_any_round_timeout_runs_on_a_virtual_clock(timeout, uninterrupted) -> None:
    pool = VirtualClockExecutor(N, sigma=0.5, seed=1)
    res = optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS, round_timeout=timeout,
                         workers=pool, **CONFIG)
    assert res.nit == MAX_ITERS and res.n_dropped == 0
    assert same_bits(res.x, uninterrupted.x)


def test_huge_stopping_values_run() -> None:
    # target_loss above any loss: the first round stops the run.
    res = optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS, target_loss=10**400, **CONFIG)
    assert (res.nit, res.stop_reason) == (1, "target_loss")
    res = optex.minimize(rosenbrock, X0, max_iters=3, target_loss=-10**400, **CONFIG)
    assert (res.nit, res.stop_reason) == (3, "max_iters")
    res = optex.minimize(rosenbrock, X0, max_iters=MAX_ITERS, grad_tol=10**400, **CONFIG)
    assert (res.nit, res.stop_reason) == (1, "grad_tol")
    res = optex.minimize(rosenbrock, X0, max_iters=10**30, target_loss=1e300, **CONFIG)
    assert (res.nit, res.stop_reason) == (1, "target_loss")
    res = optex.minimize(rosenbrock, X0, max_iters=np.int64(2), max_workers=10**12, **CONFIG)
    assert res.nit == 2
    res = optex.minimize(rosenbrock, X0, max_iters=2, min_results=np.int32(4), **CONFIG)
    assert res.nit == 2


def test_any_max_workers_runs_on_processes() -> None:
    # A pool of processes is bounded by its call queue's semaphore, not by max_workers.
    res = optex.minimize(rosenbrock, X0, max_iters=2, workers="processes",
                         max_workers=10**12, **CONFIG)
    assert res.nit == 2
    threads = optex.minimize(rosenbrock, X0, max_iters=2, **CONFIG)
    assert same_bits(res.x, threads.x)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(max_iters=True), "max_iters"),
        (dict(max_iters=3.0), "max_iters"),
        (dict(max_iters=-1), "max_iters"),
        (dict(max_iters="3"), "max_iters"),
        (dict(target_loss=math.nan), "target_loss"),
        (dict(target_loss=np.float32("nan")), "target_loss"),
        (dict(target_loss="1"), "target_loss"),
        (dict(target_loss=None), "target_loss"),
        (dict(target_loss=True), "target_loss"),
        (dict(grad_tol=-1e-9), "grad_tol"),
        (dict(grad_tol=math.nan), "grad_tol"),
        (dict(grad_tol="0"), "grad_tol"),
        (dict(grad_tol=1j), "grad_tol"),
        (dict(max_workers=0), "max_workers"),
        (dict(max_workers=True), "max_workers"),
        (dict(max_workers=2.0), "max_workers"),
        (dict(round_timeout=-10**400), "round_timeout"),
        (dict(round_timeout=np.bool_(True)), "round_timeout"),
        (dict(callback=5), "callback"),
        (dict(callback=[print, 5]), "callback"),
        (dict(callback="print"), "callback"),
    ],
)
def test_a_bad_numeric_argument_is_a_value_error_naming_it(kwargs: dict, name: str) -> None:
    mine = engine()
    with pytest.raises(ValueError, match=f"^{name}: "):
        optex.minimize(rosenbrock, mine, **kwargs)
    assert mine.iteration == 0 and not mine.pending


def test_the_virtual_clock_takes_any_number_of_workers_and_huge_times() -> None:
    pool = VirtualClockExecutor(10**12, median=1.0)
    futures = [pool.submit(pow, 2, k) for k in range(3)]
    done, not_done = pool.wait_virtual(futures, timeout=10**400, return_when=cf.ALL_COMPLETED)
    assert not not_done and [f.result() for f in futures] == [1, 2, 4]
    assert sorted(record.worker for record in pool.log) == [0, 1, 2]
    with pytest.raises(ValueError, match="median"):
        VirtualClockExecutor(2, median=10**400)
    with pytest.raises(ValueError, match="sigma"):
        VirtualClockExecutor(2, sigma=10**400)
    with pytest.raises(ValueError, match="advance"):
        pool.advance(10**400)


# ---- the verified mode and partial rounds ----------------------------------------------


def verified_engine() -> optex.OptEx:
    return optex.OptEx(X0, optex.Adam(lr=0.01), optex.Options.verified(N, 0.0))


def row_zero_slowest() -> VirtualClockExecutor:
    # Task k of a round runs on worker k; worker 0 (row 0, the iterate) is 10x slower.
    return VirtualClockExecutor(N, slow={0: 10.0}, seed=0)


@pytest.mark.parametrize("partial", [dict(min_results=3), dict(round_timeout=0.5),
                                     dict(min_results=1, round_timeout=1e300)])
def test_the_verified_mode_refuses_partial_rounds_naming_both_options(partial: dict) -> None:
    mine = verified_engine()
    pool = row_zero_slowest()
    with pytest.raises(ValueError, match=r"min_results, round_timeout: the verified mode") as e:
        optex.minimize(rosenbrock, mine, max_iters=4, workers=pool, **partial)
    assert "mode 'approximate'" in str(e.value)
    assert mine.iteration == 0 and not mine.pending and pool.log == []  # nothing ran


def test_the_verified_mode_waits_for_row_zero_when_it_is_the_slowest() -> None:
    # Waiting for every row (min_results=N, an infinite timeout): the sequential
    # trajectory, whatever order the rows arrive in.
    on_threads = optex.minimize(rosenbrock, verified_engine(), max_iters=6)
    for wait_for_all in (dict(), dict(min_results=N), dict(round_timeout=math.inf)):
        pool = row_zero_slowest()
        res = optex.minimize(rosenbrock, verified_engine(), max_iters=6, workers=pool,
                             **wait_for_all)
        assert res.n_dropped == 0 and same_bits(res.x, on_threads.x)
        assert res.loss_history == on_threads.loss_history
    # The base optimizer's own trajectory: as many plain Adam steps as were committed.
    steps = verified_engine()
    optex.minimize(rosenbrock, steps, max_iters=6)
    plain = optex.OptEx(X0, optex.Adam(lr=0.01), parallelism=1)
    optex.minimize(rosenbrock, plain, max_iters=steps.optimizer_step)
    assert same_bits(plain.x, on_threads.x)
