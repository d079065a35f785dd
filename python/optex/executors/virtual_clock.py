"""VirtualClockExecutor: W simulated workers on a virtual clock.

A ``concurrent.futures.Executor`` for testing and benchmarking what
``optex.minimize(..., min_results=, round_timeout=)`` does with slow or dead
workers, deterministically and in seconds of real time::

    from concurrent.futures import FIRST_COMPLETED
    from optex.executors import VirtualClockExecutor

    ex = VirtualClockExecutor(8, sigma=0.3, slow={7: 4.0}, seed=0)  # worker 7 is 4x slower
    fs = [ex.submit(f, x) for x in points]
    done, not_done = ex.wait_virtual(fs, timeout=1.5)                 # 1.5 virtual seconds
    ex.virtual_time(), ex.log

The model:

- Tasks are numbered 0, 1, ... in submission order and queue FIFO. Whenever the
  clock is consulted to move (``wait_virtual``, ``advance``, ``shutdown(wait=True)``),
  every free worker takes the head of the queue first, the lowest-numbered free
  worker first; then the clock jumps to the next finish time, the workers that
  finish at that instant are freed, and the queue is served again.
- A task runs for ``duration(task, worker)`` virtual seconds (a finite number
  >= 0; anything else is a ValueError naming the task). Without ``duration``:
  ``median * exp(sigma * z_task) * slow.get(worker, 1.0)``, ``z_task`` the task's
  draw from ``numpy.random.default_rng(seed)`` (draws are taken in task order, one
  per task, whether or not the task runs), so a task's time depends only on its
  number and its worker.
- The task's function is called when the task starts, synchronously, in the thread
  that moved the clock; its result (or exception) is set on the future at the
  finish time. The result is held as it is, not copied: a function that returns
  a buffer it reuses would hand every future the last write
  (:func:`optex.minimize` copies the gradient inside the task, so its runs are
  not affected). The future is PENDING while queued (``cancel()`` works: a cancelled
  task never runs and never occupies a worker), RUNNING from its start
  (``set_running_or_notify_cancel``), then FINISHED.
- ``failures={task: exc}``: that task occupies its worker as usual, but its
  function is not called: its future gets ``exc`` at the finish time (a worker
  that dies, e.g. ``concurrent.futures.process.BrokenProcessPool("worker died")``).

Nothing happens in real time: a future only completes when the clock moves, so
wait with ``wait_virtual`` (or ``advance``) before ``future.result()``, which would
otherwise block forever. ``map`` waits virtually itself.

The virtual-time protocol of :mod:`optex.executors`: ``virtual_time()`` and
``wait_virtual(fs, timeout=None, return_when=FIRST_COMPLETED)``. ``log`` records,
per task, the worker, the start and finish times and whether it was cancelled.
The same arguments and the same calls give the same schedule.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import numbers
import threading
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    Executor,
    Future,
)
from typing import Any, Callable, Iterable, Iterator

import numpy as np

__all__ = ["TaskRecord", "VirtualClockExecutor"]

_DRAW_BLOCK = 256  # normal draws taken from the generator at a time (a fixed scheme: deterministic)


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One task in :attr:`VirtualClockExecutor.log`.

    ``worker``, ``start`` and ``finish`` are None until the task starts (and stay
    None for a task cancelled before it started); ``finish`` is known from the start
    on (it is the time the future completes); ``failed`` marks a task of ``failures``.
    """

    task: int
    submitted: float
    worker: int | None
    start: float | None
    finish: float | None
    cancelled: bool
    failed: bool = False


class _Task:
    __slots__ = ("number", "fn", "args", "kwargs", "future", "submitted", "worker", "start",
                 "finish", "outcome", "raised", "failed")

    def __init__(self, number: int, fn: Callable[..., Any], args: tuple, kwargs: dict,
                 future: Future, submitted: float):
        self.number = number
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.future = future
        self.submitted = submitted
        self.worker: int | None = None
        self.start: float | None = None
        self.finish: float | None = None
        self.outcome: Any = None
        self.raised = False
        self.failed = False


