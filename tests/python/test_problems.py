"""optex.problems: one point or a batch, the same numbers; known values."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from optex import problems

ALL = [
    problems.Sphere,
    problems.Rosenbrock,
    problems.Ackley,
    problems.Rastrigin,
    problems.Levy,
    problems.Griewank,
    problems.StyblinskiTang,
    problems.Schwefel,
]
NAMES = ["sphere", "rosenbrock", "ackley", "rastrigin", "levy", "griewank", "styblinski_tang",
         "schwefel"]


def batch_for(p: problems.Problem, rows: int, d: int) -> np.ndarray:
    lo, hi = p.domain
    return np.stack([problems.uniform_start(d, lo, hi, seed) for seed in range(rows)])


@pytest.mark.parametrize("cls", ALL)
def test_batch_equals_rows_bit_for_bit(cls) -> None:
    p = cls()
    points = batch_for(p, 5, 9)
    losses, grads = p.value_and_grad(points)
    assert losses.shape == (5,) and losses.dtype == np.float64
    assert grads.shape == (5, 9) and grads.dtype == np.float32
    assert np.array_equal(p(points), losses)
    for r in range(5):
        loss, grad = p.value_and_grad(points[r])
        assert isinstance(loss, float)
        assert grad.shape == (9,) and grad.dtype == np.float32
        assert loss == losses[r]
        assert np.array_equal(grad, grads[r])
        assert p(points[r]) == loss
        assert p(list(map(float, points[r]))) == loss  # a list of Python floats


@pytest.mark.parametrize(("cls", "name"), list(zip(ALL, NAMES)))
def test_minimum_at_the_minimizer(cls, name) -> None:
    p = cls()
    assert p.name == name
    for d in (2, 10):
        x = p.minimizer(d)
        assert x.dtype == np.float32 and x.shape == (d,)
        # The minimiser is rounded to float32, so the value is only close.
        assert p(x) == pytest.approx(p.minimum(d), abs=1e-4 * max(1.0, abs(p.minimum(d))))
        start = p.standard_start(d)
        assert p(start) > p.minimum(d)
        assert all(p.domain.contains(v) for v in start)


def test_known_values() -> None:
    sphere = problems.Sphere()
    loss, grad = sphere.value_and_grad(sphere.standard_start(7))
    assert loss == 7.0 and np.all(grad == 2.0)
    assert problems.Rastrigin()(np.full(4, 2.25, dtype=np.float32)) == pytest.approx(15.0625 * 4)
    assert problems.Rosenbrock()(np.array([-1.2, 1.0], dtype=np.float32)) == pytest.approx(24.2)
    assert problems.StyblinskiTang().minimum(3) == pytest.approx(-39.16616570 * 3)
    assert problems.Sphere().domain == problems.Domain(-5.12, 5.12)
    assert tuple(problems.Schwefel().domain) == (-500.0, 500.0)


def test_float64_points_are_rounded_to_float32() -> None:
    p = problems.Ackley()
    x64 = np.linspace(-1.0, 1.0, 11)
    assert p(x64) == p(x64.astype(np.float32))
    strided = np.linspace(-1.0, 1.0, 22, dtype=np.float32)[::2]
    assert p(strided) == p(np.ascontiguousarray(strided))


def test_empty_batch() -> None:
    losses, grads = problems.Sphere().value_and_grad(np.zeros((0, 3), dtype=np.float32))
    assert losses.shape == (0,) and grads.shape == (0, 3)


def test_rotated() -> None:
    base = problems.Rastrigin()
    p = problems.Rotated(base, 6, seed=3)
    assert p.name == "rotated_rastrigin"
    assert p.base is base
    assert (p.dimension, p.seed) == (6, 3)
    q = p.rotation
    assert q.shape == (6, 6) and np.allclose(q @ q.T, np.eye(6), atol=1e-5)
    x = problems.uniform_start(6, -1.0, 1.0, 0)
    # f(x) = base(Q x): equal up to the rounding of Q x to float32.
    assert p(x) == pytest.approx(base((q.astype(np.float64) @ x).astype(np.float32)), rel=1e-5)
    assert p(p.standard_start(6)) == pytest.approx(base(base.standard_start(6)), rel=1e-4)
    assert repr(p) == "Rotated(Rastrigin(), d=6, seed=3)"
    with pytest.raises(ValueError, match="x: size must equal the rotation's dimension 6, got 5"):
        p(np.zeros(5))
    with pytest.raises(ValueError, match="d: must equal the rotation's dimension 6, got 4"):
        p.minimizer(4)
    with pytest.raises(ValueError, match="d: a dense rotation supports d <= 4096, got 5000"):
        problems.Rotated(base, 5000)


def test_gradient_noise() -> None:
    base = problems.Sphere()
    p = problems.WithGradientNoise(base, sigma=0.5, seed=1)
    x = np.ones(8, dtype=np.float32)
    loss, grad = p.value_and_grad(x)
    assert loss == base(x)  # only the gradient is noisy
    _, again = p.value_and_grad(x)
    assert np.array_equal(grad, again)  # a function of the point and the seed
    _, other = problems.WithGradientNoise(base, sigma=0.5, seed=2).value_and_grad(x)
    assert not np.array_equal(grad, other)
    assert (p.sigma, p.seed, p.name) == (0.5, 1, "sphere")
    assert repr(p) == "WithGradientNoise(Sphere(), sigma=0.5, seed=1)"
    with pytest.raises(ValueError, match="sigma: must be finite and >= 0, got -1"):
        problems.WithGradientNoise(base, sigma=-1.0)
    nested = problems.Rotated(problems.WithGradientNoise(problems.Levy(), 1.0, 4), 5, seed=2)
    assert nested.name == "rotated_levy"
    losses, grads = nested.value_and_grad(np.ones((3, 5)))
    assert np.array_equal(grads[0], grads[1])


@pytest.mark.parametrize(
    ("p", "d"),
    [
        (problems.Griewank(), 5),
        (problems.Rotated(problems.Ackley(), 4, seed=8), 4),
        (problems.WithGradientNoise(problems.Rotated(problems.Levy(), 3, 1), 0.1, 6), 3),
    ],
)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle(p, d, protocol) -> None:
    clone = pickle.loads(pickle.dumps(p, protocol))
    assert type(clone) is type(p) and repr(clone) == repr(p)
    x = np.linspace(0.1, 0.9, d)
    assert clone(x) == p(x)
    assert np.array_equal(clone.value_and_grad(x)[1], p.value_and_grad(x)[1])


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: problems.Sphere()(np.zeros((2, 2, 2))), ValueError,
         r"x: expected one point of shape \(d,\) or a batch of points of shape \(B, d\), got "
         r"shape \(2, 2, 2\)"),
        (lambda: problems.Sphere()(np.zeros(0)), ValueError, "x: dimension must be >= 1, got 0"),
        (lambda: problems.Rosenbrock()(np.zeros(1)), ValueError,
         "x: dimension must be >= 2 \\(rosenbrock couples neighbouring coordinates\\), got 1"),
        (lambda: problems.Sphere()(np.zeros(3, dtype=np.int64)), ValueError,
         "x: dtype int64 is not supported"),
        (lambda: problems.Sphere().standard_start(0), ValueError, "d: dimension must be >= 1, got 0"),
        (lambda: problems.Sphere().minimizer(-2), ValueError, "d: dimension must be >= 1, got -2"),
        (lambda: problems.Rotated("sphere", 3), TypeError,
         "base: expected an optex.problems problem, got str"),
        (lambda: problems.uniform_start(3, 1.0, -1.0), ValueError, "lo, hi: need finite lo < hi"),
        (lambda: problems.Problem(), TypeError, "No constructor defined"),
    ],
)
def test_errors(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_uniform_start() -> None:
    x = problems.uniform_start(1000, -1.0, 1.0, seed=4)
    assert x.dtype == np.float32 and x.shape == (1000,)
    assert np.all((x >= -1.0) & (x <= 1.0))
    assert np.array_equal(x, problems.uniform_start(1000, -1.0, 1.0, seed=4))
    assert not np.array_equal(x, problems.uniform_start(1000, -1.0, 1.0, seed=5))


def test_classes_live_in_optex_problems() -> None:
    for cls in ALL + [problems.Problem, problems.Rotated, problems.WithGradientNoise,
                      problems.Domain]:
        assert cls.__module__ == "optex.problems"
    assert isinstance(problems.Sphere(), problems.Problem)
