"""The memory optex hands to user code, and the memory user code hands back.

- What the objective receives is its own read-only copy of the point: it may keep
  it, and nothing rewrites it (the engine's batch rows are rewritten every round).
- What the objective returns is copied the moment it returns, on the worker: an
  objective that writes every gradient into one reused buffer gives the same run,
  bit for bit, as one that returns fresh arrays, on every executor.
- The same for every other callable: callbacks (IterationInfo owns its values),
  the gradient oracle of proxy='target', optex.plan's objective, OptEx.ask()'s
  view (documented: valid until the next ask() after tell()).
- Executors that break the Future contract, and BaseExceptions of the objective.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import math
import re
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from objectives import (
    Thrifty,
    half_square,
    point_is_read_only,
    raises_generator_exit,
    raises_keyboard_interrupt,
    raises_system_exit,
    rosenbrock,
    rosenbrock_with_seed,
)

import optex
from optex import _evaluation, problems
from optex.executors import VirtualClockExecutor

X0 = problems.Rosenbrock().standard_start(6)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_run(a: optex.OptimizeResult, b: optex.OptimizeResult) -> bool:
    return (same_bits(a.x, b.x) and a.fun == b.fun and a.loss_history == b.loss_history
            and a.nit == b.nit and a.n_observed == b.n_observed)


@pytest.fixture(scope="module")
def process_pool():
    with cf.ProcessPoolExecutor(2) as pool:
        yield pool


@pytest.fixture
def without_gradient_copy(monkeypatch):
    """minimize as it was before it copied the returned gradient."""
    monkeypatch.setattr(_evaluation, "owned_gradient", lambda grad: grad)


# ---- what the objective receives ---------------------------------------------------


def test_every_point_the_objective_keeps_stays_as_it_was_given() -> None:
    objective = Thrifty()
    res = optex.minimize(objective, X0, optimizer=optex.Adam(lr=0.05), parallelism=3,
                         max_iters=4, seed=0)
    assert len(objective.kept) == 3 * 4 + 1  # 12 evaluations and the final loss
    assert objective.changed() == 0
    # The points are the run's own: the iterates it stepped through, not 13 aliases.
    assert len({at_call.tobytes() for _, at_call in objective.kept}) > 4
    # The final evaluation's point is a copy of res.x, not res.x itself.
    final_x = objective.kept[-1][0]
    assert same_bits(final_x, res.x) and not np.shares_memory(final_x, res.x)
    assert res.x.flags.writeable


def test_kept_points_stay_valid_on_the_virtual_clock_with_stragglers() -> None:
    # Partial rounds: evaluations left running start after the next ask() rewrote the rows.
    objective = Thrifty()
    pool = VirtualClockExecutor(4, sigma=1.0, seed=1)
    res = optex.minimize(objective, X0, optimizer=optex.Adam(lr=0.05), parallelism=4,
                         max_iters=6, seed=0, workers=pool, min_results=2)
    assert res.n_dropped > 0 and res.n_observed > 0
    assert objective.changed() == 0


@pytest.mark.parametrize("workers", ["threads", "processes", "virtual-clock"])
def test_the_point_is_read_only_on_every_executor(workers: str, process_pool) -> None:
    pool = {"threads": "threads", "processes": process_pool,
            "virtual-clock": VirtualClockExecutor(2)}[workers]
    res = optex.minimize(point_is_read_only, X0, optimizer=optex.Adam(lr=0.05), parallelism=2,
                         max_iters=3, workers=pool)
    assert res.nit == 3


def test_a_continued_engine_does_not_change_an_earlier_result() -> None:
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=2)
    first = optex.minimize(rosenbrock, engine, max_iters=3)
    x_then = first.x.copy()
    optex.minimize(rosenbrock, engine, max_iters=6)
    assert same_bits(first.x, x_then) and not same_bits(engine.x, x_then)


# ---- what the objective returns ----------------------------------------------------

ISSUE_RUN = dict(optimizer=optex.Adam(lr=0.1), parallelism=4, max_iters=8, seed=0)
SQUARE_X0 = np.linspace(-1.0, 1.0, 5).astype(np.float32)


def test_a_reused_gradient_buffer_gives_the_fresh_arrays_run() -> None:
    # 0.5 ||x||^2 from linspace(-1, 1, 5): fresh arrays end at loss 0.0550.
    fresh = optex.minimize(half_square, SQUARE_X0, max_workers=1, **ISSUE_RUN)
    reused = optex.minimize(Thrifty(half_square), SQUARE_X0, max_workers=1, **ISSUE_RUN)
    assert round(fresh.fun, 4) == 0.0550
    assert fresh.fun == pytest.approx(0.5 * float(np.sum(fresh.x.astype(np.float64) ** 2)))
    assert same_run(reused, fresh)
    # Processes pickle each result as the objective returns: the same run.
    processes = optex.minimize(Thrifty(half_square), SQUARE_X0, workers="processes",
                               max_workers=1, **ISSUE_RUN)
    assert same_run(processes, fresh)


def test_without_the_copy_a_reused_buffer_gives_another_run(without_gradient_copy) -> None:
    # What the test above holds against: every row of a round read the last call's
    # gradient, and the run ended at 0.0583.
    reused = optex.minimize(Thrifty(half_square), SQUARE_X0, max_workers=1, **ISSUE_RUN)
    assert round(reused.fun, 4) == 0.0583


def test_the_reused_gradient_buffer_on_more_problems() -> None:
    for fresh, x0 in ((rosenbrock, X0), (half_square, SQUARE_X0)):
        for n in (2, 3):
            run = dict(ISSUE_RUN, parallelism=n)
            assert same_run(optex.minimize(Thrifty(fresh), x0, max_workers=1, **run),
                            optex.minimize(fresh, x0, max_workers=1, **run))


@pytest.mark.parametrize("partial", [dict(), dict(min_results=2)], ids=["all", "min_results"])
def test_a_reused_buffer_on_the_virtual_clock_gives_the_fresh_run(partial: dict) -> None:
    # The clock runs a task's function at its start and sets the result at its finish:
    # every result of a round would alias the buffer. Late results reach observe() too.
    def run(objective):
        pool = VirtualClockExecutor(4, sigma=1.0, seed=2)
        return optex.minimize(objective, X0, workers=pool, **ISSUE_RUN, **partial)

    fresh, reused = run(rosenbrock), run(Thrifty())
    assert same_run(reused, fresh)
    if partial:
        assert reused.n_observed > 0


@pytest.mark.parametrize(
    "returned, dtype",
    [
        (np.arange(4.0), np.float64),
        (np.arange(4, dtype=np.float32), np.float32),
        (np.arange(4.0)[::-1], np.float64),   # a strided view
        (memoryview(np.arange(4.0)), np.float64),
    ],
    ids=["float64", "float32", "view", "memoryview"],
)
def test_owned_gradient_copies_arrays_and_keeps_their_dtype(returned, dtype) -> None:
    copied = _evaluation.owned_gradient(returned)
    assert isinstance(copied, np.ndarray) and copied.dtype == dtype and copied.shape == (4,)
    assert not np.shares_memory(copied, np.asarray(returned))
    assert np.array_equal(copied, np.asarray(returned))


def test_owned_gradient_copies_a_list_and_leaves_what_is_not_an_array() -> None:
    row = np.array([3.0])
    buffer = [1.0, 2.0, row]
    copied = _evaluation.owned_gradient(buffer)
    buffer[0] = math.nan
    row[0] = math.nan
    assert copied[:2] == [1.0, 2.0] and type(copied) is list and copied[2][0] == 3.0
    assert _evaluation.owned_gradient((1.0, row))[1] is not row
    for value in ("abc", b"ab", None, 5, 2.5, np.float32(1.0)):
        assert _evaluation.owned_gradient(value) is value  # refused or read by name later

    class NotAnArray:
        def __array__(self, *args, **kwargs):
            raise RuntimeError("no")

    thing = NotAnArray()
    assert _evaluation.owned_gradient(thing) is thing  # checked_gradient names it


def test_a_reused_torch_tensor_buffer_is_copied_too() -> None:
    torch = pytest.importorskip("torch")
    buffer = torch.zeros(len(X0), dtype=torch.float64)

    def in_tensor(x):
        loss, grad = problems.Rosenbrock().value_and_grad(x)
        buffer.copy_(torch.from_numpy(np.asarray(grad, dtype=np.float64)))
        return loss, buffer

    def fresh(x):
        loss, grad = problems.Rosenbrock().value_and_grad(x)
        return loss, np.asarray(grad, dtype=np.float64)

    assert same_run(optex.minimize(in_tensor, X0, max_workers=1, **ISSUE_RUN),
                    optex.minimize(fresh, X0, max_workers=1, **ISSUE_RUN))


# ---- the property: keeping inputs and reusing outputs changes nothing ---------------


@settings(max_examples=12, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    workers=st.sampled_from(["threads", "processes", "virtual-clock"]),
    dim=st.integers(2, 5),
    parallelism=st.integers(1, 4),
    max_iters=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
    pass_seed=st.booleans(),
    partial=st.booleans(),
    proxy_target=st.booleans(),
)
def test_keeping_inputs_and_reusing_outputs_gives_the_fresh_run_bit_for_bit(
        process_pool, workers, dim, parallelism, max_iters, seed, pass_seed, partial,
        proxy_target) -> None:
    x0 = problems.Rosenbrock().standard_start(dim)

    def run(objective):
        pool = {"threads": "threads", "processes": process_pool,
                "virtual-clock": VirtualClockExecutor(parallelism, sigma=1.0, seed=seed % 7)
                }[workers]
        extra = {}
        if partial and workers == "virtual-clock":
            extra["min_results"] = max(1, parallelism - 1)
        if proxy_target:
            extra["proxy"] = "target"
        return optex.minimize(objective, x0, optimizer=optex.Adam(lr=0.05),
                              parallelism=parallelism, max_iters=max_iters, seed=seed,
                              pass_seed=pass_seed, workers=pool, max_workers=1, **extra)

    fresh = run(rosenbrock_with_seed)
    thrifty = Thrifty()
    kept = run(thrifty)
    assert same_run(kept, fresh)
    assert thrifty.changed() == 0  # on processes, the final evaluation's point only


# ---- the other callables ----------------------------------------------------------


def test_a_callback_may_keep_what_it_is_given() -> None:
    kept: list[tuple[optex.IterationInfo, str, list, list]] = []

    def callback(info):
        kept.append((info, repr(info), info.point_evaluations, info.posterior_variance))

    optex.minimize(rosenbrock, X0, optimizer=optex.Adam(lr=0.05), parallelism=3, max_iters=6,
                   callback=callback)
    assert len(kept) == 6
    for info, at_call, evaluations, variance in kept:
        assert repr(info) == at_call
        assert info.point_evaluations == evaluations
        assert repr(info.posterior_variance) == repr(variance)
    assert [info.iteration for info, *_ in kept] == [1, 2, 3, 4, 5, 6]


def test_the_gradient_oracle_may_keep_x_and_reuse_its_buffer() -> None:
    def steps(oracle) -> list[bytes]:
        engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=3, proxy="target", seed=0)
        engine.set_gradient_oracle(oracle)
        seen = []
        for _ in range(4):
            points = engine.ask()
            seen.append(points.tobytes())
            grads = [np.asarray(problems.Rosenbrock().value_and_grad(p)[1]) for p in points]
            losses = [problems.Rosenbrock().value_and_grad(p)[0] for p in points]
            engine.tell(np.stack(grads).astype(np.float32), np.asarray(losses, np.float64))
        return seen

    thrifty = Thrifty()
    assert steps(thrifty) == steps(rosenbrock)
    assert len(thrifty.kept) > 0 and thrifty.changed() == 0


def test_minimize_with_proxy_target_may_keep_x_and_reuse_its_buffer() -> None:
    run = dict(optimizer=optex.Adam(lr=0.05), parallelism=3, max_iters=4, seed=0, proxy="target")
    thrifty = Thrifty()
    assert same_run(optex.minimize(thrifty, X0, **run), optex.minimize(rosenbrock, X0, **run))
    assert thrifty.changed() == 0


def test_ask_returns_a_read_only_view_valid_until_the_next_ask_after_tell() -> None:
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=3, seed=0)
    points = engine.ask()
    kept = points.copy()
    assert not points.flags.writeable
    with pytest.raises(ValueError):
        points[0, 0] = 1.0
    assert engine.ask() is not points and same_bits(engine.ask(), kept)  # same round, same rows
    grads = np.stack([problems.Rosenbrock().value_and_grad(p)[1] for p in points])
    engine.tell(grads.astype(np.float32), np.ones(3))
    after = engine.ask()
    assert np.shares_memory(after, points)  # rewritten in place, as documented
    assert not same_bits(points, kept) and same_bits(points, after)
    # The view keeps its engine alive.
    del engine, after
    gc.collect()
    assert np.isfinite(points).all()


def test_what_the_engine_hands_out_besides_ask_is_a_copy_the_caller_may_keep() -> None:
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=3, seed=0)
    kept = []
    for _ in range(3):
        points = engine.ask()
        arrays = (engine.x, engine.seeds, engine.predicted_gradient(0))
        kept.append((arrays, [a.copy() for a in arrays]))
        grads = np.stack([problems.Rosenbrock().value_and_grad(p)[1] for p in points])
        engine.tell(grads.astype(np.float32), np.ones(3))
    for arrays, at_the_time in kept:
        assert all(same_bits(a, b) for a, b in zip(arrays, at_the_time))
    assert not same_bits(kept[0][0][0], engine.x)


def test_buffers_given_to_tell_and_observe_may_be_reused_at_once() -> None:
    # A caller that reuses one gradient buffer for every round (and spoils it right
    # after each call) drives the engine as one that passes fresh arrays.
    def run(reuse: bool) -> bytes:
        engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=3, seed=0)
        grads, losses = np.empty((3, len(X0)), np.float32), np.empty(3)
        for r in range(4):
            points = engine.ask()
            for i, p in enumerate(points):
                losses[i], grads[i] = problems.Rosenbrock().value_and_grad(p)
            engine.tell(grads if reuse else grads.copy(), losses if reuse else losses.copy())
            extra_x = np.array(engine.x)[None, :]
            extra_g = np.asarray(problems.Rosenbrock().value_and_grad(extra_x[0])[1],
                                 np.float32)[None, :]
            engine.observe(extra_x if reuse else extra_x.copy(),
                           extra_g if reuse else extra_g.copy())
            if reuse:
                grads[...], losses[...], extra_x[...], extra_g[...] = math.nan, math.nan, 0, 0
        return engine.x.tobytes() + engine.ask().tobytes()

    assert run(reuse=True) == run(reuse=False)


def test_plan_gives_its_objective_a_read_only_point_it_may_keep() -> None:
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    buffer = np.zeros(8)

    def objective(x):
        kept.append((x, x.copy()))
        if x.flags.writeable:
            raise AssertionError("plan's point is writable")
        # One buffer for every gradient: the timed calls spoil the first (checked) one.
        buffer[...] = 0.5 if len(kept) == 1 else math.nan
        return 1.0, buffer

    plan = optex.plan(8, 2, 4, objective=objective, repetitions=3,
                      round_timer=lambda d, n, t: 1e-3, step_timer=lambda d: 1e-4)
    assert plan.choice in ("sequential", "averaging", "optex")
    assert len(kept) == 4  # one untimed call, then the repetitions
    assert all(same_bits(x, at_call) for x, at_call in kept)
    assert all(same_bits(x, kept[0][1]) for x, _ in kept)  # the same point every call


# ---- executors that break the Future contract --------------------------------------


class ReturnsFromSubmit(cf.Executor):
    """An executor whose submit returns `value` (after running nothing)."""

    def __init__(self, value) -> None:
        self.value = value

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        return self.value


class ResultIs(cf.Executor):
    """Runs fn on the calling thread, and hands back `make(result)` as the future's result."""

    def __init__(self, make, at=None) -> None:
        self.make, self.at, self.calls = make, at, 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: cf.Future = cf.Future()
        result = fn(*args, **kwargs)
        self.calls += 1
        future.set_result(self.make(result) if self.at in (None, self.calls - 1) else result)
        return future


