"""What IterationInfo reports about a round's distinct points, and the options that
act on it: the posterior variance, the prediction error, the gradient noise, the
safeguards that cut the proxy chain (chain_stop), continue_from, the adaptive
split and the bound on lengthscale changes. Checked through the bindings against
numpy references where the quantity is defined by a formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import float_hex

import optex
from optex import problems

X0 = problems.Rosenbrock().standard_start(6)
MAX_NOISE = 1e30  # the engine's cap on a measured gradient noise


def noisy(points: np.ndarray, seeds: np.ndarray, sigma: float, signal: float = 1.0):
    """signal * the sphere's gradient plus N(0, sigma^2) noise from each row's seed:
    (grads float32, losses)."""
    noise = np.array([np.random.default_rng(int(s)).standard_normal(points.shape[1])
                      for s in seeds])
    grads = (signal * 2.0 * points + sigma * noise).astype(np.float32)
    return grads, np.einsum("ij,ij->i", points, points).astype(np.float64)


def rows_of(point_evaluations: list[int]) -> list[range]:
    starts = np.concatenate([[0], np.cumsum(point_evaluations)])
    return [range(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def is_nan(values) -> list[bool]:
    return [math.isnan(v) for v in values]


def test_round_fields_have_python_types() -> None:
    opt = optex.OptEx(X0, parallelism=4, evaluations_per_point=2)
    losses, grads = problems.Sphere().value_and_grad(opt.ask())
    info = opt.tell(grads, losses)
    assert type(info.point_evaluations) is list and all(type(v) is int for v in info.point_evaluations)
    for values in (info.posterior_variance, info.prediction_error):
        assert type(values) is list and all(type(v) is float for v in values)
    assert type(info.gradient_noise) is float and type(info.chain_stop) is str
    info.point_evaluations.append(99)  # a copy per access
    assert info.point_evaluations == [2, 2]
    with pytest.raises(AttributeError):
        info.chain_stop = "trust_region"
    text = repr(info)
    assert "point_evaluations=[2, 2]" in text and "chain_stop=''" in text


@pytest.mark.parametrize(("n", "d"), [(4, 1), (6, 2)])
def test_posterior_variance_and_prediction_error(n: int, d: int) -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, optex.Adam(lr=0.02), parallelism=n, evaluations_per_point=d)
    p = n // d
    for round_index in range(8):
        points = opt.ask()
        predicted = [opt.predicted_gradient(q * d) for q in range(p - 1)]
        losses, grads = f.value_and_grad(points)
        info = opt.tell(grads, losses)
        variance, error = info.posterior_variance, info.prediction_error
        assert len(variance) == len(error) == p
        if round_index == 0:  # warm-up: no GP prediction anywhere
            assert all(is_nan(variance)) and all(is_nan(error))
            continue
        # The last point has no proxy step from it; the others had a GP prediction,
        # whose variance lies between 0 and the prior's (1).
        assert is_nan(variance) == [False] * (p - 1) + [True]
        assert all(0.0 <= v <= 1.0 for v in variance[:-1]), variance
        for q in range(p - 1):
            mean = grads[q * d:(q + 1) * d].astype(np.float64).mean(axis=0)
            expected = np.linalg.norm(mean - predicted[q]) / np.linalg.norm(mean)
            assert error[q] == pytest.approx(expected, rel=1e-5), (round_index, q)
        assert math.isnan(error[-1])
        assert info.chain_stop == ""


def test_without_a_gp_there_is_no_posterior_variance() -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, parallelism=4, proxy="last_gradient")
    for _ in range(4):
        losses, grads = f.value_and_grad(opt.ask())
        info = opt.tell(grads, losses)
        assert all(is_nan(info.posterior_variance))


def reference_noise(grads: np.ndarray, point_evaluations: list[int]) -> float:
    """rho: the mean over points with m >= 2 evaluations of tr(C) / (||mean||^2 - tr(C) / m)."""
    values = []
    for rows in rows_of(point_evaluations):
        g = grads[rows.start:rows.stop].astype(np.float64)
        m = len(g)
        if m < 2:
            continue
        mean = g.mean(axis=0)
        trace = ((g - mean) ** 2).sum() / (m - 1)
        signal = mean @ mean - trace / m
        values.append(min(trace / signal, MAX_NOISE) if signal > 0 else MAX_NOISE)
    return float(np.mean(values)) if values else math.nan


@pytest.mark.parametrize(("n", "d", "sigma"), [(6, 3, 0.3), (8, 2, 1.0), (4, 4, 0.05)])
def test_gradient_noise_is_rho(n: int, d: int, sigma: float) -> None:
    opt = optex.OptEx(X0, optex.Adam(lr=0.02), parallelism=n, evaluations_per_point=d, seed=6)
    for _ in range(5):
        points = opt.ask()
        grads, losses = noisy(np.array(points), opt.seeds, sigma)
        info = opt.tell(grads, losses)
        expected = reference_noise(grads, info.point_evaluations)
        assert info.gradient_noise == pytest.approx(expected, rel=1e-9)
        assert 0.0 < info.gradient_noise < MAX_NOISE


def test_gradient_noise_is_nan_without_repeats_and_capped_for_noise_only() -> None:
    single = optex.OptEx(X0, parallelism=4, seed=1)
    grads, losses = noisy(np.array(single.ask()), single.seeds, 0.5)
    assert math.isnan(single.tell(grads, losses).gradient_noise)
    # Zero signal: the unbiased squared norm of the mean is not positive.
    only_noise = optex.OptEx(X0, parallelism=8, evaluations_per_point=8, seed=1)
    grads, losses = noisy(np.array(only_noise.ask()), only_noise.seeds, 1.0, signal=0.0)
    assert only_noise.tell(grads, losses).gradient_noise == reference_noise(grads, [8]) == MAX_NOISE


@pytest.mark.parametrize(
    ("options", "stop"),
    [(dict(max_posterior_variance=1e-300), "posterior_variance"),
     (dict(trust_region=1e-9), "trust_region")],
)
def test_a_safeguard_cuts_the_chain_and_the_last_point_takes_the_rest(options, stop) -> None:
    """A threshold no proxy step passes: from round 2 on the chain stops at its first
    point, which takes all N evaluations."""
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, optex.Adam(lr=0.02), parallelism=6, evaluations_per_point=2, **options)
    for round_index in range(5):
        points = np.array(opt.ask())
        losses, grads = f.value_and_grad(points)
        info = opt.tell(grads, losses)
        if round_index == 0:  # warm-up: no prediction, no step before it
            assert info.chain_stop == "" and info.point_evaluations == [2, 2, 2]
            continue
        assert info.chain_stop == stop
        assert info.point_evaluations == [6]
        assert len(set(float_hex(row) for row in points)) == 1  # all at the iterate
        # The variance of the GP prediction the safeguard refused is still reported.
        (variance,) = info.posterior_variance
        assert 1e-300 < variance <= 1.0


def test_a_safeguard_that_cuts_late_keeps_the_rows_of_each_point_together() -> None:
    """Momentum makes the proxy steps grow: the trust region then cuts the chain after
    some points, and the last point made takes the evaluations of the others."""
    f = problems.Sphere()
    cut_rounds = 0
    opt = optex.OptEx(X0, optex.Sgd(lr=1e-4, momentum=0.9), parallelism=8,
                      evaluations_per_point=2, trust_region=1.5, seed=3)
    for _ in range(8):
        points = np.array(opt.ask())
        losses, grads = f.value_and_grad(points)
        info = opt.tell(grads, losses)
        assert sum(info.point_evaluations) == 8
        assert all(e >= 2 for e in info.point_evaluations)
        assert len(info.posterior_variance) == len(info.point_evaluations)
        if info.chain_stop:
            assert info.chain_stop == "trust_region"
            cut_rounds += len(info.point_evaluations) > 1
            assert info.point_evaluations[:-1] == [2] * (len(info.point_evaluations) - 1)
        else:
            assert info.point_evaluations == [2, 2, 2, 2]
        for rows in rows_of(info.point_evaluations):
            assert len({float_hex(points[r]) for r in rows}) == 1
    assert cut_rounds > 0  # a cut after the first point


def test_continue_from_best_loss_commits_from_the_lowest_point_loss() -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, optex.Adam(lr=0.5), parallelism=6, evaluations_per_point=2,
                      continue_from="best_loss")  # steps large enough to overshoot
    not_last = 0
    for _ in range(15):
        points = np.array(opt.ask())
        losses, grads = f.value_and_grad(points)
        info = opt.tell(grads, losses)
        point_losses = [losses[rows.start:rows.stop].mean() for rows in rows_of(info.point_evaluations)]
        best = int(np.argmin(point_losses))
        if point_losses.count(point_losses[best]) == 1:
            assert info.committed_point == best
        assert info.loss == info.best_loss == pytest.approx(min(point_losses), rel=1e-15)
        not_last += info.committed_point != len(point_losses) - 1
    assert not_last > 0  # the option made a difference


def test_the_adaptive_split_follows_the_gradient_noise() -> None:
    """The warm-up round goes to one point; after it noise-free gradients keep one
    evaluation per point, and noise-only gradients all N evaluations at one point."""
    clean = optex.OptEx(X0, optex.Adam(lr=0.05), options=optex.Options.adaptive(4))
    for t in range(12):
        losses, grads = problems.Sphere().value_and_grad(clean.ask())
        info = clean.tell(grads, losses)
        assert info.point_evaluations == ([4] if t == 0 else [1, 1, 1, 1])
        if t == 0:
            assert info.gradient_noise == 0.0  # measured on identical rows
    noise = optex.OptEx(X0, optex.Adam(lr=0.01), options=optex.Options.adaptive(4))
    splits = []
    for _ in range(12):
        points = np.array(noise.ask())
        grads, losses = noisy(points, noise.seeds, 1.0, signal=0.0)
        info = noise.tell(grads, losses)
        assert sum(info.point_evaluations) == 4
        for rows in rows_of(info.point_evaluations):
            assert len({float_hex(points[r]) for r in rows}) == 1
        splits.append(info.point_evaluations)
    # The warm-up round measures the noise; every later round averages at one point.
    assert splits == [[4]] * 12


@pytest.mark.parametrize("limit", [1.0, 2.0])
def test_max_lengthscale_change_bounds_each_selection(limit: float) -> None:
    f = problems.Rosenbrock()
    runs = {}
    for bound in (limit, math.inf):
        opt = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=4, max_lengthscale_change=bound)
        scales = [opt.lengthscale]
        for _ in range(10):
            losses, grads = f.value_and_grad(opt.ask())
            scales.append(opt.tell(grads, losses).lengthscale)
        runs[bound] = scales
    bounded = runs[limit]
    for before, after in zip(bounded, bounded[1:]):
        assert before / limit * (1 - 1e-12) <= after <= before * limit * (1 + 1e-12)
    free = runs[math.inf]
    assert max(b / a for a, b in zip(free, free[1:]) if a > 0) > limit  # the bound mattered
