"""tell() under hostile gradients: a refused call changes nothing, bit for bit, and no
accepted input, however large, can make the engine unusable (DESIGN.md section 6)."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optex
from optex import problems

N, D = 3, 4
BOUND = optex.magnitude_bound(D)
PROBLEM = problems.Rosenbrock()


def warmed(optimizer: optex.Optimizer, then: optex.Optimizer | None = None) -> optex.OptEx:
    """An engine two iterations in (then switched to `then`), with a pending batch."""
    opt = optex.OptEx(PROBLEM.standard_start(D), optimizer=optimizer, parallelism=N, seed=7)
    for _ in range(2):
        points = opt.ask()
        losses, grads = PROBLEM.value_and_grad(points)
        opt.tell(grads, losses)
    if then is not None:
        opt.set_optimizer(then)
    opt.ask()
    return opt


def checkpoint_bytes(opt: optex.OptEx) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.ckpt")
        opt.save(path)
        with open(path, "rb") as f:
            return f.read()


def commit_the_same(*engines: optex.OptEx) -> None:
    """Each engine commits its pending batch with the true gradients."""
    for opt in engines:
        losses, grads = PROBLEM.value_and_grad(opt.ask())
        opt.tell(grads, losses)


def rows(opt: optex.OptEx) -> np.ndarray:
    return np.array(np.from_dlpack(opt.device_grads()), copy=True)


@pytest.mark.parametrize("d", [1, D, 40, 10**6, 10**9, 2**40])
def test_the_bound_is_sqrt_of_flt_max_over_8d_rounded_down_to_float32(d) -> None:
    exact = math.sqrt(float(np.finfo(np.float32).max) / (8 * d))
    bound = optex.magnitude_bound(d)
    assert float(np.float32(bound)) == bound <= exact
    assert float(np.nextafter(np.float32(bound), np.float32(np.inf))) > exact
    # Any two entries within it: d squared differences stay finite in float32.
    assert d * (2 * bound) ** 2 < float(np.finfo(np.float32).max)


def test_the_bound_refuses_a_dimension_below_one() -> None:
    with pytest.raises(ValueError, match="^d: must be >= 1, got 0$"):
        optex.magnitude_bound(0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_refused_tell_writes_nothing_that_a_later_tell_could_commit(dtype) -> None:
    # float64 gradients used to be rounded into the batch's rows before they were
    # checked, and tell_device(drop_nonfinite=True) then committed the refused values.
    opt, twin = warmed(optex.Adam(lr=0.02)), warmed(optex.Adam(lr=0.02))
    before = rows(opt)
    losses, grads = PROBLEM.value_and_grad(opt.ask())
    bad = grads.astype(dtype)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^grads: row 1, column 2 is nan"):
        opt.tell(bad, losses)
    assert np.array_equal(rows(opt), before, equal_nan=True)
    opt.tell_device(losses, drop_nonfinite=True)
    twin.tell_device(losses, drop_nonfinite=True)
    assert checkpoint_bytes(opt) == checkpoint_bytes(twin)


@pytest.mark.parametrize("evaluations", [1, 2])
@pytest.mark.parametrize(
    ("bad", "points"),
    [
        ({(1, 2): np.nan}, "1"),
        ({(2, 0): np.inf}, "2"),
        ({(0, 3): -2.0 * BOUND}, "0"),  # beyond the bound
        ({(0, 1): np.nan, (5, 3): np.inf}, "0, 5"),  # the first and the last row
        ({(r, r % D): np.nan for r in range(6)}, "0, 1, 2, 3, 4, 5"),  # every row
    ],
)
@pytest.mark.parametrize("through", ["tell", "tell_device"])
def test_a_refused_tell_changes_nothing_and_the_retry_commits_as_a_twin(
        bad, points, evaluations, through) -> None:
    """The engine's commit refuses the rows (one check), before anything changes: the
    retry with good rows commits exactly as a twin that never saw the bad call. With
    several evaluations per point the rows named are the evaluation rows."""
    opt = warmed_points(evaluations, "last")
    twin = warmed_points(evaluations, "last")
    losses, grads = PROBLEM.value_and_grad(opt.ask())
    grads = grads.astype(np.float32)
    bad_grads = grads.copy()
    for index, value in bad.items():
        bad_grads[index] = value
    x, step, pending_rows = opt.x.tobytes(), opt.optimizer_step, rows(opt)
    if through == "tell":
        first = min(bad)  # the flat path names the first bad element, row-major
        message = rf"^grads: row {first[0]}, column {first[1]} is "
        with pytest.raises(ValueError, match=message + ".*pass drop_nonfinite=True"):
            opt.tell(bad_grads, losses)
        assert rows(opt).tobytes() == pending_rows.tobytes()  # the batch's rows as they were
    else:
        np.from_dlpack(opt.device_grads())[...] = bad_grads
        with pytest.raises(ValueError, match=rf"^grads: the gradient rows of points {points} "
                                             r"\(written through device_grads\(\)\) are not "
                                             r"finite or exceed the magnitude bound .*; pass "
                                             r"drop_nonfinite=True to let the engine drop such "
                                             r"points$"):
            opt.tell_device(losses)
        assert rows(opt).tobytes() == bad_grads.tobytes()  # the caller's rows, untouched
        np.from_dlpack(opt.device_grads())[...] = grads
    assert opt.pending and opt.iteration == twin.iteration == 2
    assert opt.x.tobytes() == x and opt.optimizer_step == step
    # The retry with good rows, through the same path: as the twin's one call.
    if through == "tell":
        info = opt.tell(grads, losses)
    else:
        info = opt.tell_device(losses)
    assert info.dropped == 0
    twin_losses, twin_grads = PROBLEM.value_and_grad(twin.ask())
    twin.tell(twin_grads, twin_losses)
    assert checkpoint_bytes(opt) == checkpoint_bytes(twin)
    commit_the_same(opt, twin)
    assert checkpoint_bytes(opt) == checkpoint_bytes(twin)


@pytest.mark.parametrize(
    ("value", "dtype", "message"),
    [
        (3e38, np.float32, r"^grads: row 1, column 0 is 3e\+38, above the magnitude bound "
                           r"3\.260954e\+18 for dimension 4"),
        (2.4e38, np.float64, r"^grads: row 1, column 0 is 2\.4e\+38, above the magnitude bound"),
        (1e39, np.float64, r"^grads: row 1, column 0 is 1e\+39, outside the float32 range"),
    ],
)
def test_a_gradient_above_the_bound_is_refused_or_dropped_like_nan(value, dtype, message) -> None:
    for optimizer in (optex.Sgd(lr=1e-4), optex.Adam(lr=0.02), optex.Lion(lr=1e-3)):
        opt, twin = warmed(optimizer), warmed(optimizer)
        losses, grads = PROBLEM.value_and_grad(opt.ask())
        huge = grads.astype(dtype)
        huge[1, 0] = value
        with pytest.raises(ValueError, match=message):
            opt.tell(huge, losses)
        info = opt.tell(huge, losses, drop_nonfinite=True)
        assert info.dropped == 1
        nan = grads.copy()
        nan[1, 0] = np.nan
        twin.tell(nan, losses, drop_nonfinite=True)
        assert checkpoint_bytes(opt) == checkpoint_bytes(twin)
        for _ in range(5):  # and the engine keeps going with finite points
            assert np.isfinite(opt.ask()).all()
            commit_the_same(opt)


def test_every_step_leaving_the_bound_is_refused_and_changes_nothing() -> None:
    slow, fast = optex.Sgd(lr=1e-4), optex.Sgd(lr=1e10)
    opt, twin = warmed(slow, then=fast), warmed(slow, then=fast)
    losses, _ = PROBLEM.value_and_grad(opt.ask())
    before = rows(opt)
    with pytest.raises(RuntimeError, match="no pair of iteration 2 can be committed"):
        opt.tell(np.full((N, D), 1e9, dtype=np.float32), losses)
    assert np.array_equal(rows(opt), before)
    small = np.full((N, D), 1e-6, dtype=np.float32)
    opt.tell(small, losses)
    twin.tell(small, losses)
    assert checkpoint_bytes(opt) == checkpoint_bytes(twin)


VALUES = st.one_of(
    st.floats(width=64),  # NaN, infinities, subnormals, anything
    st.sampled_from([0.0, -0.0, 1e-3, -2.5, 1e19, -3e38, 2.4e38, 1e39, BOUND, -BOUND,
                     float(np.nextafter(np.float32(BOUND), np.float32(np.inf)))]),
)
OPTIMIZERS = [optex.Sgd(lr=1e-4), optex.Sgd(lr=1e-4, momentum=0.9), optex.Adam(lr=0.02),
              optex.AdamW(lr=0.5), optex.RmsProp(lr=0.01, centered=True), optex.Lion(lr=1e-3)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    grads=st.lists(VALUES, min_size=N * D, max_size=N * D),
    losses=st.lists(st.one_of(st.floats(width=64), st.just(1.0)), min_size=N, max_size=N),
    dtype=st.sampled_from([np.float32, np.float64]),
    drop=st.booleans(),
    which=st.integers(min_value=0, max_value=len(OPTIMIZERS) - 1),
)
def test_tell_either_refuses_without_a_trace_or_leaves_a_usable_engine(
    grads, losses, dtype, drop, which
) -> None:
    optimizer = OPTIMIZERS[which]
    opt, twin = warmed(optimizer), warmed(optimizer)
    g = np.array(grads, dtype=np.float64).reshape(N, D)
    with np.errstate(over="ignore"):
        g = g.astype(dtype)
    before = rows(opt)
    try:
        opt.tell(g, np.array(losses), drop_nonfinite=drop)
    except (ValueError, RuntimeError):
        assert opt.pending
        assert np.array_equal(rows(opt), before, equal_nan=True)
        commit_the_same(opt, twin)
        assert checkpoint_bytes(opt) == checkpoint_bytes(twin)
        return
    assert np.isfinite(opt.x).all() and (np.abs(opt.x) <= BOUND).all()
    for _ in range(3):  # wherever the accepted values led, the engine keeps working
        points = opt.ask()
        assert np.isfinite(points).all() and (np.abs(points) <= BOUND).all()
        opt.tell(np.full((N, D), 1e-3, dtype=np.float32), np.ones(N))
    # What the run holds is a checkpoint that loads (its content is validated).
    data = checkpoint_bytes(opt)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.ckpt")
        with open(path, "wb") as f:
            f.write(data)
        assert checkpoint_bytes(optex.OptEx.load(path)) == data


def warmed_points(evaluations: int, continue_from: str) -> optex.OptEx:
    """Six rows, `evaluations` per point, two rounds in, with a pending batch."""
    opt = optex.OptEx(PROBLEM.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=6,
                      evaluations_per_point=evaluations, continue_from=continue_from, seed=7)
    for _ in range(2):
        commit_the_same(opt)
    opt.ask()
    return opt


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bad=st.lists(st.sampled_from(["ok", "nan grad", "inf loss", "huge grad"]), min_size=6, max_size=6),
    evaluations=st.sampled_from([1, 2, 3, 6]),
    continue_from=st.sampled_from(["last", "best_loss"]),
)
def test_dropped_evaluations_leave_the_mean_of_the_others(bad, evaluations, continue_from) -> None:
    """drop_nonfinite with several evaluations per point: a point is the mean of its
    admissible rows, dropped with none; with no point left nothing changes."""
    opt = warmed_points(evaluations, continue_from)
    twin = warmed_points(evaluations, continue_from)
    losses, grads = PROBLEM.value_and_grad(opt.ask())
    for r, kind in enumerate(bad):
        if kind == "nan grad":
            grads[r, 1] = np.nan
        elif kind == "inf loss":
            losses[r] = np.inf
        elif kind == "huge grad":
            grads[r, 0] = 2 * BOUND
    good = [kind == "ok" for kind in bad]
    point_losses = [losses[p * evaluations:(p + 1) * evaluations][good[p * evaluations:(p + 1) * evaluations]]
                    for p in range(6 // evaluations)]
    if not any(good):
        with pytest.raises(RuntimeError, match="can be committed"):
            opt.tell(grads, losses, drop_nonfinite=True)
        commit_the_same(opt, twin)
        assert checkpoint_bytes(opt) == checkpoint_bytes(twin)
        return
    info = opt.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == bad.count("nan grad") + bad.count("inf loss") + bad.count("huge grad")
    assert info.point_evaluations == [evaluations] * (6 // evaluations)
    kept = [p for p, values in enumerate(point_losses) if len(values)]
    means = {p: sum(point_losses[p]) / len(point_losses[p]) for p in kept}
    if continue_from == "last":
        assert info.committed_point == kept[-1]
    else:
        assert means[info.committed_point] == min(means.values())
    assert info.loss == pytest.approx(means[info.committed_point], rel=1e-15)
    assert info.best_loss == pytest.approx(min(means.values()), rel=1e-15)
    for p in range(6 // evaluations):
        if p not in kept:
            assert math.isnan(info.prediction_error[p])
