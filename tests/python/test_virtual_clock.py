"""optex.executors.VirtualClockExecutor: W simulated workers on a virtual clock.

Checked against schedules computed by hand: FIFO order, the lowest-numbered free
worker first, a slow worker's task carrying over into the next "round", cancelled
queued tasks that never run and occupy nothing, wait_virtual's three conditions
and its timeouts (the clock stops at the deadline or at the satisfying event,
whichever is first), failures set at their finish time, the log, determinism of the
random times, shutdown, and hostile inputs.
"""

from __future__ import annotations

import math
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    CancelledError,
    Executor,
    Future,
)
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

import optex.executors
from optex.executors import VirtualClockExecutor
from optex.executors.virtual_clock import TaskRecord


def scripted(durations):
    """duration(task, worker) from a list indexed by task."""
    return lambda task, worker: durations[task]


def schedule(ex: VirtualClockExecutor) -> list[tuple]:
    return [(r.task, r.worker, r.start, r.finish, r.cancelled) for r in ex.log]


def test_is_an_executor_with_the_protocol() -> None:
    ex = VirtualClockExecutor(2)
    assert isinstance(ex, Executor)
    assert optex.executors.VirtualClockExecutor is VirtualClockExecutor
    assert ex.virtual_time() == 0.0 and ex.workers == 2
    assert callable(ex.wait_virtual)
    assert isinstance(ex.submit(abs, -1), Future)  # a real concurrent.futures.Future


def test_scripted_schedule_three_workers() -> None:
    # 3 workers, tasks 0..5 take 1, 5, 2, 1, 3, 1 seconds, all submitted at 0.
    # t=0: 0->w0 [0,1], 1->w1 [0,5], 2->w2 [0,2]
    # t=1: w0 free: 3->w0 [1,2]
    # t=2: w0 and w2 free at once: 4->w0 (lowest) [2,5], 5->w2 [2,3]
    ex = VirtualClockExecutor(3, scripted([1, 5, 2, 1, 3, 1]))
    calls = []
    fs = [ex.submit(lambda i=i: calls.append(i) or i * 10) for i in range(6)]
    done, not_done = ex.wait_virtual(fs, return_when=ALL_COMPLETED)
    assert done == set(fs) and not not_done
    assert ex.virtual_time() == 5.0
    assert [f.result() for f in fs] == [0, 10, 20, 30, 40, 50]
    assert calls == [0, 1, 2, 3, 4, 5]  # called at their starts, in FIFO order
    assert schedule(ex) == [
        (0, 0, 0.0, 1.0, False),
        (1, 1, 0.0, 5.0, False),
        (2, 2, 0.0, 2.0, False),
        (3, 0, 1.0, 2.0, False),
        (4, 0, 2.0, 5.0, False),
        (5, 2, 2.0, 3.0, False),
    ]
    assert all(isinstance(r, TaskRecord) and r.submitted == 0.0 for r in ex.log)


def test_first_completed_steps_event_by_event() -> None:
    ex = VirtualClockExecutor(3, scripted([1, 5, 2, 1, 3, 1]))
    fs = [ex.submit(int, i) for i in range(6)]
    times, seen = [], []
    pending = set(fs)
    while pending:
        done, pending = ex.wait_virtual(pending, return_when=FIRST_COMPLETED)
        times.append(ex.virtual_time())
        seen.append(sorted(fs.index(f) for f in done))
    # Tasks 2 and 3 finish together at 2, 1 and 4 together at 5.
    assert times == [1.0, 2.0, 3.0, 5.0]
    assert seen == [[0], [2, 3], [5], [1, 4]]


