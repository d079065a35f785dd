"""optex.minimize: the ask/tell loop with the N evaluations on threads or processes.

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
level of a module). Both give the same result for a deterministic objective.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, Literal, Sequence

import numpy as np

from ._optex import IterationInfo, OptEx, Options

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
    """Sequential rounds (OptEx iterations)."""
    n_gradient_evaluations: int
    """True gradient evaluations, the extra one at ``x`` included."""
    loss_history: list[float]
    """``IterationInfo.loss`` of every round."""
    stop_reason: str
    """"max_iters", "target_loss", "grad_tol" or "callback"."""

    def __repr__(self) -> str:
        return (
            f"OptimizeResult(fun={self.fun!r}, nit={self.nit}, "
            f"n_gradient_evaluations={self.n_gradient_evaluations}, "
            f"stop_reason={self.stop_reason!r}, x=<float32 array of {self.x.size}>)"
        )


def _evaluate(fun_and_grad: Objective, x: np.ndarray, seed: int | None) -> tuple[float, np.ndarray]:
    """One evaluation, checked; runs in a worker thread or process."""
    out = fun_and_grad(x) if seed is None else fun_and_grad(x, seed=seed)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            "fun_and_grad: must return a (loss, grad) tuple, got " + type(out).__name__
        )
    loss, grad = out
    return float(loss), grad


def _executor(workers: str, count: int, mp_context: str | None) -> Executor:
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


def minimize(
    fun_and_grad: Objective,
    x0: Any,
    *,
    optimizer: Any = None,
    options: Options | None = None,
    max_iters: int = 1000,
    target_loss: float = -math.inf,
    grad_tol: float = 0.0,
    workers: Literal["threads", "processes"] = "threads",
    max_workers: int | None = None,
    mp_context: str | None = "spawn",
    pass_seed: bool = False,
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

    ``workers``: "threads" or "processes" (``max_workers`` of them, N by
    default; processes start with ``mp_context``, "spawn" by default: safe with
    threads in the parent and the same on every platform). ``pass_seed``: call
    ``fun_and_grad(x, seed=s)`` with each point's own seed (its minibatch or
    episodes), the same on every run. ``progress``: draw a bar on stderr; by
    default only when stderr is a terminal.

    Raises ValueError for bad arguments (naming them), and re-raises the
    exception of the lowest-numbered point whose evaluation failed.
    """
    if workers not in ("threads", "processes"):
        raise ValueError(f"workers: must be 'threads' or 'processes', got {workers!r}")
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

    engine = OptEx(x0, optimizer, options, **option_kwargs)
    # The sequential evaluations (target proxy steps, the final loss) use the
    # run's seed when the objective takes one.
    run_seed = int(engine.options.seed) if pass_seed else None
    if engine.options.proxy == "target":
        engine.set_gradient_oracle(lambda x: _evaluate(fun_and_grad, x, run_seed))
    n = engine.parallelism
    grads = np.empty((n, engine.dim), dtype=np.float32)
    losses = np.empty(n, dtype=np.float64)
    history: list[float] = []
    stop_reason = "max_iters"
    bar = _progress(progress, max_iters)
    try:
        with _executor(workers, max_workers or n, mp_context) as pool:
            for _ in range(max_iters):
                points = engine.ask()
                seeds = [int(s) for s in engine.seeds] if pass_seed else [None] * n
                futures = [
                    pool.submit(_evaluate, fun_and_grad, points[i], seeds[i]) for i in range(n)
                ]
                # Every evaluation finishes before the first error is raised,
                # so no worker is still writing when we leave.
                outcomes = [f.exception() or f.result() for f in futures]
                for i, outcome in enumerate(outcomes):
                    if isinstance(outcome, BaseException):
                        raise outcome
                    losses[i], grads[i] = outcome[0], _checked_gradient(outcome[1], engine.dim, i)
                info = engine.tell(grads, losses, drop_nonfinite=True)
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
        if bar is not None:
            bar.close()
    x = engine.x
    fun, _ = _evaluate(fun_and_grad, x, run_seed)
    return OptimizeResult(
        x=x,
        fun=fun,
        nit=engine.iteration,
        n_gradient_evaluations=engine.evaluations + 1,
        loss_history=history,
        stop_reason=stop_reason,
    )


def _checked_gradient(grad: Any, dim: int, i: int) -> np.ndarray:
    """The gradient of point i under OptEx.tell()'s rule, or the same ValueError.

    Lists and tuples are read as float64; arrays must be float32 or float64 (an
    int64 or float16 gradient is refused, never cast). Checked before tell().
    """
    name = f"fun_and_grad: the gradient at point {i}"
    try:
        if isinstance(grad, (list, tuple)):
            grad = np.asarray(grad, dtype=np.float64)
        else:
            grad = np.asarray(grad)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} cannot be converted to a float array") from e
    if grad.dtype not in (np.float32, np.float64):
        raise ValueError(
            f"{name}: dtype {grad.dtype} is not supported: return float32 or float64 "
            "(for example grad.astype(numpy.float32))"
        )
    if grad.shape != (dim,):
        raise ValueError(f"{name} has shape {grad.shape}, expected ({dim},)")
    return grad
