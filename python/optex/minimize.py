"""optex.minimize: the ask/tell loop with the N evaluations on threads, processes
or any concurrent.futures.Executor (Dask, Ray, mpi4py.futures, ...).

    import optex
    res = optex.minimize(fun_and_grad, x0, optimizer=optex.Adam(lr=1e-2), parallelism=4)
    res.x, res.fun, res.nit, res.n_gradient_evaluations, res.stop_reason

``fun_and_grad(x) -> (loss, grad)`` receives one point, a read-only float32 (d,)
array of its own, and returns the loss and the gradient, the convention of
``scipy.optimize.minimize(..., jac=True)``. It may keep ``x`` (a memo, a log):
each call gets a copy that nothing rewrites, on every executor. It may return
a buffer it reuses for every gradient: minimize copies the gradient (and
consumes the loss) on the worker the moment the objective returns (calls
that run at once on threads share such a buffer unsafely: use one per
thread, or ``max_workers=1``). The two copies cost O(N d) per round next to
the round's O(N T0 d): on the 2-core development VM, at N = 4 and T0 = 32,
0.2 ms of a 24 ms round at d = 1e5 and 7 ms of a 250 ms round at d = 1e6
(bench/python/copy_cost.py). The loss is a real number (int,
float, a numpy real scalar, a 0-d or one-element array or tensor); the gradient
a float32 or float64 array of shape (d,), or a list or tuple of d real numbers
(optex's one rule for values, _values.py; the same as :meth:`OptEx.tell`'s).
Anything else (a str, bool, complex or None loss, numeric strings in a list,
an int64 or float16 array, another shape) raises a ValueError naming the point
and the value. A NaN or infinite gradient or loss drops its pair, as
``tell(..., drop_nonfinite=True)`` does.

Threads (the default) give real parallelism when the objective releases the GIL
(numpy, torch, C extensions, subprocesses). An objective written in pure Python
holds the GIL: ``workers="processes"`` runs the N evaluations in N worker
processes instead (the function must then be picklable: defined at the top
level of a module). A cluster's executor spreads them over its workers. All
give the same result for a deterministic objective when every result is awaited;
``min_results`` and ``round_timeout`` let a round commit without its stragglers
(the round machinery is in _rounds.py).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import multiprocessing
import multiprocessing.synchronize
import numbers
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, Literal, Sequence

import numpy as np

from . import _optex
from ._evaluation import evaluate_or_raise
from ._optex import IterationInfo, OptEx, Options
from ._rounds import RoundEvaluator
from ._values import real_gradient, real_loss
from .evaluation_error import NonFiniteRoundError

Objective = Callable[..., "tuple[float, Any]"]
Callback = Callable[[IterationInfo], "bool | None"]


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`minimize` returns."""

    x: np.ndarray
    """The final iterate, float32 (d,)."""
    fun: float
    """The loss at ``x`` (one extra evaluation, counted below)."""
    nit: int
    """The engine's iterations (``OptEx.iteration``): a continued engine's earlier ones included."""
    n_gradient_evaluations: int
    """The engine's gradient evaluations (``OptEx.evaluations``, a continued engine's
    earlier ones included) plus this call's extra one at ``x``."""
    loss_history: list[float]
    """``IterationInfo.loss`` of every round this call committed: entry k is iteration
    ``nit - len(loss_history) + k``."""
    stop_reason: str
    """"max_iters", "target_loss", "grad_tol" or "callback"."""
    n_dropped: int = 0
    """Rows this call committed without their result (``min_results``, ``round_timeout``)."""
    n_observed: int = 0
    """Late gradients this call gave to :meth:`OptEx.observe` after their round committed."""

    def __repr__(self) -> str:
        return (
            f"OptimizeResult(fun={self.fun!r}, nit={self.nit}, "
            f"n_gradient_evaluations={self.n_gradient_evaluations}, "
            f"n_dropped={self.n_dropped}, n_observed={self.n_observed}, "
            f"stop_reason={self.stop_reason!r}, x=<float32 array of {self.x.size}>)"
        )


def _own_executor(workers: str, count: int, mp_context: str | None) -> Executor:
    if workers == "threads":
        return ThreadPoolExecutor(max_workers=count, thread_name_prefix="optex")
    context = multiprocessing.get_context(mp_context)
    # The pool's call queue is a semaphore of max_workers + 1 slots: a larger
    # max_workers would overflow it. No run can tell the difference: processes
    # start as evaluations need them (under "spawn" and "forkserver").
    count = min(count, multiprocessing.synchronize.SEM_VALUE_MAX - 1)
    return ProcessPoolExecutor(max_workers=count, mp_context=context)