def test_slow_worker_carries_over_into_the_next_round() -> None:
    # Worker 2 takes 4 s, the others 1 s. Round 1 (tasks 0-2) closes after 2 results (t=1);
    # round 2's tasks 3 and 4 start at once on w0, w1; task 5 waits for a free worker: w0 at t=2
    # (w2 is still busy with round 1's task 2 until t=4).
    ex = VirtualClockExecutor(3, lambda task, worker: 4.0 if worker == 2 else 1.0)

    def round_of(k):
        fs = [ex.submit(int, i) for i in range(3)]
        done: set = set()
        while len(done) < k:
            newly, _ = ex.wait_virtual(set(fs) - done, return_when=FIRST_COMPLETED)
            done |= newly
        return fs, done

    fs1, done1 = round_of(2)
    assert ex.virtual_time() == 1.0 and done1 == {fs1[0], fs1[1]}
    assert fs1[2].running()
    fs2, done2 = round_of(2)
    assert ex.virtual_time() == 2.0 and done2 == {fs2[0], fs2[1]}
    assert schedule(ex)[3:] == [(3, 0, 1.0, 2.0, False), (4, 1, 1.0, 2.0, False),
                                (5, 0, 2.0, 3.0, False)]
    assert ex.log[5].submitted == 1.0
    ex.wait_virtual(fs1 + fs2, return_when=ALL_COMPLETED)
    assert ex.virtual_time() == 4.0  # the straggler of round 1 ends last
    assert schedule(ex)[2] == (2, 2, 0.0, 4.0, False)


def test_fifo_on_one_worker() -> None:
    ex = VirtualClockExecutor(1, scripted([3, 1, 2, 1]))
    order = []
    fs = [ex.submit(order.append, i) for i in range(4)]
    ex.wait_virtual(fs, return_when=ALL_COMPLETED)
    assert order == [0, 1, 2, 3]
    assert [(r.start, r.finish) for r in ex.log] == [(0, 3), (3, 4), (4, 6), (6, 7)]


def test_future_states_pending_running_finished() -> None:
    ex = VirtualClockExecutor(1, scripted([2, 2]))
    a, b = ex.submit(int, 1), ex.submit(int, 2)
    assert not a.running() and not a.done()  # pending: nothing starts before the clock moves
    ex.wait_virtual([a], timeout=0)  # starts a, moves no time
    assert ex.virtual_time() == 0.0
    assert a.running() and not a.done()
    assert not b.running() and not b.done()  # still queued
    ex.advance(1.0)
    assert a.running() and not a.done()  # its result waits for its finish time
    ex.advance(1.0)
    assert a.done() and a.result() == 1 and b.running()


def test_cancel_queued_tasks() -> None:
    ex = VirtualClockExecutor(1, scripted([1, 1, 1]))
    ran = []
    a, b, c = (ex.submit(ran.append, i) for i in range(3))
    assert b.cancel()  # queued: cancellable, as with ThreadPoolExecutor
    done, not_done = ex.wait_virtual([a, c], return_when=ALL_COMPLETED)
    assert not not_done
    assert ran == [0, 2]  # the cancelled task never ran
    assert ex.virtual_time() == 2.0  # and took no worker time: c starts at 1
    assert schedule(ex) == [(0, 0, 0.0, 1.0, False), (1, None, None, None, True),
                            (2, 0, 1.0, 2.0, False)]
    with pytest.raises(CancelledError):
        b.result()


def test_cancel_running_task_fails_and_cancelled_future_counts_as_done() -> None:
    ex = VirtualClockExecutor(1, scripted([5, 5]))
    a, b = ex.submit(int, 1), ex.submit(int, 2)
    ex.wait_virtual([a], timeout=0)
    assert not a.cancel()  # running: too late
    assert b.cancel()
    done, not_done = ex.wait_virtual([b], return_when=ALL_COMPLETED)
    assert done == {b} and not not_done and ex.virtual_time() == 0.0


def test_cancel_futures_on_shutdown() -> None:
    ex = VirtualClockExecutor(2, scripted([1, 3, 1, 1]))
    fs = [ex.submit(int, i) for i in range(4)]
    ex.wait_virtual(fs, timeout=0)  # tasks 0 and 1 start; 2 and 3 queue
    ex.shutdown(wait=True, cancel_futures=True)
    assert [f.cancelled() for f in fs] == [False, False, True, True]
    assert fs[1].result() == 1 and ex.virtual_time() == 3.0
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(int, 0)


