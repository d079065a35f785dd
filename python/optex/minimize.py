"""optex.minimize: the ask/tell loop with the N evaluations on threads, processes
or any concurrent.futures.Executor (Dask, Ray, mpi4py.futures, ...).

    import optex
    res = optex.minimize(fun_and_grad, x0, optimizer=optex.Adam(lr=1e-2), parallelism=4)
    res.x, res.fun, res.nit, res.n_gradient_evaluations, res.stop_reason

``fun_and_grad(x) -> (loss, grad)`` receives one point, a read-only float32 (d,)
array, and returns the loss and the gradient (a float32 or float64 array, or a
list, of shape (d,)), the convention of ``scipy.optimize.minimize(..., jac=True)``.
The gradient follows :meth:`OptEx.tell`'s rule: another dtype (int64, float16) or
shape raises the same ValueError, naming the point. A NaN or infinite gradient or
loss drops its pair, as ``tell(..., drop_nonfinite=True)`` does.

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

import dataclasses
import math
import multiprocessing
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, Literal, Sequence

import numpy as np

from . import _optex
from ._evaluation import evaluate_or_raise
from ._optex import IterationInfo, OptEx, Options
from ._rounds import RoundEvaluator

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
    """Sequential rounds (the engine's iterations; a continued engine's earlier ones included)."""
    n_gradient_evaluations: int
    """True gradient evaluations, the extra one at ``x`` included."""
    loss_history: list[float]
    """``IterationInfo.loss`` of every round."""
    stop_reason: str
    """"max_iters", "target_loss", "grad_tol" or "callback"."""
    n_dropped: int = 0
    """Rows committed without their result (``min_results``, ``round_timeout``)."""
    n_observed: int = 0
    """Late gradients given to :meth:`OptEx.observe` after their round committed."""

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


def _checked_partial_round(min_results: Any, round_timeout: Any, n: int) -> None:
    if min_results is not None and not (
        isinstance(min_results, int) and not isinstance(min_results, bool) and 1 <= min_results <= n
    ):
        raise ValueError(
            f"min_results: must be an int in [1, N = {n}] or None (wait for all), got {min_results!r}"
        )
    if round_timeout is not None and not (
        isinstance(round_timeout, (int, float)) and not isinstance(round_timeout, bool)
        and round_timeout > 0 and not math.isnan(round_timeout)
    ):
        raise ValueError(
            f"round_timeout: must be a number of seconds > 0 or None, got {round_timeout!r}"
        )


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

    Stops after ``max_iters`` rounds, once a round's loss is <= ``target_loss``,
    once the committed gradient's norm is <= ``grad_tol``, or when a callback
    (called with each round's :class:`IterationInfo`) returns True, whichever
    comes first. ``optimizer`` (a base optimizer such as ``optex.Adam(lr=1e-2)``,
    or a list of ``(size, optimizer)`` pairs for hyperparameters per range),
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

    Errors: ValueError for bad arguments (naming them). The exception the
    objective raised at the lowest-numbered failing point is re-raised as it
    is; an evaluation the executor could not deliver (shut down, a worker
    that died, an objective it cannot pickle, a cancelled future) raises
    :class:`optex.EvaluationError`. Either way the engine is unchanged and
    its round pending, so that passing it as ``x0`` retries.
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
    if not (isinstance(max_iters, int) and max_iters >= 0):
        raise ValueError(f"max_iters: must be an int >= 0, got {max_iters!r}")
    if math.isnan(target_loss):
        raise ValueError("target_loss: must not be NaN")
    if not (grad_tol >= 0.0):
        raise ValueError(f"grad_tol: must be >= 0, got {grad_tol!r}")
    if max_workers is not None and not (isinstance(max_workers, int) and max_workers >= 1):
        raise ValueError(f"max_workers: must be an int >= 1 or None, got {max_workers!r}")
    if not callable(fun_and_grad):
        raise ValueError("fun_and_grad: must be callable, got " + type(fun_and_grad).__name__)
    callbacks: list[Callback] = (
        [] if callback is None else [callback] if callable(callback) else list(callback)
    )

    engine = _engine(x0, optimizer, options, option_kwargs)
    n = engine.parallelism
    _checked_partial_round(min_results, round_timeout, n)
    # The sequential evaluations (target proxy steps, the final loss) use the
    # run's seed when the objective takes one.
    run_seed = int(engine.options.seed) if pass_seed else None
    if engine.options.proxy == "target":
        engine.set_gradient_oracle(lambda x: evaluate_or_raise(fun_and_grad, x, run_seed))
    grads = np.empty((n, engine.dim), dtype=np.float32)
    losses = np.empty(n, dtype=np.float64)
    history: list[float] = []
    stop_reason = "max_iters"
    bar = _progress(progress, max_iters)
    pool = _own_executor(workers, max_workers or n, mp_context) if own_pool else workers
    rounds = RoundEvaluator(pool, fun_and_grad, engine, min_results, round_timeout)
    try:
        for _ in range(max_iters):
            points = engine.ask()
            seeds = [int(s) for s in engine.seeds] if pass_seed else [None] * n
            rounds.evaluate(points, seeds, grads, losses)
            info = engine.tell(grads, losses, drop_nonfinite=True)
            rounds.observe_late_results()
            history.append(info.loss)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{info.loss:.4g}", refresh=False)
            asked = [bool(cb(info)) for cb in callbacks]
            if any(asked):
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
    fun, _ = evaluate_or_raise(fun_and_grad, x, run_seed)
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
