"""optex.executors.RayExecutor: Ray tasks behind the ``concurrent.futures.Executor`` interface.

    import ray
    from optex.executors import RayExecutor

    ray.init()                      # or ray.init(address="auto") on a cluster
    with RayExecutor(remote_options={"num_cpus": 1}) as pool:
        res = optex.minimize(fun_and_grad, x0, parallelism=8, workers=pool)

Each ``submit(fn, *args, **kwargs)`` runs ``fn(*args, **kwargs)`` as one Ray
task (``ray.remote`` of a small trampoline, with ``.options(**remote_options)``)
and returns a ``concurrent.futures.Future`` fed by the task's ``ObjectRef``
(``ObjectRef.future()``). ``fn`` and its arguments travel with Ray's
serializer (cloudpickle: lambdas and closures are fine; a lock or an open file
is not, and ``submit`` then raises Ray's serialization error).

Ray itself. ``import ray`` happens when a RayExecutor is made, never at
``import optex``. The executor uses the Ray instance the process is connected
to (``ray.init()`` called before); it starts one only when asked,
``RayExecutor(init=True)`` or ``init={...ray.init keyword arguments...}``,
and only that one is shut down by ``shutdown()``. Without a connection and
without ``init`` it raises RuntimeError instead of letting Ray start a local
instance on its own.

Failures, as Ray reports them:

- the function raises: the future's exception is the function's own exception
  type (Ray's ``RayTaskError`` made an instance of the cause's class);
- the worker process dies: Ray retries the task on a fresh worker, up to
  ``max_retries`` times (3 by default, a Ray option:
  ``remote_options={"max_retries": 0}`` turns retries off); when retries are
  exhausted the future's exception is Ray's ``WorkerCrashedError``;
- cancellation: ``Future.cancel()`` calls ``ray.cancel`` on the task: a queued
  task never runs, a running one is interrupted (``KeyboardInterrupt`` in the
  task, ``force=False``). Ray does not tell which of the two it was, so unlike a
  thread pool's, ``cancel()`` succeeds while the task runs, as Dask's executor's
  does (:func:`optex.minimize` therefore cancels nothing of a round that
  committed without its stragglers while the run goes on).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable, Mapping

__all__ = ["RayExecutor"]


def _trampoline(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """What every Ray task runs."""
    return fn(*args, **kwargs)


class RayExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` whose calls are Ray tasks.

    ``remote_options``: Ray task options for every call (``num_cpus``,
    ``num_gpus``, ``resources``, ``max_retries``, ``runtime_env``, ...), as
    ``ray.remote(...).options(**remote_options)`` takes them.

    ``init``: start Ray if this process is not connected to it yet: True for
    ``ray.init()``, or a dict of ``ray.init`` keyword arguments. Ignored when
    Ray is already initialized. Only a Ray instance started here is shut down
    by :meth:`shutdown`.
    """

    def __init__(self, remote_options: Mapping[str, Any] | None = None, *,
                 init: bool | Mapping[str, Any] = False) -> None:
        try:
            import ray
        except ImportError as e:
            raise ImportError(
                "optex.executors.RayExecutor needs Ray: pip install ray"
            ) from e
        self._ray = ray
        self._started_ray = False
        if not ray.is_initialized():
            if init is False or init is None:
                raise RuntimeError(
                    "RayExecutor: Ray is not initialized in this process: call ray.init() "
                    "(ray.init(address=...) for a cluster) first, or pass init=True "
                    "(or init={...ray.init arguments...}) to start a local instance"
                )
            ray.init(**({} if init is True else dict(init)))
            self._started_ray = True
        options = dict(remote_options or {})
        remote = ray.remote(_trampoline)
        self._remote = remote.options(**options) if options else remote
        self._lock = threading.Lock()
        self._shutdown = False
        self._pending: dict[cf.Future, Any] = {}  # future -> ObjectRef, until done

    @property
    def started_ray(self) -> bool:
        """Whether this executor started the Ray instance it uses (and shuts it down)."""
        return self._started_ray

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Runs ``fn(*args, **kwargs)`` as a Ray task; its Future."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            ref = self._remote.remote(fn, args, kwargs)
            future: cf.Future = cf.Future()
            future.object_ref = ref  # type: ignore[attr-defined]  # what Ray's own future keeps
            self._pending[future] = ref
        future.add_done_callback(self._on_done)
        # Ray's concurrent future of the ref: it delivers the value, the cause's
        # exception type for RayTaskError, or Ray's error; copied onto ours.
        ref.future().add_done_callback(lambda ray_future: _copy_outcome(ray_future, future))
        return future

    def _on_done(self, future: cf.Future) -> None:
        with self._lock:
            ref = self._pending.pop(future, None)
        if future.cancelled():
            # cancel() alone does not wake wait() and as_completed(): this does
            # (what an executor's worker does when it meets a cancelled call).
            future.set_running_or_notify_cancel()
            if ref is not None:
                try:
                    self._ray.cancel(ref, force=False)
                except Exception:  # noqa: BLE001 - already finished, or Ray is gone
                    pass

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new submits; ``cancel_futures``: cancel the calls not done yet;
        ``wait``: wait for the rest. Shuts Ray down only if this executor started it."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            pending = list(self._pending)
        if cancel_futures:
            for future in pending:
                future.cancel()
        if wait:
            cf.wait(pending)
        if self._started_ray:
            self._ray.shutdown()
            # Whatever had not finished never will: its waiters must not hang.
            for future in pending:
                try:
                    future.set_exception(RuntimeError(
                        "RayExecutor.shutdown: the Ray instance it started was shut down "
                        "before this task finished"))
                except cf.InvalidStateError:  # done or cancelled
                    pass


def _copy_outcome(source: cf.Future, target: cf.Future) -> None:
    """Ray's future's outcome onto the executor's, unless that one was cancelled."""
    if target.done():
        return
    try:
        error = source.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(source.result())
    except cf.InvalidStateError:  # cancelled meanwhile
        pass