def _as_float(value: numbers.Real) -> float:
    """float(value), an int beyond the float range as an infinity of its sign."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _check_positive_finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: must be a real number, got {type(value).__name__}")
    value = _as_float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name}: must be a positive finite number, got {value!r}")
    return value


class VirtualClockExecutor(Executor):
    """``workers`` simulated workers on a virtual clock (see the module's documentation).

    Parameters
    ----------
    workers:
        How many tasks run at once (an int >= 1).
    duration:
        ``duration(task, worker) -> seconds``: a scripted evaluation time, called
        once when the task starts (task numbers count submissions from 0, workers
        are 0 .. workers-1). Must return a finite number >= 0. Leave it out for
        random times (below); it cannot be combined with ``slow``, ``sigma``,
        ``median`` or ``seed``.
    slow:
        ``{worker: factor}``: that worker's times are multiplied by ``factor``
        (e.g. ``{7: 4.0}``: worker 7 takes 4x as long).
    sigma:
        The log-normal's log-standard-deviation (0: every task takes ``median``).
    median:
        The median evaluation time of a worker of factor 1, in virtual seconds.
    seed:
        Seeds ``numpy.random.default_rng`` for the random times.
    failures:
        ``{task: exception}``: that task's future gets the exception instead of
        running its function (at its finish time; it occupies a worker meanwhile).
    """

    def __init__(
        self,
        workers: int,
        duration: Callable[[int, int], float] | None = None,
        *,
        slow: dict[int, float] | None = None,
        sigma: float | None = None,
        median: float | None = None,
        seed: int | None = None,
        failures: dict[int, BaseException] | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, numbers.Integral):
            raise TypeError(f"workers: must be an int >= 1, got {type(workers).__name__}")
        if workers < 1:
            raise ValueError(f"workers: must be an int >= 1, got {workers!r}")
        if duration is not None and not callable(duration):
            raise TypeError(
                "duration: must be a callable duration(task, worker) -> seconds or None, got "
                + type(duration).__name__)
        if duration is not None:
            given = [name for name, value in (("slow", slow), ("sigma", sigma), ("median", median),
                                               ("seed", seed)) if value is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: the random-time parameters cannot be combined with "
                    "duration (build the slowness into duration)")
        self._workers = int(workers)
        self._duration = duration
        self._median = 1.0 if median is None else _check_positive_finite("median", median)
        if sigma is None:
            sigma = 0.0
        if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real):
            raise TypeError(f"sigma: must be a real number >= 0, got {type(sigma).__name__}")
        if not (math.isfinite(_as_float(sigma)) and sigma >= 0.0):
            raise ValueError(f"sigma: must be a finite number >= 0, got {sigma!r}")
        self._sigma = float(sigma)
        self._slow: dict[int, float] = {}
        for worker, factor in (slow or {}).items():
            if isinstance(worker, bool) or not isinstance(worker, numbers.Integral) or not (
                    0 <= worker < self._workers):
                raise ValueError(f"slow: worker {worker!r} is not one of 0..{self._workers - 1}")
            self._slow[int(worker)] = _check_positive_finite(f"slow[{worker}]", factor)
        if seed is None:
            seed = 0
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed: must be an int >= 0, got {seed!r}")
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        self._draws: list[float] = []
        self._failures: dict[int, BaseException] = {}
        for task, exc in (failures or {}).items():
            if isinstance(task, bool) or not isinstance(task, numbers.Integral) or task < 0:
                raise ValueError(f"failures: task {task!r} is not a task number (an int >= 0)")
            if not isinstance(exc, BaseException):
                raise TypeError(
                    f"failures[{task}]: must be an exception instance, got {type(exc).__name__}")
            self._failures[int(task)] = exc

        self._lock = threading.RLock()
        self._now = 0.0
        self._tasks: list[_Task] = []
        self._queue: collections.deque[_Task] = collections.deque()
        # The free workers: those freed again (a heap), and every worker from
        # _unused on, never used yet (so that any number of workers costs nothing).
        self._free: list[int] = []
        self._unused = 0
        self._events: list[tuple[float, int, _Task]] = []  # (finish, task number, task)
        self._shutdown = False
        self._in_task = 0

    # ------------------------------------------------------------------ properties

    @property
    def workers(self) -> int:
        """How many tasks run at once."""
        return self._workers

    @property
    def log(self) -> list[TaskRecord]:
        """One :class:`TaskRecord` per submitted task, in task order (a snapshot)."""
        with self._lock:
            return [TaskRecord(t.number, t.submitted, t.worker, t.start, t.finish,
                               t.future.cancelled(), t.failed) for t in self._tasks]

    @property
    def busy(self) -> int:
        """Tasks running now."""
        with self._lock:
            return len(self._events)

    @property
    def queued(self) -> int:
        """Tasks waiting for a worker (cancelled ones included until a worker reaches them)."""
        with self._lock:
            return len(self._queue)

    def virtual_time(self) -> float:
        """The clock, in virtual seconds (0 at construction)."""
        with self._lock:
            return self._now

    # ------------------------------------------------------------------ Executor

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Queues ``fn(*args, **kwargs)``; it starts when the clock next moves and a worker is free."""
        if not callable(fn):
            raise TypeError(f"submit: fn must be callable, got {type(fn).__name__}")
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future = Future()
            task = _Task(len(self._tasks), fn, args, kwargs, future, self._now)
            self._tasks.append(task)
            self._queue.append(task)
            return future

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1) -> Iterator[Any]:
        """``Executor.map`` on the virtual clock: ``timeout`` in virtual seconds from the call."""
        futures = [self.submit(fn, *args) for args in zip(*iterables)]
        deadline = None if timeout is None else self.virtual_time() + _as_float(timeout)

        def results() -> Iterator[Any]:
            try:
                for future in futures:
                    left = None if deadline is None else max(0.0, deadline - self.virtual_time())
                    _done, not_done = self.wait_virtual([future], left, ALL_COMPLETED)
                    if not_done:
                        raise TimeoutError()
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new tasks after this. ``cancel_futures``: cancel every queued task.
        ``wait``: run the clock until every task that was not cancelled has finished."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for task in self._queue:
                    task.future.cancel()
            if wait:
                if self._in_task:
                    raise RuntimeError("shutdown(wait=True) from inside a task would wait for itself")
                self._run(math.inf, lambda: False)

    # ------------------------------------------------------------------ the clock

    def advance(self, seconds: float) -> None:
        """Moves the clock forward by ``seconds`` (>= 0), starting and finishing tasks on the way."""
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
            raise TypeError(f"advance: seconds must be a number, got {type(seconds).__name__}")
        seconds = _as_float(seconds)
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"advance: seconds must be a finite number >= 0, got {seconds!r}")
        with self._lock:
            self._check_not_in_task("advance")
            self._run(self._now + seconds, lambda: False)

    def run_until_idle(self) -> float:
        """Runs the clock until no task is queued or running; returns the time it ends at."""
        with self._lock:
            self._check_not_in_task("run_until_idle")
            self._run(math.inf, lambda: False)
            return self._now

    def wait_virtual(self, fs: Iterable[Future], timeout: float | None = None,
                     return_when: str = FIRST_COMPLETED) -> tuple[set[Future], set[Future]]:
        """``concurrent.futures.wait`` on the virtual clock.

        Returns ``(done, not_done)`` as soon as ``return_when`` holds (at once if it
        already does), moving the clock event by event; with ``timeout`` (virtual
        seconds from now) the clock stops at the deadline if the condition does not
        hold by then. Raises RuntimeError when no event can ever complete the
        futures (futures of another executor, with no timeout) instead of looping.
        """
        if return_when not in (FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED):
            raise ValueError(f"return_when: must be FIRST_COMPLETED, FIRST_EXCEPTION or "
                             f"ALL_COMPLETED, got {return_when!r}")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError(f"timeout: must be a number of seconds or None, got "
                                f"{type(timeout).__name__}")
            timeout = _as_float(timeout)
            if math.isnan(timeout):
                raise ValueError("timeout: must not be NaN")
            timeout = max(0.0, timeout)  # as concurrent.futures.wait: a negative timeout is 0
        fs = set(fs)
        with self._lock:
            self._check_not_in_task("wait_virtual")
            deadline = math.inf if timeout is None else self._now + timeout

            def holds() -> bool:
                return _condition_holds(fs, return_when)

            satisfied = self._run(deadline, holds)
            done = {f for f in fs if f.done()}
            not_done = fs - done
            if not satisfied and math.isinf(deadline):
                raise RuntimeError(
                    f"wait_virtual: {len(not_done)} of the futures can never complete: nothing is "
                    "queued or running on this executor (are they another executor's?)")
            return done, not_done

    # ------------------------------------------------------------------ internals

    def _check_not_in_task(self, what: str) -> None:
        if self._in_task:
            raise RuntimeError(f"{what}: called from inside a task's function; the clock cannot "
                               "move while a task is starting")

    def _run(self, deadline: float, holds: Callable[[], bool]) -> bool:
        """Serves the queue and moves the clock until ``holds()`` or the deadline; True when it
        holds. With an infinite deadline and nothing left to run, returns False."""
        while True:
            self._dispatch()
            if holds():
                return True
            if not self._events:
                if math.isfinite(deadline):
                    self._now = max(self._now, deadline)
                return False
            finish = self._events[0][0]
            if finish > deadline:
                self._now = deadline
                return False
            self._now = max(self._now, finish)
            finishing = []
            while self._events and self._events[0][0] == finish:
                finishing.append(heapq.heappop(self._events)[2])
            for task in finishing:  # in task order (the heap's tie-break)
                heapq.heappush(self._free, task.worker)
                self._complete(task)

    def _dispatch(self) -> None:
        """Every free worker takes the head of the queue, the lowest-numbered worker first."""
        while self._queue and (self._free or self._unused < self._workers):
            task = self._queue[0]
            if task.future.cancelled():
                self._queue.popleft()
                task.fn = task.args = task.kwargs = None  # type: ignore[assignment]
                continue
            # Freed workers are below _unused: the heap's head, if any, is the lowest.
            worker = self._free[0] if self._free else self._unused
            seconds = self._task_duration(task.number, worker)  # may raise: the task stays queued
            self._queue.popleft()
            if self._free:
                heapq.heappop(self._free)
            else:
                self._unused += 1
            if not task.future.set_running_or_notify_cancel():  # cancelled meanwhile
                heapq.heappush(self._free, worker)
                task.fn = task.args = task.kwargs = None  # type: ignore[assignment]
                continue
            task.worker, task.start, task.finish = worker, self._now, self._now + seconds
            heapq.heappush(self._events, (task.finish, task.number, task))
            if task.number in self._failures:
                task.failed = True
                task.outcome, task.raised = self._failures[task.number], True
                task.fn = task.args = task.kwargs = None  # type: ignore[assignment]
            else:
                self._call(task)

    def _call(self, task: _Task) -> None:
        """Runs the task's function now; the future gets the outcome at the finish time."""
        fn, args, kwargs = task.fn, task.args, task.kwargs
        task.fn = task.args = task.kwargs = None  # type: ignore[assignment]
        self._in_task += 1
        try:
            task.outcome, task.raised = fn(*args, **kwargs), False
        except BaseException as error:  # noqa: BLE001 - the future carries it, as in ThreadPoolExecutor
            task.outcome, task.raised = error, True
            if not isinstance(error, Exception):
                raise  # KeyboardInterrupt, SystemExit: stop the caller too (the future still gets it)
        finally:
            self._in_task -= 1

    def _complete(self, task: _Task) -> None:
        if task.raised:
            task.future.set_exception(task.outcome)
        else:
            task.future.set_result(task.outcome)
        task.outcome = None

    def _task_duration(self, number: int, worker: int) -> float:
        if self._duration is not None:
            try:
                value = self._duration(number, worker)
            except Exception as error:
                raise RuntimeError(f"duration({number}, {worker}) raised for task {number}") from error
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"duration({number}, {worker}): task {number}'s duration must be a "
                                f"number of seconds, got {type(value).__name__}")
            seconds = _as_float(value)
            if not (math.isfinite(seconds) and seconds >= 0.0):
                raise ValueError(f"duration({number}, {worker}): task {number}'s duration must be a "
                                 f"finite number >= 0, got {seconds!r}")
            return seconds
        while len(self._draws) <= number:
            self._draws.extend(self._rng.standard_normal(_DRAW_BLOCK).tolist())
        seconds = self._median * math.exp(self._sigma * self._draws[number])
        return seconds * self._slow.get(worker, 1.0)


def _condition_holds(fs: set[Future], return_when: str) -> bool:
    if return_when == ALL_COMPLETED:
        return all(f.done() for f in fs)
    if return_when == FIRST_COMPLETED:
        return not fs or any(f.done() for f in fs)
    # FIRST_EXCEPTION: any future that raised, else all done.
    for f in fs:
        if f.done() and not f.cancelled() and f.exception() is not None:
            return True
    return all(f.done() for f in fs)