def test_shutdown_wait_runs_everything_and_context_manager() -> None:
    with VirtualClockExecutor(2, scripted([1, 2, 3])) as ex:
        fs = [ex.submit(int, i) for i in range(3)]
    assert all(f.done() for f in fs) and ex.virtual_time() == 4.0  # task 2 on w0 from 1 to 4


def test_shutdown_without_wait_leaves_the_clock() -> None:
    ex = VirtualClockExecutor(2, scripted([1, 2]))
    fs = [ex.submit(int, i) for i in range(2)]
    ex.shutdown(wait=False)
    assert ex.virtual_time() == 0.0 and not any(f.done() for f in fs)
    ex.wait_virtual(fs, return_when=ALL_COMPLETED)  # what was submitted still runs
    assert ex.virtual_time() == 2.0 and [f.result() for f in fs] == [0, 1]


def test_timeouts() -> None:
    ex = VirtualClockExecutor(2, scripted([3, 5]))
    a, b = ex.submit(int, 1), ex.submit(int, 2)
    done, not_done = ex.wait_virtual([a, b], timeout=2)
    assert not done and not_done == {a, b} and ex.virtual_time() == 2.0  # the deadline
    done, _ = ex.wait_virtual([a, b], timeout=2)
    assert done == {a} and ex.virtual_time() == 3.0  # the event, before the deadline 4
    done, not_done = ex.wait_virtual([a, b], timeout=1.5, return_when=ALL_COMPLETED)
    assert not_done == {b} and ex.virtual_time() == 4.5
    done, not_done = ex.wait_virtual([a, b], timeout=100, return_when=ALL_COMPLETED)
    assert not not_done and ex.virtual_time() == 5.0  # not 104.5


def test_event_exactly_at_the_deadline_counts() -> None:
    ex = VirtualClockExecutor(1, scripted([2]))
    f = ex.submit(int, 1)
    done, _ = ex.wait_virtual([f], timeout=2.0)
    assert done == {f} and ex.virtual_time() == 2.0


def test_zero_negative_and_bad_timeouts() -> None:
    ex = VirtualClockExecutor(1, scripted([1]))
    f = ex.submit(int, 1)
    assert ex.wait_virtual([f], timeout=0) == (set(), {f})
    assert ex.wait_virtual([f], timeout=-5) == (set(), {f})  # as concurrent.futures.wait
    assert ex.virtual_time() == 0.0
    with pytest.raises(ValueError, match="NaN"):
        ex.wait_virtual([f], timeout=math.nan)
    with pytest.raises(TypeError, match="timeout"):
        ex.wait_virtual([f], timeout="1")
    with pytest.raises(ValueError, match="return_when"):
        ex.wait_virtual([f], return_when="SOMETIMES")
    done, _ = ex.wait_virtual([f], timeout=math.inf)
    assert done == {f} and ex.virtual_time() == 1.0


def test_returns_at_once_when_the_condition_already_holds() -> None:
    ex = VirtualClockExecutor(2, scripted([1, 10]))
    a, b = ex.submit(int, 1), ex.submit(int, 2)
    ex.wait_virtual([a])
    assert ex.virtual_time() == 1.0
    done, not_done = ex.wait_virtual([a, b], timeout=50)
    assert done == {a} and not_done == {b} and ex.virtual_time() == 1.0
    assert ex.wait_virtual([]) == (set(), set())
    assert ex.virtual_time() == 1.0


def test_futures_that_can_never_complete() -> None:
    ex = VirtualClockExecutor(2, scripted([1]))
    mine, foreign = ex.submit(int, 1), Future()
    with pytest.raises(RuntimeError, match="never complete"):
        ex.wait_virtual([mine, foreign], return_when=ALL_COMPLETED)
    assert mine.done() and ex.virtual_time() == 1.0  # it ran what could run, then stopped
    done, not_done = ex.wait_virtual([foreign], timeout=3)
    assert not done and not_done == {foreign} and ex.virtual_time() == 4.0


