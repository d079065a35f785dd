"""One round of :func:`optex.minimize` on an executor: submit the N evaluations,
wait for all of them or for enough of them, and keep the late ones for observe().

Waiting for all (the default) gives the threads' trajectory bit for bit on any
executor. A partial round (``min_results`` K < N, or ``round_timeout``) commits
once K results are in, or once the timeout has passed with at least one in; the
missing rows go to tell() as non-finite rows, which it drops (DESIGN.md section
2). Their evaluations keep running: a result that arrives after its round
closed is a true (point, gradient) pair, and the engine's observe() adds it to
the GP history, so the straggler's work still improves the next predictions.
Evaluations of a closed round are never cancelled while the run goes on (the
executors of Dask and Ray cannot tell a queued task from a running one, and
cancel both); those still out when minimize returns are cancelled then.

Errors. The objective's exception is re-raised as it is (with a note naming
the point), KeyboardInterrupt and SystemExit included; a future that ends
without a result (dead worker, pickling, a shut-down or cancelling executor)
is an EvaluationError; an executor that breaks the Future contract (submit()
returns something other than a concurrent.futures.Future, or a future's result
is not what evaluate_point returns) is an ExecutorContractError, a TypeError
naming the executor and what it gave. In every case the round stays pending
and the engine unchanged.

Memory. Each evaluation receives a copy of its point (objective_point), made
here before it is submitted, on every executor: the engine rewrites the
batch's rows at the next ask(), and an objective may keep its x. The worker
copies the gradient (evaluate_point), so the results read here, once the
round is in, are the objective's values at the time it returned.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import reprlib
import threading
import time
from typing import Any, Callable

import numpy as np

from ._evaluation import Raised, as_raised, checked_gradient, evaluate_point, objective_point
from ._optex import magnitude_bound
from ._values import real_loss
from .evaluation_error import EvaluationError, ExecutorContractError


@dataclasses.dataclass
class _Late:
    """An evaluation still running when its round committed."""

    future: cf.Future
    point: np.ndarray  # a copy of its own: the objective may hold the one it was given
    index: int
    iteration: int


class RoundEvaluator:
    """Evaluates the rounds of one minimize call on `pool`."""

    def __init__(self, pool: cf.Executor, fun_and_grad: Callable[..., Any], engine: Any,
                 min_results: int | None, round_timeout: float | None) -> None:
        self.pool = pool
        self.fun_and_grad = fun_and_grad
        self.engine = engine
        n = engine.parallelism
        self.min_results = n if min_results is None else min_results
        self.round_timeout = math.inf if round_timeout is None else float(round_timeout)
        self.partial = self.min_results < n or math.isfinite(self.round_timeout)
        # The virtual-time protocol (optex.executors): a simulated clock, if the executor has one.
        self.clock: Callable[[], float] = getattr(pool, "virtual_time", time.monotonic)
        self.wait: Callable[..., Any] = getattr(pool, "wait_virtual", cf.wait)
        self.late: list[_Late] = []
        self.dropped = 0  # rows committed as missing
        self.observed = 0  # late gradients given to observe()
        self.late_failed = 0  # late evaluations that raised or ended without a result

    # ---- one round ----------------------------------------------------------------

    def evaluate(self, points: np.ndarray, seeds: list[int | None],
                 grads: np.ndarray, losses: np.ndarray) -> int:
        """Fills grads and losses for this round (NaN rows where a result is missing);
        returns how many are missing."""
        futures = self._submit(points, seeds)
        done, not_done = self._collect(futures)
        self._raise_first_failure(futures, done, not_done)
        missing = 0
        for i, f in enumerate(futures):
            if f in done:
                loss, grad = f.result()  # checked by _raise_first_failure
                losses[i] = real_loss(loss, f"fun_and_grad: the loss at point {i}")
                grads[i] = checked_gradient(grad, self.engine.dim, i)
            else:
                losses[i], grads[i] = math.nan, math.nan
                missing += 1
                # Not cancelled: Dask and Ray cannot say whether a task has
                # started, and cancelling a running one would waste its work.
                self.late.append(_Late(f, np.array(points[i]), i, self.engine.iteration))
        self.dropped += missing
        return missing

    def _submit(self, points: np.ndarray, seeds: list[int | None]) -> list[cf.Future]:
        futures: list[cf.Future] = []
        for i in range(len(seeds)):
            # The evaluation's own copy: the objective may keep it, and the
            # engine rewrites its rows at the next ask() (while a straggler of
            # a partial round may not even have started).
            x = objective_point(points[i])
            try:
                future = self.pool.submit(evaluate_point, self.fun_and_grad, x, seeds[i])
            except Exception as e:  # noqa: BLE001 - a shut-down or broken executor
                self._abandon(futures)
                raise self._error(i, "could not be submitted", e) from e
            if not isinstance(future, cf.Future):
                self._abandon(futures)
                raise self._contract_error(
                    i, f"its submit() returned {_describe(future)}, not a concurrent.futures.Future"
                )
            futures.append(future)
        return futures

    def _collect(self, futures: list[cf.Future]) -> tuple[set, set]:
        """Waits for every future, or (a partial round) for enough of them."""
        if not self.partial:
            return self.wait(futures, return_when=cf.ALL_COMPLETED)
        deadline = self.clock() + self.round_timeout
        done: set = set()
        not_done: set = set(futures)
        while not_done:
            if len(done) >= self.min_results or any(_failed(f) for f in done):
                break
            timeout = None
            if done and math.isfinite(deadline):
                # Capped at what a wait can take (a round_timeout of 1e300
                # passes the argument check); the loop waits again.
                timeout = min(max(0.0, deadline - self.clock()), threading.TIMEOUT_MAX)
                if timeout == 0.0:
                    break
            new_done, not_done = self.wait(not_done, timeout=timeout,
                                           return_when=cf.FIRST_COMPLETED)
            done |= set(new_done)
        return done, not_done

    def _raise_first_failure(self, futures: list[cf.Future], done: set, not_done: set) -> None:
        """Raises for the lowest-numbered point whose evaluation failed, if any."""
        for i, f in enumerate(futures):
            if f not in done or not _failed(f):
                continue
            self._abandon([g for g in futures if g in not_done])
            if f.cancelled():
                raise self._error(i, "was cancelled by the executor", cf.CancelledError())
            exc = f.exception()
            if exc is not None:
                raise self._error(i, "ended without a result", exc) from exc
            if not _is_evaluation(f.result()):
                raise self._contract_error(i, f"its future's result is {_describe(f.result())}")
            raised: Raised = f.result()
            error = as_raised(raised.exception)
            if hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(
                    f"optex.minimize: raised by fun_and_grad at point {i} of iteration "
                    f"{self.engine.iteration}; the round is still pending (minimize(fun_and_grad, "
                    "engine, ...) with an optex.OptEx retries it)"
                )
            if error.__traceback__ is None and raised.traceback:
                # Pickled back from another process: its traceback travels as text.
                if hasattr(error, "add_note"):
                    error.add_note("Traceback on the worker:\n" + raised.traceback)
            raise error

    def _error(self, i: int, what: str, cause: BaseException) -> EvaluationError:
        return EvaluationError(
            f"minimize: the evaluation of point {i} of iteration {self.engine.iteration} {what} "
            f"on {type(self.pool).__name__}: {type(cause).__name__}: {cause}. The engine is "
            "unchanged and the round still pending: optex.minimize(fun_and_grad, err.engine, "
            "...) retries it",
            point=i, iteration=self.engine.iteration, engine=self.engine,
        )

    def _contract_error(self, i: int, what: str, *, pending: bool = True,
                        iteration: int | None = None) -> ExecutorContractError:
        iteration = self.engine.iteration if iteration is None else iteration
        state = (
            "The engine is unchanged and the round still pending" if pending
            else f"The engine has committed iteration {self.engine.iteration}"
        )
        return ExecutorContractError(
            f"minimize: the executor {type(self.pool).__name__} broke the concurrent.futures "
            f"contract at point {i} of iteration {iteration}: {what}, where a Future of "
            f"the (loss, gradient) evaluation optex submitted was expected. {state}: "
            "optex.minimize(fun_and_grad, err.engine, ...) continues on another executor",
            point=i, iteration=iteration, engine=self.engine,
        )

    def _abandon(self, futures: list[cf.Future]) -> None:
        """Cancels what has not started; what runs is left to finish on its own."""
        for f in futures:
            f.cancel()

    # ---- late results -------------------------------------------------------------

    def observe_late_results(self) -> None:
        """Gives the late results that have arrived to the engine's observe()."""
        if not self.late:
            return
        arrived = [r for r in self.late if r.future.done()]
        if not arrived:
            return
        self.late = [r for r in self.late if not r.future.done()]
        bound = float(magnitude_bound(self.engine.dim))
        points, grads = [], []
        for r in arrived:
            if r.future.cancelled() or r.future.exception() is not None:
                self.late_failed += 1
                continue
            out = r.future.result()
            if not _is_evaluation(out):
                raise self._contract_error(
                    r.index, f"the future of this late evaluation holds {_describe(out)}",
                    pending=False, iteration=r.iteration)
            if isinstance(out, Raised):
                self.late_failed += 1
                continue
            loss, grad = out
            loss = real_loss(loss, f"fun_and_grad: the loss at point {r.index}")
            g = checked_gradient(grad, self.engine.dim, r.index).astype(np.float32)
            # What tell() would drop is not observed either.
            if math.isfinite(loss) and np.all(np.isfinite(g)) and np.max(np.abs(g)) <= bound:
                points.append(r.point)
                grads.append(g)
        if points:
            self.engine.observe(np.stack(points), np.stack(grads))
            self.observed += len(points)

    def close(self) -> None:
        """Cancels the late evaluations still out: nobody will observe them."""
        self._abandon([r.future for r in self.late])


def _failed(f: cf.Future) -> bool:
    """Whether a finished future holds no usable result: cancelled, raised, the
    objective raised, or (a broken executor) anything but an evaluation."""
    if f.cancelled() or f.exception() is not None:
        return True
    out = f.result()
    return isinstance(out, Raised) or not _is_evaluation(out)


def _is_evaluation(out: Any) -> bool:
    """Whether `out` is what evaluate_point returns: a (loss, grad) pair or a Raised."""
    return isinstance(out, Raised) or (isinstance(out, tuple) and len(out) == 2)


def _describe(value: Any) -> str:
    """A value as an error message names it: its type and a short repr."""
    return f"{type(value).__name__} {reprlib.repr(value)}"
