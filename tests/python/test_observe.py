"""OptEx.observe: true pairs no round committed enter the history, nothing else changes,
and every refused call leaves the engine exactly as it was (python/src/observe.cpp)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from conftest import float_hex, run_iterations, snapshot

import optex
from optex import problems

D = 6
N = 3
T0 = 5


def engine(rounds: int = 2, **options) -> optex.OptEx:
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=N, history=T0,
                      seed=7, **options)
    run_iterations(opt, f, rounds)
    return opt


def pairs(m: int, seed: int = 1, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """m true pairs of the Rosenbrock function, as float64 before the cast."""
    rng = np.random.default_rng(seed)
    points = rng.uniform(-1.5, 1.5, size=(m, D))
    _, grads = problems.Rosenbrock().value_and_grad(points.astype(np.float32))
    return points.astype(dtype), np.asarray(grads, dtype=np.float64).astype(dtype)


def encoded(value):
    """A value of state_arrays() as comparable bits."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return {k: encoded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encoded(v) for v in value]
    if isinstance(value, float):
        return np.float64(value).tobytes()
    return value


def state(opt: optex.OptEx) -> dict:
    """Everything that determines the rest of the run, bit for bit."""
    return encoded(opt.state_arrays())


def without_history(s: dict) -> dict:
    return {k: v for k, v in s.items() if k != "history"}


# ---- what it does ------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 2, T0, T0 + 3, 2 * T0 + 1])
def test_the_pairs_enter_the_history_in_order_and_nothing_else_changes(m: int) -> None:
    opt = engine()
    before = opt.state_arrays()
    points, grads = pairs(m)
    assert opt.observe(points, grads) is None
    after = opt.state_arrays()
    assert without_history(encoded(after)) == without_history(encoded(before))
    h0, h1 = before["history"], after["history"]
    assert h1["size"] == min(T0, h0["size"] + m)
    assert h1["next"] == (h0["next"] + m) % T0
    # The newest min(m, T0) pairs sit in the slots before `next`, in order.
    kept = min(m, T0)
    for k in range(kept):
        slot = (h1["next"] - kept + k) % T0
        assert float_hex(h1["points"][slot]) == float_hex(points[m - kept + k])
        assert float_hex(h1["gradients"][slot]) == float_hex(grads[m - kept + k])


def test_the_evaluations_and_counters_do_not_change() -> None:
    opt = engine()
    iteration, evaluations, step = opt.iteration, opt.evaluations, opt.optimizer_step
    opt.observe(*pairs(4))
    assert (opt.iteration, opt.evaluations, opt.optimizer_step) == (iteration, evaluations, step)


def test_an_engine_that_observed_differs_from_one_that_did_not() -> None:
    observed, twin = engine(), engine()
    observed.observe(*pairs(3))
    assert not np.array_equal(observed.ask(), twin.ask())


def test_observed_pairs_end_the_warm_up() -> None:
    f = problems.Rosenbrock()
    fresh = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=N)
    twin = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=N)
    x0 = f.standard_start(D).astype(np.float32)
    near = np.stack([x0, x0 + 0.01, x0 - 0.02]).astype(np.float32)
    _, grads = f.value_and_grad(near)
    fresh.observe(near, grads)
    held = twin.ask()
    assert np.array_equal(held[-1], held[0])  # the twin warms up at the iterate
    stepped = fresh.ask()
    assert not np.array_equal(stepped[-1], stepped[0])
    assert np.array_equal(fresh.seeds, twin.seeds)
    assert fresh.evaluations == 0 and fresh.iteration == 0


def test_float64_and_lists_are_rounded_as_float32_input() -> None:
    points, grads = pairs(4, dtype=np.float64)
    reference = engine()
    reference.observe(points.astype(np.float32), grads.astype(np.float32))
    from_float64 = engine()
    from_float64.observe(points, grads)
    assert state(from_float64) == state(reference)
    from_lists = engine()
    from_lists.observe(points.tolist(), grads.tolist())
    assert state(from_lists) == state(reference)
    mixed = engine()
    mixed.observe(points.astype(np.float32), grads)
    assert state(mixed) == state(reference)


def test_one_pair_may_be_given_as_d_vectors() -> None:
    points, grads = pairs(1)
    as_rows, as_vectors = engine(), engine()
    as_rows.observe(points, grads)
    as_vectors.observe(points[0], grads[0])
    assert state(as_vectors) == state(as_rows)


def test_no_pairs_change_nothing() -> None:
    opt, twin = engine(), engine()
    opt.observe(np.zeros((0, D)), np.zeros((0, D), dtype=np.float32))
    assert state(opt) == state(twin)


def test_many_pairs_at_once_are_single_observes() -> None:
    points, grads = pairs(2 * T0 + 2)
    at_once, singly = engine(), engine()
    at_once.observe(points, grads)
    for p, g in zip(points, grads):
        singly.observe(p, g)
    assert state(at_once) == state(singly)


# ---- checkpoints -------------------------------------------------------------------


def trajectory(opt: optex.OptEx, iterations: int) -> list[str]:
    return [float_hex(opt.x) + repr(info.loss)
            for info in run_iterations(opt, problems.Rosenbrock(), iterations)]


def test_a_checkpoint_after_observe_continues_bit_for_bit(tmp_path: pathlib.Path) -> None:
    opt = engine()
    opt.observe(*pairs(T0 + 2))
    path = tmp_path / "observed.ckpt"
    opt.save(path)
    restored = optex.OptEx.load(path)
    from_arrays = optex.OptEx.from_state_arrays(opt.state_arrays())
    assert state(restored) == state(opt)
    assert state(from_arrays) == state(opt)
    expected = trajectory(opt, 5)
    assert trajectory(restored, 5) == expected
    assert trajectory(from_arrays, 5) == expected
    assert state(restored) == state(opt)