def test_failures_simulate_a_dead_worker() -> None:
    died = BrokenProcessPool("worker died")
    calls = []
    ex = VirtualClockExecutor(3, scripted([1, 2, 3]), failures={1: died})
    fs = [ex.submit(calls.append, i) for i in range(3)]
    done, not_done = ex.wait_virtual(fs, return_when=FIRST_EXCEPTION)
    assert ex.virtual_time() == 2.0 and done == {fs[0], fs[1]} and not_done == {fs[2]}
    assert fs[1].exception() is died
    assert calls == [0, 2]  # the failed task's function is never called
    assert [r.failed for r in ex.log] == [False, True, False]
    assert ex.log[1].finish == 2.0


def test_first_exception_without_exceptions_waits_for_all() -> None:
    ex = VirtualClockExecutor(2, scripted([1, 2]))
    fs = [ex.submit(int, i) for i in range(2)]
    done, _ = ex.wait_virtual(fs, return_when=FIRST_EXCEPTION)
    assert done == set(fs) and ex.virtual_time() == 2.0


def test_a_raising_function_fails_its_future_at_its_finish_time() -> None:
    ex = VirtualClockExecutor(1, scripted([2]))
    f = ex.submit(int, "not a number")
    ex.advance(1.0)
    assert f.running() and not f.done()
    ex.advance(1.0)
    assert isinstance(f.exception(), ValueError)


def test_random_times_are_lognormal_per_task_times_the_worker_factor() -> None:
    ex = VirtualClockExecutor(4, sigma=0.3, median=2.0, slow={3: 4.0}, seed=7)
    fs = [ex.submit(int, i) for i in range(4)]
    ex.wait_virtual(fs, return_when=ALL_COMPLETED)
    z = np.random.default_rng(7).standard_normal(4)
    expected = 2.0 * np.exp(0.3 * z) * np.array([1, 1, 1, 4.0])
    assert [r.worker for r in ex.log] == [0, 1, 2, 3]
    np.testing.assert_allclose([r.finish for r in ex.log], expected, rtol=1e-12)


def test_sigma_zero_gives_the_median() -> None:
    ex = VirtualClockExecutor(2, median=1.5)
    fs = [ex.submit(int, i) for i in range(4)]
    ex.wait_virtual(fs, return_when=ALL_COMPLETED)
    assert [(r.start, r.finish) for r in ex.log] == [(0, 1.5), (0, 1.5), (1.5, 3.0), (1.5, 3.0)]


def _random_run(seed: int) -> list[tuple]:
    ex = VirtualClockExecutor(3, sigma=0.5, slow={2: 3.0}, seed=seed)
    pending = {ex.submit(int, i) for i in range(5)}
    for round_index in range(4):
        done, pending = ex.wait_virtual(pending, return_when=FIRST_COMPLETED)
        pending |= {ex.submit(int, i) for i in range(len(done))}
    ex.shutdown()
    return schedule(ex)


def test_deterministic() -> None:
    assert _random_run(3) == _random_run(3)
    assert _random_run(3) != _random_run(4)


def test_a_task_draw_does_not_depend_on_cancellations() -> None:
    # Task 2's time is its own draw whether or not task 1 ran.
    def finish_of_task_2(cancel: bool) -> float:
        ex = VirtualClockExecutor(1, sigma=0.5, seed=11)
        fs = [ex.submit(int, i) for i in range(3)]
        if cancel:
            fs[1].cancel()
        ex.wait_virtual(fs, return_when=ALL_COMPLETED)
        return ex.log[2].finish - ex.log[2].start

    assert finish_of_task_2(True) == finish_of_task_2(False)


def test_map_on_the_virtual_clock() -> None:
    ex = VirtualClockExecutor(2, scripted([2, 1, 1]))
    assert list(ex.map(abs, [-1, -2, -3])) == [1, 2, 3]
    assert ex.virtual_time() == 2.0
    ex2 = VirtualClockExecutor(1, scripted([2, 2]))
    results = ex2.map(abs, [-1, -2], timeout=3)
    assert next(results) == 1
    with pytest.raises(TimeoutError):
        next(results)