def _progress(enabled: bool | None, total: int) -> Any:
    """A tqdm bar on stderr when it is a terminal (or when asked for); None otherwise."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    from tqdm.auto import tqdm  # a runtime dependency; imported only when drawing

    return tqdm(total=total, unit="round", file=sys.stderr, dynamic_ncols=True)


def _engine(x0: Any, optimizer: Any, options: Options | None, option_kwargs: dict) -> OptEx:
    """x0's engine to continue, or a new one from x0 and the configuration."""
    if not isinstance(x0, _optex.OptEx):  # the class itself, whatever OptEx names here
        return OptEx(x0, optimizer, options, **option_kwargs)
    given = [name for name, value in (("optimizer", optimizer), ("options", options)) if value]
    given += sorted(option_kwargs)
    if given:
        raise ValueError(
            "x0: an optex.OptEx is continued with its own configuration; "
            f"do not pass {', '.join(given)}"
        )
    return x0


def _is_int(value: Any) -> bool:
    """An int (a numpy integer too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    """A real number (int, float, numpy real scalar), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _seconds(value: Any) -> float:
    """A round_timeout that passed its check as a float; an int beyond the float
    range waits as long as math.inf does."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _checked_partial_round(min_results: Any, round_timeout: Any, engine: OptEx) -> None:
    n = engine.parallelism
    if min_results is not None and not (_is_int(min_results) and 1 <= min_results <= n):
        raise ValueError(
            f"min_results: must be an int in [1, N = {n}] or None (wait for all), got {min_results!r}"
        )
    if round_timeout is not None and not (_is_real(round_timeout) and round_timeout > 0):
        raise ValueError(  # NaN fails the comparison
            f"round_timeout: must be a number of seconds > 0 or None, got {round_timeout!r}"
        )
    partial = (min_results is not None and min_results < n) or (
        round_timeout is not None and math.isfinite(_seconds(round_timeout)))
    if partial and engine.options.mode == "verified":
        # The verified commit replays the base optimizer from row 0 through the
        # round's rows in order: a round without some of them (row 0 above all)
        # has nothing it can verify.
        raise ValueError(
            "min_results, round_timeout: the verified mode (Options.mode 'verified') needs "
            "every row of a round; leave min_results and round_timeout at None (wait for all "
            f"N = {n}), or use mode 'approximate' to commit without stragglers"
        )


def _checked_stopping(max_iters: Any, target_loss: Any, grad_tol: Any,
                      max_workers: Any) -> None:
    """ValueError naming the first bad stopping or pool argument. Any value that
    passes runs: every comparison below is exact for ints of any size."""
    if not (_is_int(max_iters) and max_iters >= 0):
        raise ValueError(f"max_iters: must be an int >= 0, got {max_iters!r}")
    if not (_is_real(target_loss) and target_loss == target_loss):  # NaN != NaN
        raise ValueError(f"target_loss: must be a real number (not NaN), got {target_loss!r}")
    if not (_is_real(grad_tol) and grad_tol >= 0):  # NaN fails the comparison
        raise ValueError(f"grad_tol: must be a real number >= 0, got {grad_tol!r}")
    if max_workers is not None and not (_is_int(max_workers) and max_workers >= 1):
        raise ValueError(f"max_workers: must be an int >= 1 or None, got {max_workers!r}")


def _checked_callbacks(callback: Any) -> list[Callback]:
    """The callbacks as a list; ValueError before anything runs unless each is callable
    (a bad one found after the first round would end the run there)."""
    if callback is None:
        return []
    if callable(callback):
        return [callback]
    if (isinstance(callback, collections.abc.Sequence) and not isinstance(callback, (str, bytes))
            and all(callable(cb) for cb in callback)):
        return list(callback)
    raise ValueError(f"callback: must be a callable or a sequence of callables, got {callback!r}")


def _asked_to_stop(callbacks: list[Callback], info: IterationInfo) -> bool:
    """Calls every callback with the round's info; whether one returned True or raised
    StopIteration (scipy.optimize's convention). Each is called even when an earlier
    one asked to stop, so that all of them see the last round."""
    asked = False
    for cb in callbacks:
        try:
            asked |= bool(cb(info))
        except StopIteration:
            asked = True
    return asked


def _checked_evaluation(fun_and_grad: Objective, x: np.ndarray,
                        seed: int | None) -> "tuple[float, np.ndarray]":
    """One evaluation in this thread (the final loss, Proxy::target's oracle), its
    loss and gradient checked as a round's are."""
    loss, grad = evaluate_or_raise(fun_and_grad, x, seed)
    return (real_loss(loss, "fun_and_grad: the loss at x"),
            real_gradient(grad, x.size, "fun_and_grad: the gradient at x"))


def _committed(engine: OptEx, grads: np.ndarray, losses: np.ndarray) -> IterationInfo:
    """tell(), dropping non-finite pairs; NonFiniteRoundError when none is left."""
    iteration = engine.iteration
    try:
        return engine.tell(grads, losses, drop_nonfinite=True)
    except RuntimeError as e:
        # The engine's refusal when no pair can be committed: it changed nothing.
        if not (engine.pending and f"no pair of iteration {iteration}" in str(e)):
            raise
        raise NonFiniteRoundError(
            f"minimize: no evaluation of iteration {iteration} can be committed: each of its "
            f"N = {len(losses)} pairs has a non-finite loss or gradient (or one above the "
            "magnitude bound, or a step to a non-finite iterate); losses "
            f"{np.array2string(losses, threshold=8)}. The engine is unchanged and the round "
            "still pending: optex.minimize(fun_and_grad, err.engine, ...) evaluates it again "
            "and continues",
            point=0, iteration=iteration, engine=engine,
        ) from e


def minimize(
    fun_and_grad: Objective,
    x0: Any,
    *,
    optimizer: Any = None,
    options: Options | None = None,
    max_iters: int = 1000,
    target_loss: float = -math.inf,
    grad_tol: float = 0.0,
    workers: "Literal['threads', 'processes'] | Executor" = "threads",
    max_workers: int | None = None,
    mp_context: str | None = "spawn",
    pass_seed: bool = False,
    min_results: int | None = None,
    round_timeout: float | None = None,
    callback: Callback | Sequence[Callback] | None = None,
    progress: bool | None = None,
    **option_kwargs: Any,
) -> OptimizeResult:
    """Runs OptEx until a stop criterion holds.

    Stops once the engine has done ``max_iters`` iterations (``nit``), once a
    round's loss is <= ``target_loss``, once the committed gradient's norm is <=
    ``grad_tol``, or when a callback asks to, whichever comes first. Each
    callback is called with each round's :class:`IterationInfo`, after the
    commit; it asks to stop by returning True or by raising ``StopIteration``
    (scipy.optimize's convention): the run then returns its result with
    ``stop_reason`` "callback" (every callback is still called for that round).
    Any other exception of a callback propagates, the round committed.

    ``optimizer`` (a base optimizer such as ``optex.Adam(lr=1e-2)``, or a
    list of ``(size, optimizer)`` pairs for hyperparameters per range),
    ``options`` and ``option_kwargs`` configure the engine as in :class:`OptEx`
    (e.g. ``parallelism=4, history=32, seed=0``; every field of
    :class:`Options`, ``evaluations_per_point``, ``strategy``,
    ``continue_from``, ``max_posterior_variance``, ``trust_region`` and
    ``max_lengthscale_change`` included; ``options=optex.Options.adaptive(4)``
    for the robust configuration). With ``evaluations_per_point`` D > 1 each
    round evaluates N / D points D times each; ``pass_seed`` then gives each
    evaluation of a point its own seed.

    ``x0`` may also be an :class:`OptEx`: the run continues that engine (its own
    configuration; a round left pending by an error is evaluated again, the
    same points with the same seeds), and leaves it where the run ends.
    ``max_iters`` bounds the engine's iteration count, not this call's rounds:
    the call runs ``max_iters - engine.iteration`` rounds at most (none when the
    engine is there already). So the documented retry, the engine of an error
    passed back with the same stopping arguments, ends where the run without
    the error would have, with the same ``x``, ``fun``, ``nit``,
    ``n_gradient_evaluations`` and ``stop_reason``; its ``loss_history``,
    ``n_dropped`` and ``n_observed`` count this call's rounds only (the
    retry's history is the uninterrupted one's from the pending iteration on).
    To run k more rounds of an engine on purpose, pass
    ``max_iters=engine.iteration + k``.

    ``workers``: "threads", "processes" (``max_workers`` of them, N by default;
    processes start with ``mp_context``, "spawn" by default: safe with threads
    in the parent and the same on every platform), or any
    ``concurrent.futures.Executor`` (Dask's ``client.get_executor()``,
    ``mpi4py.futures.MPIPoolExecutor``, ``optex.executors.RayExecutor``, ...),
    which is used as it is and not shut down. Waiting for every result, every
    executor gives the threads' trajectory bit for bit. ``pass_seed``: call
    ``fun_and_grad(x, seed=s)`` with each point's own seed (its minibatch or
    episodes), the same on every run. ``progress``: draw a bar on stderr; by
    default only when stderr is a terminal.

    Stragglers: with ``min_results`` K (1 <= K <= N) a round commits as soon as
    K of its N evaluations are in; with ``round_timeout`` (seconds, from the
    round's submission) once the timeout has passed with at least one in. The
    missing rows are dropped as a non-finite row is. Their evaluations keep
    running, and a gradient that arrives after its round committed is given
    to :meth:`OptEx.observe`, so it still improves the predictions (those
    still out when the run ends are cancelled). The defaults (None) wait for
    all N.

    Errors: ValueError for bad arguments (naming them; every value that
    passes runs: ``round_timeout`` may be any number > 0, ``math.inf``
    included, ``max_iters`` any int >= 0). ``min_results`` or a finite
    ``round_timeout`` with the verified mode is a ValueError: its commit needs
    every row. ValueError for a loss or gradient outside the rule above
    (naming the point and the value). The exception the objective raised at
    the lowest-numbered failing point is re-raised as it is, on every executor
    (KeyboardInterrupt, SystemExit and GeneratorExit too); an evaluation
    the executor could not deliver (shut down, a worker that died, an
    objective it cannot pickle, a cancelled future) raises
    :class:`optex.EvaluationError`; an executor that breaks the Future
    contract (``submit`` returns something that is not a
    ``concurrent.futures.Future``, a future's result is None or not the
    evaluation) raises a TypeError naming the executor's type and what it
    returned (:class:`optex.ExecutorContractError`, also an EvaluationError);
    a round none of whose N pairs can be committed (every loss or gradient
    non-finite) raises :class:`optex.NonFiniteRoundError`, an
    EvaluationError. In each case the engine is unchanged and its round
    pending (``err.engine``), so that passing it as ``x0`` retries the round
    and continues the run.
    """
    own_pool = isinstance(workers, str)
    if own_pool and workers not in ("threads", "processes"):
        raise ValueError(
            "workers: must be 'threads', 'processes' or a concurrent.futures.Executor, "
            f"got {workers!r}"
        )
    if not own_pool and not isinstance(workers, Executor):
        raise ValueError(
            "workers: must be 'threads', 'processes' or a concurrent.futures.Executor, got "
            + type(workers).__name__
        )
    _checked_stopping(max_iters, target_loss, grad_tol, max_workers)
    if not callable(fun_and_grad):
        raise ValueError("fun_and_grad: must be callable, got " + type(fun_and_grad).__name__)
    callbacks = _checked_callbacks(callback)

    engine = _engine(x0, optimizer, options, option_kwargs)
    n = engine.parallelism
    _checked_partial_round(min_results, round_timeout, engine)
    # The sequential evaluations (target proxy steps, the final loss) use the
    # run's seed when the objective takes one.
    run_seed = int(engine.options.seed) if pass_seed else None
    if engine.options.proxy == "target":
        engine.set_gradient_oracle(lambda x: _checked_evaluation(fun_and_grad, x, run_seed))
    grads = np.empty((n, engine.dim), dtype=np.float32)
    losses = np.empty(n, dtype=np.float64)
    history: list[float] = []
    stop_reason = "max_iters"
    # max_iters bounds the engine's iteration count (nit), not this call's rounds:
    # a run continued from an error stops where the uninterrupted run would.
    rounds_left = max(0, max_iters - engine.iteration)
    bar = _progress(progress, rounds_left)
    pool = _own_executor(workers, max_workers or n, mp_context) if own_pool else workers
    timeout = None if round_timeout is None else _seconds(round_timeout)
    rounds = RoundEvaluator(pool, fun_and_grad, engine, min_results, timeout)
    try:
        while engine.iteration < max_iters:
            points = engine.ask()
            seeds = [int(s) for s in engine.seeds] if pass_seed else [None] * n
            rounds.evaluate(points, seeds, grads, losses)
            info = _committed(engine, grads, losses)
            rounds.observe_late_results()
            history.append(info.loss)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{info.loss:.4g}", refresh=False)
            if _asked_to_stop(callbacks, info):
                stop_reason = "callback"
                break
            if info.loss <= target_loss:
                stop_reason = "target_loss"
                break
            if info.grad_norm <= grad_tol:
                stop_reason = "grad_tol"
                break
    finally:
        rounds.close()
        if own_pool:
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    x = engine.x
    fun, _ = _checked_evaluation(fun_and_grad, x, run_seed)
    return OptimizeResult(
        x=x,
        fun=fun,
        nit=engine.iteration,
        n_gradient_evaluations=engine.evaluations + 1,
        loss_history=history,
        stop_reason=stop_reason,
        n_dropped=rounds.dropped,
        n_observed=rounds.observed,
    )
