"""optex.minimize on real cluster engines, started locally: Dask (a LocalCluster
of 2 worker processes, ``client.get_executor()``), Ray (``ray.init(num_cpus=2)``,
optex.executors.RayExecutor) and MPI (``mpi4py.futures.MPIPoolExecutor`` under
``mpirun -n 3 python -m mpi4py.futures``, in a subprocess:
mpi_minimize_job.py). Waiting for every result, each gives the threads'
trajectory bit for bit; the objective's exception keeps its type; what the
engine cannot deliver (pickling, shut down, cancelled, a dead worker) is an
optex.EvaluationError whose engine continues the run as if nothing happened.

One Dask cluster and one Ray instance serve the whole module. A test whose engine
is not installed skips and says so; with OPTEX_REQUIRE_CLUSTER=1 (scripts/test.sh
sets it) it fails instead."""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import pytest
from cluster_objectives import SleepsOnce, straggler
from conftest import REPO_ROOT
from objectives import (
    DiesOnce,
    Thrifty,
    Unpicklable,
    fails_far_from_start,
    noisy_sphere,
    point_is_read_only,
    raises_keyboard_interrupt,
    rosenbrock,
)

import optex
from optex import problems

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("OPTEX_REQUIRE_CLUSTER") == "1"

X0 = problems.Rosenbrock().standard_start(10)
# Reaches the target in 45 rounds (mpi_minimize_job.py runs the same).
STOP = dict(max_iters=300, target_loss=8.0)
TO_TARGET = dict(optimizer=optex.Adam(lr=0.1), parallelism=4, **STOP)
SEEDED = dict(optimizer=optex.Sgd(lr=0.05), parallelism=4, max_iters=20, pass_seed=True, seed=3,
              evaluations_per_point=2)


