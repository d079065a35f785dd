"""The MPI half of test_cluster_executors.py: run under

    mpirun -n 3 python -m mpi4py.futures tests/python/mpi_minimize_job.py OUT.json

(rank 0 runs this script, ranks 1 and 2 are the workers of its
mpi4py.futures.MPIPoolExecutor). It runs optex.minimize with the MPI executor
and with threads, provokes the error paths that MPI can survive, and writes what
it saw to OUT.json for the test to compare. The objectives come from
objectives.py, which the workers import by name (PYTHONPATH names tests/python).

Not here: a worker that dies. Open MPI ends the whole job when a rank exits
without MPI_Finalize, the parent included, so there is nothing to retry from.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from objectives import (
    Thrifty,
    Unpicklable,
    fails_far_from_start,
    noisy_sphere,
    point_is_read_only,
    rosenbrock,
)

import optex
from optex import problems

X0 = problems.Rosenbrock().standard_start(10)
# 45 rounds to the target (tests/python/test_cluster_executors.py uses the same).
TO_TARGET = dict(optimizer=optex.Adam(lr=0.1), parallelism=4, max_iters=300, target_loss=8.0)
SEEDED = dict(optimizer=optex.Sgd(lr=0.05), parallelism=4, max_iters=20, pass_seed=True, seed=3,
              evaluations_per_point=2)


def run(res: optex.OptimizeResult) -> dict[str, Any]:
    """What the test compares, float bits as hex."""
    return {"x": res.x.tobytes().hex(), "fun": res.fun.hex(), "nit": res.nit,
            "loss_history": [v.hex() for v in res.loss_history],
            "n_gradient_evaluations": res.n_gradient_evaluations, "stop_reason": res.stop_reason}


def error(e: BaseException) -> dict[str, Any]:
    return {"type": type(e).__name__, "message": str(e),
            "is_evaluation_error": isinstance(e, optex.EvaluationError),
            "point": getattr(e, "point", None), "iteration": getattr(e, "iteration", None),
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
            "notes": list(getattr(e, "__notes__", []))}


def raised(f: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    try:
        f(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - recorded for the test
        return error(e)
    return {"type": None}


def main(out_path: str) -> None:
    from mpi4py import MPI
    from mpi4py.futures import MPIPoolExecutor

    out: dict[str, Any] = {"world_size": MPI.COMM_WORLD.Get_size()}
    start = time.perf_counter()
    with MPIPoolExecutor() as pool:
        out["num_workers"] = pool.num_workers
        out["threads"] = run(optex.minimize(rosenbrock, X0, **TO_TARGET))
        out["mpi"] = run(optex.minimize(rosenbrock, X0, workers=pool, **TO_TARGET))
        # Points kept and gradient buffers reused (test_memory_contract.py), read-only points.
        out["mpi_thrifty"] = run(optex.minimize(Thrifty(), X0, workers=pool, **TO_TARGET))
        out["mpi_read_only"] = run(optex.minimize(point_is_read_only, X0, workers=pool,
                                                  **TO_TARGET))
        out["threads_seeded"] = run(optex.minimize(noisy_sphere, X0, **SEEDED))
        out["mpi_seeded"] = run(optex.minimize(noisy_sphere, X0, workers=pool, **SEEDED))
        out["raises_threads"] = raised(optex.minimize, fails_far_from_start, X0, **TO_TARGET)
        out["raises_mpi"] = raised(optex.minimize, fails_far_from_start, X0, workers=pool,
                                   **TO_TARGET)
        # mpi4py pickles with the standard pickle: an object holding a lock
        # cannot travel, and neither can a lambda (Dask and Ray take lambdas).
        out["unpicklable"] = raised(optex.minimize, Unpicklable(), X0, workers=pool, max_iters=3)
        out["lambda"] = raised(optex.minimize, lambda x: rosenbrock(x), X0, workers=pool,
                               max_iters=3)
        # The pool still works after those.
        out["after_errors"] = run(optex.minimize(rosenbrock, X0, workers=pool, **TO_TARGET))

        # A shut-down executor, and the retry from the error's engine on a live one.
        closed = MPIPoolExecutor()
        closed.shutdown()
        engine = optex.OptEx(X0, optex.Adam(lr=0.1), parallelism=4)
        try:
            optex.minimize(rosenbrock, engine, workers=closed, max_iters=300, target_loss=8.0)
            out["shut_down"] = {"type": None}
        except optex.EvaluationError as e:
            out["shut_down"] = error(e)
            out["shut_down"]["engine_pending"] = e.engine.pending and e.engine is engine
            out["retried"] = run(optex.minimize(rosenbrock, e.engine, workers=pool,
                                                max_iters=300, target_loss=8.0))
    out["seconds"] = time.perf_counter() - start
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