def check_refused(err: pytest.ExceptionInfo, engine: optex.OptEx, executor: str, what: str
                  ) -> None:
    assert isinstance(err.value, optex.ExecutorContractError)
    assert isinstance(err.value, TypeError) and isinstance(err.value, optex.EvaluationError)
    assert f"executor {executor}" in str(err.value)
    assert what in str(err.value)
    assert err.value.engine is engine and engine.pending and engine.iteration == 0
    assert engine.evaluations == 0 and same_bits(engine.x, X0)


@pytest.mark.parametrize(
    "value, what",
    [(None, "returned NoneType None"), ("done", "returned str 'done'"),
     ([1, 2], "returned list [1, 2]"), ((1.0, np.zeros(6)), "returned tuple")],
    ids=["None", "str", "unhashable-list", "a-result-itself"],
)
def test_submit_that_returns_no_future_is_a_type_error(value, what: str) -> None:
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=2)
    with pytest.raises(TypeError, match="not a concurrent.futures.Future") as err:
        optex.minimize(rosenbrock, engine, workers=ReturnsFromSubmit(value), max_iters=2)
    check_refused(err, engine, "ReturnsFromSubmit", what)
    assert optex.minimize(rosenbrock, engine, max_iters=2).nit == 2  # the round was retried


@pytest.mark.parametrize(
    "make, what",
    [(lambda out: None, "result is NoneType None"),
     (lambda out: out[0], "result is float"),
     (lambda out: (*out, 0), "result is tuple"),
     (lambda out: "x", "result is str 'x'")],
    ids=["None", "the-loss", "a-triple", "str"],
)
@pytest.mark.parametrize("partial", [dict(), dict(min_results=1)], ids=["all", "min_results"])
def test_a_future_without_an_evaluation_is_a_type_error(make, what: str, partial: dict) -> None:
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=2)
    with pytest.raises(TypeError, match="point 1 of iteration 0") as err:
        optex.minimize(rosenbrock, engine, workers=ResultIs(make, at=1), max_iters=2, **partial)
    check_refused(err, engine, "ResultIs", what)
    assert err.value.point == 1