def engine_module(name: str, install: str) -> ModuleType:
    """The engine's module; skips (fails with OPTEX_REQUIRE_CLUSTER=1) when it is missing."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        reason = f"{name} is not installed ({install}, or pip install .[test]): {e}"
        if REQUIRED:
            pytest.fail(reason + "; OPTEX_REQUIRE_CLUSTER=1 requires it", pytrace=False)
        pytest.skip(reason)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_run(a: optex.OptimizeResult, b: optex.OptimizeResult) -> bool:
    return (same_bits(a.x, b.x) and a.fun == b.fun and a.loss_history == b.loss_history
            and a.nit == b.nit and a.n_gradient_evaluations == b.n_gradient_evaluations)


@pytest.fixture(scope="module")
def threads_run() -> optex.OptimizeResult:
    res = optex.minimize(rosenbrock, X0, **TO_TARGET)
    assert res.stop_reason == "target_loss" and res.nit == 45
    return res


# ---- the engines ------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client() -> Any:
    engine_module("distributed", "pip install 'dask[distributed]'")
    from distributed import Client, LocalCluster

    # Worker processes start with "spawn" and get this process's sys.path:
    # they import objectives.py by name.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def ray_session() -> ModuleType:
    ray = engine_module("ray", "pip install ray")
    assert not ray.is_initialized(), "another test left Ray running"
    # Ray's workers are started by its raylet, not forked from here: they find
    # objectives.py through PYTHONPATH, which they inherit.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE)] + ([saved] if saved else []))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    yield ray
    ray.shutdown()


class Engine:
    """Makes fresh executors of one engine, and knows how that engine aborts one."""

    def __init__(self, name: str, make: Callable[..., cf.Executor],
                 make_default: Callable[[], cf.Executor],
                 abort: Callable[[cf.Executor], None]) -> None:
        self.name = name
        self.make = make  # what the tests use
        self.make_default = make_default  # the engine's executor as it comes
        self.abort = abort


@pytest.fixture(params=["dask", "ray"])
def engine(request: pytest.FixtureRequest) -> Engine:
    if request.param == "dask":
        client = request.getfixturevalue("dask_client")
        # pure=False: a key of its own for every call. With Dask's default (a key
        # from the function and its arguments), the retry of a cancelled round
        # submits the very keys the scheduler is still cancelling, and gets them
        # cancelled too. Dask's ClientExecutor.shutdown(wait=False) cancels what
        # has not finished.
        return Engine("dask", lambda **kw: client.get_executor(pure=False, **kw),
                      client.get_executor, lambda pool: pool.shutdown(wait=False))
    request.getfixturevalue("ray_session")
    from optex.executors import RayExecutor

    return Engine("ray", lambda **kw: RayExecutor(**kw), RayExecutor,
                  lambda pool: pool.shutdown(wait=False, cancel_futures=True))


# ---- RayExecutor itself -----------------------------------------------------------


def test_optex_imports_no_engine() -> None:
    # RayExecutor's module imports Ray when an executor is made, not before.
    code = ("import sys, optex, optex.executors.ray_executor; "
            "from optex.executors import RayExecutor; "
            "print(sorted({'ray', 'dask', 'distributed', 'mpi4py'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_ray_executor_starts_and_stops_ray_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = engine_module("ray", "pip install ray")
    from optex.executors import RayExecutor

    calls: list[tuple] = []
    running = [False]
    monkeypatch.setattr(ray, "is_initialized", lambda: running[0])
    monkeypatch.setattr(ray, "init", lambda **kw: (calls.append(("init", kw)),
                                                    running.__setitem__(0, True)))
    monkeypatch.setattr(ray, "shutdown", lambda: (calls.append(("shutdown",)),
                                                  running.__setitem__(0, False)))
    with pytest.raises(RuntimeError, match=r"not initialized.*ray\.init\(\).*init=True"):
        RayExecutor()
    assert calls == []
    pool = RayExecutor(init={"num_cpus": 1})
    assert pool.started_ray and calls == [("init", {"num_cpus": 1})]
    pool.shutdown()
    assert calls[-1] == ("shutdown",)
    calls.clear()
    running[0] = True  # a Ray the program started: used, and left running
    pool = RayExecutor(init=True)
    assert not pool.started_ray
    pool.shutdown()
    assert calls == []
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(abs, -1)


def sleep_and_return(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def test_ray_executor_futures(ray_session: ModuleType) -> None:
    from optex.executors import RayExecutor

    with RayExecutor() as pool:
        assert [f.result(timeout=60) for f in [pool.submit(pow, 2, k) for k in range(4)]] \
            == [1, 2, 4, 8]
        with pytest.raises(ValueError, match="the cause's type"):  # RayTaskError(ValueError)
            pool.submit(raise_value_error, "the cause's type").result(timeout=60)
        # cancel() stops a running task and wakes wait() at once.
        running = pool.submit(sleep_and_return, 30.0)
        time.sleep(0.5)
        start = time.monotonic()
        assert running.cancel() and running.cancelled()
        done, _ = cf.wait([running], timeout=10)
        assert done == {running} and time.monotonic() - start < 5


# ---- the threads' trajectory ------------------------------------------------------


def test_every_engine_gives_the_threads_trajectory(engine: Engine, threads_run) -> None:
    pool = engine.make_default()
    try:
        res = optex.minimize(rosenbrock, X0, workers=pool, **TO_TARGET)
        assert pool.submit(abs, -2).result(timeout=60) == 2  # left running by minimize
    finally:
        pool.shutdown()
    assert same_run(res, threads_run)
    assert res.stop_reason == "target_loss" and res.n_dropped == res.n_observed == 0


def test_seeds_travel_to_every_engine(engine: Engine) -> None:
    threads = optex.minimize(noisy_sphere, X0, **SEEDED)
    with engine.make() as pool:
        other = optex.minimize(noisy_sphere, X0, workers=pool, **SEEDED)
    assert same_run(other, threads)


def test_a_lambda_travels_to_dask_and_ray(engine: Engine) -> None:
    # Both pickle with cloudpickle (mpi4py's standard pickle refuses it: the MPI test).
    with engine.make() as pool:
        res = optex.minimize(lambda x: rosenbrock(x), X0, workers=pool, **TO_TARGET)
    assert res.nit == 45


def test_points_kept_and_gradient_buffers_reused_give_the_threads_run(
        engine: Engine, threads_run) -> None:
    # Each evaluation's point is its own and read-only, and a gradient written into
    # one reused buffer is copied on the worker (test_memory_contract.py).
    with engine.make() as pool:
        thrifty = optex.minimize(Thrifty(), X0, workers=pool, **TO_TARGET)
        read_only = optex.minimize(point_is_read_only, X0, workers=pool, **TO_TARGET)
    assert same_run(thrifty, threads_run) and same_run(read_only, threads_run)


# ---- errors -----------------------------------------------------------------------


def test_a_keyboard_interrupt_of_the_objective_keeps_its_type(engine: Engine) -> None:
    run = optex.OptEx(X0, optex.Adam(lr=0.01), parallelism=4)
    with engine.make() as pool, pytest.raises(KeyboardInterrupt, match="inside the objective"):
        optex.minimize(raises_keyboard_interrupt, run, workers=pool, max_iters=3)
    assert run.pending and run.iteration == 0 and same_bits(run.x, X0)


def test_the_objective_exception_keeps_its_type(engine: Engine) -> None:
    with pytest.raises(RuntimeError, match="simulation diverged") as by_threads:
        optex.minimize(fails_far_from_start, X0, **TO_TARGET)
    with engine.make() as pool, \
            pytest.raises(RuntimeError, match="simulation diverged") as by_engine:
        optex.minimize(fails_far_from_start, X0, workers=pool, **TO_TARGET)
    assert type(by_engine.value) is type(by_threads.value) is RuntimeError
    if sys.version_info >= (3, 11):
        note = re.compile(r"fun_and_grad at point (\d+) of iteration (\d+)")
        where = [note.search(" ".join(e.value.__notes__)).groups()
                 for e in (by_threads, by_engine)]
        assert where[0] == where[1]


def test_an_objective_that_cannot_be_pickled_is_an_evaluation_error(engine: Engine) -> None:
    with engine.make() as pool, \
            pytest.raises(optex.EvaluationError, match="point 0 of iteration 0") as err:
        optex.minimize(Unpicklable(), X0, workers=pool, **TO_TARGET)
    assert "pickle" in str(err.value).lower() or "serialize" in str(err.value).lower()
    assert err.value.point == 0 and err.value.engine.pending
    assert err.value.__cause__ is not None


def test_a_shut_down_executor_is_an_evaluation_error_and_the_run_continues(
        engine: Engine, threads_run) -> None:
    pool = engine.make()
    pool.shutdown()
    with pytest.raises(optex.EvaluationError, match="point 0 of iteration 0") as err:
        optex.minimize(rosenbrock, X0, workers=pool, **TO_TARGET)
    assert isinstance(err.value.__cause__, RuntimeError)
    with engine.make() as fresh:
        retried = optex.minimize(rosenbrock, err.value.engine, workers=fresh, **STOP)
    assert same_run(retried, threads_run)


def test_an_executor_shut_down_between_rounds_is_an_evaluation_error_and_the_run_continues(
        engine: Engine, threads_run) -> None:
    pool = engine.make()
    rounds = []

    def shut_down_after_five(info: Any) -> None:
        rounds.append(info)
        if len(rounds) == 5:
            pool.shutdown(wait=False)

    with pytest.raises(optex.EvaluationError, match="point 0 of iteration 5") as err:
        optex.minimize(rosenbrock, X0, workers=pool, callback=shut_down_after_five, **TO_TARGET)
    engine_left = err.value.engine
    assert engine_left.iteration == err.value.iteration == 5 and engine_left.pending
    with engine.make() as fresh:
        rest = optex.minimize(rosenbrock, engine_left, workers=fresh, **STOP)
    assert same_bits(rest.x, threads_run.x) and rest.fun == threads_run.fun
    assert rest.nit == threads_run.nit
    assert rest.loss_history == threads_run.loss_history[5:]


def test_an_executor_shut_down_while_a_round_runs_is_an_evaluation_error(
        engine: Engine, threads_run, tmp_path: Path) -> None:
    objective = SleepsOnce(str(tmp_path / "slept"), seconds=2.5)
    pool = engine.make()
    abort = threading.Timer(0.5, engine.abort, args=(pool,))
    start = time.monotonic()
    abort.start()
    try:
        with pytest.raises(optex.EvaluationError, match="iteration 0 was cancelled") as err:
            optex.minimize(objective, X0, workers=pool, **TO_TARGET)
    finally:
        abort.join()
    assert time.monotonic() - start < 2.2  # did not wait for the sleeping evaluation
    assert err.value.engine.pending and err.value.engine.iteration == 0
    with engine.make() as fresh:
        retried = optex.minimize(objective, err.value.engine, workers=fresh, **STOP)
    assert same_run(retried, threads_run)


def test_a_worker_that_dies_on_dask_is_replaced_and_the_task_retried(
        dask_client: Any, threads_run, tmp_path: Path) -> None:
    # Dask reschedules the tasks of a dead worker (distributed.scheduler.allowed-failures,
    # 3 by default) and its nanny starts a new worker: minimize sees nothing.
    objective = DiesOnce(str(tmp_path / "died"))
    with dask_client.get_executor() as pool:
        res = optex.minimize(objective, X0, workers=pool, **TO_TARGET)
    assert (tmp_path / "died").exists()
    assert same_run(res, threads_run)


def test_a_worker_that_dies_on_ray_is_retried_by_ray(
        ray_session: ModuleType, threads_run, tmp_path: Path) -> None:
    # Ray retries a task whose worker died (max_retries, 3 by default).
    from optex.executors import RayExecutor

    objective = DiesOnce(str(tmp_path / "died"))
    with RayExecutor() as pool:
        res = optex.minimize(objective, X0, workers=pool, **TO_TARGET)
    assert (tmp_path / "died").exists()
    assert same_run(res, threads_run)


def test_a_worker_that_dies_on_ray_without_retries_is_an_evaluation_error(
        ray_session: ModuleType, threads_run, tmp_path: Path) -> None:
    from ray.exceptions import WorkerCrashedError

    from optex.executors import RayExecutor

    objective = DiesOnce(str(tmp_path / "died"))
    with RayExecutor(remote_options={"max_retries": 0}) as pool:
        with pytest.raises(optex.EvaluationError,
                           match="iteration 0 ended without a result") as err:
            optex.minimize(objective, X0, workers=pool, **TO_TARGET)
        assert isinstance(err.value.__cause__, WorkerCrashedError)
        assert err.value.engine.pending and err.value.engine.evaluations == 0
        # The documented retry: the same executor, the error's engine.
        retried = optex.minimize(objective, err.value.engine, workers=pool, **STOP)
    assert same_run(retried, threads_run)


# ---- partial rounds ---------------------------------------------------------------


@pytest.mark.parametrize("case", ["dask", "ray"])
def test_the_stragglers_of_a_committed_round_reach_observe(
        case: str, request: pytest.FixtureRequest) -> None:
    # minimize does not cancel the evaluations of a committed round while the
    # run goes on (Dask and Ray would stop running ones too): the stragglers
    # run to their end and their gradients reach observe().
    if case == "dask":
        pool = request.getfixturevalue("dask_client").get_executor(pure=False)
    else:
        request.getfixturevalue("ray_session")
        from optex.executors import RayExecutor

        # Quarter CPUs: a round's 4 evaluations and the last rounds' stragglers
        # run at once (they sleep).
        pool = RayExecutor(remote_options={"num_cpus": 0.25})
    with pool:
        res = optex.minimize(straggler, X0, optimizer=optex.Adam(lr=0.1), parallelism=4,
                             max_iters=30, pass_seed=True, min_results=3, workers=pool)
    assert res.nit == 30 and res.n_dropped >= 1
    assert 1 <= res.n_observed <= res.n_dropped


# ---- skips and requirements -------------------------------------------------------


@pytest.mark.parametrize("required", [False, True])
def test_a_missing_engine_skips_unless_required(required: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "REQUIRED", required)
    expected = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(expected, match="no_such_engine is not installed"):
        engine_module("no_such_engine", "pip install no_such_engine")


# ---- MPI --------------------------------------------------------------------------


def mpirun_command(ranks: int) -> list[str]:
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        reason = "no mpirun (apt-get install openmpi-bin, as scripts/install-deps.sh does)"
        if REQUIRED:
            pytest.fail(reason + "; OPTEX_REQUIRE_CLUSTER=1 requires it", pytrace=False)
        pytest.skip(reason)
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             check=False).stdout
    # Open MPI refuses more ranks than cores unless told (MPICH has no such flag).
    extra = ["--oversubscribe"] if re.search("Open MPI|OpenRTE", version) else []
    return [mpirun, "-n", str(ranks), *extra]


def test_mpi4py_futures_under_mpirun(tmp_path: Path) -> None:
    engine_module("mpi4py.futures", "pip install mpi4py, with an MPI installed")
    out = tmp_path / "mpi.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(HERE), env.get("PYTHONPATH")] if p)
    # What mpirun needs here (tests/CMakeLists.txt sets the same): running as
    # root allowed (containers, CI), shared memory without a kernel module.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    command = mpirun_command(3) + [sys.executable, "-m", "mpi4py.futures",
                                   str(HERE / "mpi_minimize_job.py"), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env,
                          cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    seen = json.loads(out.read_text(encoding="utf-8"))
    assert seen["world_size"] == 3 and seen["num_workers"] == 2
    assert seen["mpi"] == seen["threads"]
    assert seen["mpi_thrifty"] == seen["mpi_read_only"] == seen["threads"]
    assert seen["threads"]["nit"] == 45 and seen["threads"]["stop_reason"] == "target_loss"
    assert seen["mpi_seeded"] == seen["threads_seeded"]
    assert seen["after_errors"] == seen["threads"]
    raised = seen["raises_mpi"]
    assert raised["type"] == seen["raises_threads"]["type"] == "RuntimeError"
    assert raised["message"] == "simulation diverged" and not raised["is_evaluation_error"]
    assert raised["notes"][0] == seen["raises_threads"]["notes"][0]
    for case in ("unpicklable", "lambda"):
        error = seen[case]
        assert error["is_evaluation_error"] and error["point"] == 0, error
        assert re.search("pickle", error["message"], re.IGNORECASE), error
    shut = seen["shut_down"]
    assert shut["is_evaluation_error"] and shut["point"] == 0 and shut["cause"] == "RuntimeError"
    assert shut["engine_pending"]
    assert seen["retried"] == seen["threads"]
