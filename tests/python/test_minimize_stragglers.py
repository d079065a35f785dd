"""optex.minimize(min_results=, round_timeout=): rounds that commit without their
stragglers, on a virtual clock whose completion order and delays are scripted, so
every assertion is deterministic: which rows were dropped, when a round committed,
what observe() received, and what a dead worker does."""

from __future__ import annotations

import concurrent.futures as cf
import math

import numpy as np
import pytest

import optex
from optex import problems
from optex.executors import VirtualClockExecutor

D = 6
X0 = problems.Rosenbrock().standard_start(D)
N = 4


class Recorded:
    """Rosenbrock that records each point it evaluates, in call order (the virtual
    clock calls it in the caller's thread, when a task starts)."""

    def __init__(self) -> None:
        self.points: list[np.ndarray] = []

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        self.points.append(np.array(x))
        return problems.Rosenbrock().value_and_grad(x)


def engine(history: int = 64) -> optex.OptEx:
    return optex.OptEx(X0, optex.Adam(lr=0.01), parallelism=N, history=history, seed=1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def last_point_slow(task: int, worker: int) -> float:
    """Every round's last point takes 10 s, the others 1 s."""
    return 10.0 if task % N == N - 1 else 1.0


def run(executor: VirtualClockExecutor, rounds: int, objective=None, opt=None, **kwargs):
    """(result, per-round IterationInfo fields, commit times, engine)."""
    opt = opt or engine()
    infos: list[tuple[int, int]] = []
    times: list[float] = []

    def record(info: optex.IterationInfo) -> None:
        infos.append((info.dropped, info.committed_point))
        times.append(executor.virtual_time())

    res = optex.minimize(objective or Recorded(), opt, workers=executor, max_iters=rounds,
                         callback=record, **kwargs)
    return res, infos, times, opt


@pytest.mark.parametrize("k", [None, N])
def test_waiting_for_all_is_the_threads_trajectory(k) -> None:
    threads = optex.minimize(Recorded(), engine(), max_iters=10)
    # Random times, a slow worker: the results arrive in another order every round.
    ex = VirtualClockExecutor(N, sigma=0.8, slow={1: 4.0}, seed=3)
    res, infos, _, _ = run(ex, 10, min_results=k)
    assert same_bits(res.x, threads.x) and res.loss_history == threads.loss_history
    assert res.n_dropped == res.n_observed == 0 and all(d == 0 for d, _ in infos)


def test_k_of_n_commits_without_the_straggler_and_observes_it_later() -> None:
    # 2N workers: a straggler keeps its worker busy for 10 s, and the rounds
    # that follow still find N free ones.
    ex = VirtualClockExecutor(2 * N, last_point_slow)
    objective = Recorded()
    res, infos, times, opt = run(ex, 16, objective, min_results=N - 1)
    # Every round: points 0..2 arrive after 1 s, point 3 is dropped; the commit
    # steps from the last point that arrived. Waiting for all would take 10 s a round.
    assert infos == [(1, N - 2)] * 16 and times[:6] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert res.n_dropped == 16
    # The function is called when a task starts, so the calls are in start order.
    started = sorted((r.start, r.task) for r in ex.log if r.start is not None)
    point_of = {task: objective.points[k] for k, (_, task) in enumerate(started)}
    stragglers = [t for t in point_of if t % N == N - 1]
    # A straggler reaches observe() at the first commit after it finished.
    log = {r.task: r for r in ex.log}
    late = [t for t in stragglers if log[t].finish <= times[-1]]
    assert res.n_observed == len(late) >= 3
    # What observe() received: the late points are in the history with their
    # true gradients; a dropped row that has not arrived is not.
    history = opt.state_arrays()["history"]
    held = {p.tobytes() for p in history["points"]}
    for t in stragglers:
        assert (point_of[t].tobytes() in held) == (t in late), t
    for p, g in zip(history["points"], history["gradients"]):
        assert same_bits(g, problems.Rosenbrock().value_and_grad(p)[1].astype(np.float32))


def test_the_same_schedule_gives_the_same_trajectory() -> None:
    a = run(VirtualClockExecutor(N, sigma=0.5, slow={2: 4.0}, seed=7), 12, min_results=N - 1)[0]
    b = run(VirtualClockExecutor(N, sigma=0.5, slow={2: 4.0}, seed=7), 12, min_results=N - 1)[0]
    assert same_bits(a.x, b.x) and a.loss_history == b.loss_history
    assert (a.n_dropped, a.n_observed) == (b.n_dropped, b.n_observed)
    assert a.n_dropped > 0


def test_a_timeout_commits_what_has_arrived() -> None:
    times_of_round = [1.0, 1.0, 2.0, 3.0]
    ex = VirtualClockExecutor(N, lambda task, worker: times_of_round[task % N] + 10.0 * (task >= N))
    _, infos, times, _ = run(ex, 1, round_timeout=1.5)
    assert infos == [(2, 1)] and times == [1.5]


def test_a_timeout_waits_for_the_first_result() -> None:
    ex = VirtualClockExecutor(N, lambda task, worker: 5.0 + task)
    _, infos, times, _ = run(ex, 1, round_timeout=1.0)
    assert infos == [(N - 1, 0)] and times == [5.0]


def test_k_and_a_timeout_together_commit_at_whichever_comes_first() -> None:
    ex = VirtualClockExecutor(N, lambda task, worker: [1.0, 2.0, 3.0, 4.0][task % N])
    _, infos, times, _ = run(ex, 1, min_results=3, round_timeout=2.5)
    assert infos == [(2, 1)] and times == [2.5]
    ex = VirtualClockExecutor(N, lambda task, worker: [1.0, 2.0, 3.0, 4.0][task % N])
    _, infos, times, _ = run(ex, 1, min_results=2, round_timeout=2.5)
    assert infos == [(2, 1)] and times == [2.0]


def test_a_late_gradient_that_is_not_finite_is_not_observed() -> None:
    def nan_at_slow_points(x: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = problems.Rosenbrock().value_and_grad(x)
        return loss, grad * np.float32(math.nan) if nan_at_slow_points.slow else grad

    calls = {"n": 0}

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        nan_at_slow_points.slow = calls["n"] % N == N - 1
        calls["n"] += 1
        return nan_at_slow_points(x)

    res, _, _, opt = run(VirtualClockExecutor(N, last_point_slow), 15, objective,
                         min_results=N - 1)
    assert res.n_dropped == 15 and res.n_observed == 0
    assert np.all(np.isfinite(opt.state_arrays()["history"]["gradients"]))


def test_a_dead_worker_in_an_awaited_row_leaves_the_round_pending_for_a_retry() -> None:
    died = cf.process.BrokenProcessPool("worker died")
    opt = engine()
    failing = Recorded()
    ex = VirtualClockExecutor(N, last_point_slow, failures={N + 1: died})  # round 1, point 1
    with pytest.raises(optex.EvaluationError, match="point 1 of iteration 1") as err:
        run(ex, 6, failing, opt=opt, min_results=N - 1)
    assert err.value.__cause__ is died and err.value.engine is opt and err.value.point == 1
    assert opt.pending and opt.iteration == 1 and opt.evaluations == N
    pending = np.array(opt.ask())  # the same batch: asking again changes nothing
    # The failed round's evaluations that ran were of the pending points.
    tried = failing.points[N:]
    assert tried and all(any(same_bits(p, q) for q in pending) for p in tried)
    # The retry evaluates those same points first, then continues the run.
    retry = Recorded()
    retried = optex.minimize(retry, opt, workers=VirtualClockExecutor(N, lambda t, w: 1.0),
                             max_iters=6)  # the run's budget: 5 rounds after the pending one
    assert all(same_bits(retry.points[i], pending[i]) for i in range(N))
    assert retried.nit == 6 and len(retried.loss_history) == 5 and retried.n_dropped == 0


def test_a_dead_worker_in_a_late_row_is_ignored() -> None:
    died = cf.process.BrokenProcessPool("worker died")
    ex = VirtualClockExecutor(N, last_point_slow, failures={N - 1: died})  # round 0's straggler
    res, _, _, _ = run(ex, 15, min_results=N - 1)
    ok = run(VirtualClockExecutor(N, last_point_slow), 15, min_results=N - 1)[0]
    assert res.nit == 15 and res.n_observed == ok.n_observed - 1


def test_an_objective_exception_in_an_awaited_row_propagates() -> None:
    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        raise ArithmeticError("simulation diverged")

    opt = engine()
    with pytest.raises(ArithmeticError, match="simulation diverged"):
        run(VirtualClockExecutor(N, last_point_slow), 3, objective, opt=opt, min_results=2)
    assert opt.pending and opt.iteration == 0 and opt.evaluations == 0