def test_a_late_result_without_an_evaluation_is_a_type_error() -> None:
    class LateNone(VirtualClockExecutor):
        """Task 1, the straggler of round 0, ends with None instead of its evaluation."""

        def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
            if len(self.log) == 1:
                return super().submit(lambda: None)
            return super().submit(fn, *args, **kwargs)

    pool = LateNone(2, duration=lambda task, worker: 2.5 if task == 1 else 1.0)
    with pytest.raises(TypeError, match="late evaluation holds NoneType None") as err:
        optex.minimize(rosenbrock, X0, optimizer=optex.Adam(lr=0.05), parallelism=2,
                       max_iters=4, workers=pool, min_results=1)
    assert isinstance(err.value, optex.ExecutorContractError)
    assert "has committed iteration" in str(err.value)
    assert err.value.engine.iteration >= 1


# ---- BaseExceptions of the objective -----------------------------------------------


class _RebuildingExecutor(cf.Executor):
    """Sends each result through a pickling route that rebuilds exceptions without
    __init__ (as the reducer Dask's distributed installs does): SystemExit(3) arrives
    with code None unless optex restores it."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        out = fn(*args, **kwargs)
        if isinstance(out, _evaluation.Raised):
            rebuilt = type(out.exception).__new__(type(out.exception))
            rebuilt.args = out.exception.args
            out = _evaluation.Raised(rebuilt, out.traceback)
        future: cf.Future = cf.Future()
        future.set_result(out)
        return future


def test_a_system_exit_rebuilt_without_init_keeps_its_exit_code() -> None:
    rebuilt = SystemExit.__new__(SystemExit)
    rebuilt.args = (3,)
    assert rebuilt.code is None  # the loss the repair is for
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=2)
    with pytest.raises(SystemExit) as err:
        optex.minimize(raises_system_exit, engine, workers=_RebuildingExecutor(), max_iters=2)
    assert err.value.code == 3 and err.value.args == (3,)
    assert engine.pending and engine.iteration == 0


@pytest.mark.parametrize(
    "objective, raised",
    [(raises_keyboard_interrupt, KeyboardInterrupt), (raises_system_exit, SystemExit),
     (raises_generator_exit, GeneratorExit)],
    ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit"],
)
@pytest.mark.parametrize("workers", ["threads", "processes", "virtual-clock"])
def test_a_base_exception_of_the_objective_propagates_as_it_is(
        objective, raised, workers: str, process_pool) -> None:
    pool = {"threads": "threads", "processes": process_pool,
            "virtual-clock": VirtualClockExecutor(2)}[workers]
    engine = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=2)
    with pytest.raises(raised) as err:
        optex.minimize(objective, engine, workers=pool, max_iters=2)
    assert type(err.value) is raised
    assert not isinstance(err.value, optex.EvaluationError)
    if raised is SystemExit:
        assert err.value.code == 3
    else:
        assert "inside the objective" in str(err.value)
    if sys.version_info >= (3, 11):
        assert any(re.search(r"fun_and_grad at point 0 of iteration 0", note)
                   for note in err.value.__notes__)
    assert engine.pending and engine.iteration == 0 and same_bits(engine.x, X0)
    # The process pool survived (a worker that met SystemExit would have exited).
    if workers == "processes":
        assert process_pool.submit(abs, -2).result() == 2


def test_a_keyboard_interrupt_in_the_final_evaluation_propagates_as_it_is() -> None:
    calls = []

    def objective(x):
        calls.append(1)
        if len(calls) > 4:  # two rounds of two, then the final loss
            raise KeyboardInterrupt("final")
        return problems.Rosenbrock().value_and_grad(x)

    with pytest.raises(KeyboardInterrupt, match="final"):
        optex.minimize(objective, X0, optimizer=optex.Adam(lr=0.05), parallelism=2,
                       max_iters=2)