def test_tasks_may_submit_but_not_move_the_clock() -> None:
    ex = VirtualClockExecutor(2, scripted([1, 1, 1]))
    inner = []

    def spawn():
        inner.append(ex.submit(int, 7))
        return "spawned"

    def move_clock():
        ex.advance(1.0)

    a = ex.submit(spawn)
    b = ex.submit(move_clock)
    ex.wait_virtual([a, b], return_when=ALL_COMPLETED)
    assert a.result() == "spawned"
    assert isinstance(b.exception(), RuntimeError) and "inside a task" in str(b.exception())
    ex.wait_virtual(inner, return_when=ALL_COMPLETED)
    assert inner[0].result() == 7 and ex.virtual_time() == 2.0


def test_advance_without_tasks_moves_the_clock() -> None:
    ex = VirtualClockExecutor(1)
    ex.advance(2.5)
    assert ex.virtual_time() == 2.5
    f = ex.submit(int, 3)
    ex.wait_virtual([f])
    assert ex.log[0].start == 2.5 and ex.log[0].finish == 3.5 and ex.log[0].submitted == 2.5
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="advance"):
            ex.advance(bad)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
def test_bad_durations_name_the_task(bad: float) -> None:
    ex = VirtualClockExecutor(2, lambda task, worker: bad if task == 2 else 1.0)
    fs = [ex.submit(int, i) for i in range(3)]
    with pytest.raises(ValueError, match=r"task 2's duration must be a finite number >= 0"):
        ex.wait_virtual(fs, return_when=ALL_COMPLETED)
    assert not fs[2].running() and not fs[2].done()  # it never started


def test_non_numeric_and_raising_durations() -> None:
    ex = VirtualClockExecutor(1, lambda task, worker: "soon")
    f = ex.submit(int, 1)
    with pytest.raises(TypeError, match="task 0's duration must be a number"):
        ex.wait_virtual([f])

    def broken(task, worker):
        raise KeyError("no such task")

    ex2 = VirtualClockExecutor(1, broken)
    f2 = ex2.submit(int, 1)
    with pytest.raises(RuntimeError, match="duration.*task 0") as info:
        ex2.wait_virtual([f2])
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("workers, error", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                            (True, TypeError), ("8", TypeError), (None, TypeError)])
def test_bad_worker_counts(workers, error) -> None:
    with pytest.raises(error, match="workers"):
        VirtualClockExecutor(workers)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="duration: must be a callable"):
        VirtualClockExecutor(2, [1.0, 2.0])
    with pytest.raises(TypeError, match="fn must be callable"):
        VirtualClockExecutor(2).submit(42)
    with pytest.raises(ValueError, match="slow: worker 8"):
        VirtualClockExecutor(8, slow={8: 4.0})
    with pytest.raises(ValueError, match=r"slow\[1\]"):
        VirtualClockExecutor(8, slow={1: 0.0})
    with pytest.raises(ValueError, match=r"slow\[1\]"):
        VirtualClockExecutor(8, slow={1: math.nan})
    with pytest.raises(ValueError, match="sigma"):
        VirtualClockExecutor(8, sigma=-0.1)
    with pytest.raises(ValueError, match="median"):
        VirtualClockExecutor(8, median=0.0)
    with pytest.raises(ValueError, match="seed"):
        VirtualClockExecutor(8, seed=-1)
    with pytest.raises(ValueError, match="cannot be combined with duration"):
        VirtualClockExecutor(2, scripted([1]), slow={0: 2.0})
    with pytest.raises(TypeError, match=r"failures\[0\]"):
        VirtualClockExecutor(2, failures={0: "boom"})
    with pytest.raises(ValueError, match="failures: task -1"):
        VirtualClockExecutor(2, failures={-1: RuntimeError()})