# ---- refusals ----------------------------------------------------------------------


P, G = pairs(3)


def with_value(a: np.ndarray, row: int, column: int, value, dtype=None) -> np.ndarray:
    out = np.array(a, dtype=dtype or a.dtype)
    out[row, column] = value
    return out


BOUND = optex.magnitude_bound(D)


@pytest.mark.parametrize(
    ("points", "grads", "message"),
    [
        (P.astype(np.int64), G, "points: dtype int64 is not supported"),
        (P, G.astype(np.float16), "grads: dtype float16 is not supported"),
        (P.astype(np.complex128), G, "points: dtype complex128 is not supported"),
        (["a"], G, r"points: must hold real numbers, got 'a' \(str\) at index \(0,\)"),
        (P, [["1.0"] * 6] * 3, r"grads: must hold real numbers, got '1.0' \(str\) at index \(0, 0\)"),
        (P[:, :-1], G, r"points: expected shape \(m, 6\) or \(6,\), got \(3, 5\)"),
        (P, G[:, :-1], r"grads: expected shape \(m, 6\) or \(6,\), got \(3, 5\)"),
        (P[None], G, r"points: expected shape \(m, 6\) or \(6,\), got \(1, 3, 6\)"),
        (np.float32(1.0), G, r"points: expected shape .*got \(\)"),
        (P, G[:2], r"grads: shape \(2, 6\) does not match points' \(3, 6\)"),
        (P[0], G, r"grads: shape \(3, 6\) does not match points' \(6,\)"),
        (np.asfortranarray(P), G, "points: the array is not C-contiguous"),
        (P, np.asfortranarray(G), "grads: the array is not C-contiguous"),
        (P[::-1], G, "points: the array is not C-contiguous"),
        (with_value(P, 1, 2, np.nan), G, "points: row 1, column 2 is nan"),
        (P, with_value(G, 0, 4, np.inf), "grads: row 0, column 4 is inf"),
        (P, with_value(G, 2, 5, -np.inf), "grads: row 2, column 5 is -inf"),
        (with_value(P, 2, 0, 3e38), G, "points: row 2, column 0 is 3e\\+38.*above the magnitude bound"),
        (P, with_value(G, 1, 1, np.nextafter(np.float32(BOUND), np.float32(np.inf))),
         "grads: row 1, column 1 is .*above the magnitude bound"),
        (with_value(P, 0, 3, 1e300, np.float64), G, "points: row 0, column 3 is 1e\\+300, outside the float32 range"),
        (P, with_value(G, 2, 2, np.nan, np.float64), "grads: row 2, column 2 is nan"),
        (P[1].copy() * np.float32(np.nan), G[1], "points: row 0, column 0 is nan"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(points, grads, message) -> None:
    opt, twin = engine(), engine()
    with pytest.raises(ValueError, match=message):
        opt.observe(points, grads)
    assert state(opt) == state(twin)
    # Nothing left behind: a valid observe and more rounds go as the twin's.
    opt.observe(P, G)
    twin.observe(P, G)
    assert trajectory(opt, 2) == trajectory(twin, 2)


def test_values_at_the_bound_are_taken() -> None:
    opt = engine()
    points = with_value(P, 0, 0, -BOUND)
    grads = with_value(G, 0, 0, BOUND)
    opt.observe(points, grads)
    assert opt.state_arrays()["history"]["size"] == T0


def test_between_ask_and_tell_is_refused_and_changes_nothing() -> None:
    f = problems.Rosenbrock()
    opt, twin = engine(), engine()
    points = np.array(opt.ask())
    twin.ask()
    before = snapshot(opt)
    with pytest.raises(RuntimeError, match=r"observe: between ask\(\) and tell\(\) \(iteration 2\)"):
        opt.observe(P, G)
    with pytest.raises(RuntimeError, match="between ask"):
        opt.observe(np.zeros((0, D)), np.zeros((0, D)))  # even no pairs
    with pytest.raises(RuntimeError, match="between ask"):
        opt.observe(P.astype(np.int64), G)  # before the arrays are looked at
    assert snapshot(opt) == before
    assert np.array_equal(opt.ask(), points)
    losses, grads = f.value_and_grad(points)
    opt.tell(grads, losses)
    twin.tell(grads, losses)
    assert state(opt) == state(twin)


def test_a_slice_of_a_sharded_engine_refuses() -> None:
    class Sums:
        def sum(self, values):
            return None

        def all(self, flags):
            return None

    f = problems.Rosenbrock()
    sliced = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=N,
                         shard=(D, 0, Sums()))
    before = encoded(sliced.state_arrays())
    with pytest.raises(RuntimeError, match="slice of a sharded engine"):
        sliced.observe(P, G)
    assert encoded(sliced.state_arrays()) == before


def test_a_call_from_inside_another_is_refused() -> None:
    """observe respects the one-call-at-a-time guard: from the gradient oracle, which runs
    inside ask(), it raises RuntimeError and changes nothing."""
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=N,
                      proxy="target")
    twin = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.02), parallelism=N,
                       proxy="target")

    def oracle(x):
        opt.observe(P, G)
        return 0.0, np.zeros(D)

    opt.set_gradient_oracle(oracle)
    with pytest.raises(RuntimeError, match="busy"):
        opt.ask()
    assert state(opt) == state(twin)


def test_the_stub_documents_observe() -> None:
    assert optex.OptEx.observe.__doc__.startswith("observe(self, points: ArrayLike, grads: ArrayLike) -> None")
