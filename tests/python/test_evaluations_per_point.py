"""Points with several evaluations (Options.evaluations_per_point = D), through the bindings.

The N rows of a batch hold P = N / D distinct points: row r belongs to point
r // D, the rows of a point are identical and each has its own seed. tell()
averages a point's admissible evaluations (gradients summed in float64 in row
order, then rounded to float32; losses in float64), so P = 1 (D = N) is one
step of the base optimizer with the mean of the N gradients, and D identical
evaluations of every point are one evaluation each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import float_hex, snapshot
from objectives import noisy_sphere

import optex
from optex import problems


def point_mean(grads: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, float]:
    """The engine's mean of one point's evaluations: float64 sums in row order."""
    g = np.zeros(grads.shape[1], np.float64)
    loss = 0.0
    for row, value in zip(grads, losses):
        g += row.astype(np.float64)
        loss += float(value)
    return (g / len(grads)).astype(np.float32), loss / len(grads)


def evaluate(points: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """noisy_sphere at every row with the row's own seed: (grads float32, losses)."""
    pairs = [noisy_sphere(points[r], int(s)) for r, s in enumerate(seeds)]
    return (np.array([g for _, g in pairs], np.float32), np.array([f for f, _ in pairs]))


X0 = problems.Rosenbrock().standard_start(5)


@pytest.mark.parametrize(("n", "d"), [(6, 2), (6, 3), (4, 4), (5, 1)])
def test_row_r_holds_point_r_over_d(n: int, d: int) -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, optex.Adam(lr=0.02), parallelism=n, evaluations_per_point=d, seed=3)
    p = n // d
    for round_index in range(4):
        points = np.array(opt.ask())
        assert points.shape == (n, X0.size)
        by_point = points.reshape(p, d, X0.size)
        for rows in by_point:  # the rows of one point are the same point, bit for bit
            assert all(float_hex(row) == float_hex(rows[0]) for row in rows)
        if round_index > 0 and p > 1:  # after the warm-up the proxy steps move each point
            distinct = {float_hex(rows[0]) for rows in by_point}
            assert len(distinct) == p
        if round_index == 0:  # warm-up: every point at the iterate
            assert all(float_hex(row) == float_hex(opt.x) for row in points)
        losses, grads = f.value_and_grad(points)
        info = opt.tell(grads, losses)
        assert info.point_evaluations == [d] * p
        assert sum(info.point_evaluations) == n
        assert info.committed_point == p - 1  # the last point, nothing dropped
        assert len(info.posterior_variance) == len(info.prediction_error) == p
        assert info.evaluations == n * (round_index + 1) == opt.evaluations


def test_each_row_has_its_own_seed() -> None:
    opt = optex.OptEx(X0, parallelism=8, evaluations_per_point=4, seed=9)
    seen: set[int] = set()
    for _ in range(3):
        points = opt.ask()
        seeds = opt.seeds
        assert seeds.shape == (8,) and len(set(seeds.tolist())) == 8
        assert not seen & set(seeds.tolist())  # and new ones every round
        seen |= set(seeds.tolist())
        opt.tell(*evaluate(points, seeds))


@pytest.mark.parametrize("n", [2, 4, 7])
def test_one_point_is_a_step_with_the_mean_gradient(n: int) -> None:
    """P = 1: no proxy steps; each round is the base optimizer's step from the iterate
    with the mean of the N stochastic gradients there, bit for bit."""
    adam = optex.Adam(lr=0.05)
    opt = optex.OptEx(X0, adam, parallelism=n, evaluations_per_point=n, seed=4)
    x, state = X0.copy(), optex.init_state(adam, X0.size)
    for _ in range(12):
        points = opt.ask()
        assert all(float_hex(row) == float_hex(x) for row in points)
        grads, losses = evaluate(points, opt.seeds)
        info = opt.tell(grads, losses)
        mean_grad, mean_loss = point_mean(grads, losses)
        optex.apply_step(adam, x, state, mean_grad)
        assert float_hex(opt.x) == float_hex(x)
        assert info.loss == mean_loss and info.best_loss == mean_loss
        assert info.point_evaluations == [n] and info.committed_point == 0
        assert info.grad_norm == pytest.approx(float(np.linalg.norm(mean_grad)), rel=1e-6)
        assert math.isnan(info.posterior_variance[0]) and math.isnan(info.cosine)
    assert state.step == 12


def test_one_point_follows_torch_adam_with_the_mean_gradient() -> None:
    torch = pytest.importorskip("torch", reason="the torch reference needs PyTorch")
    n = 4
    opt = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=n, evaluations_per_point=n, seed=4)
    param = torch.nn.Parameter(torch.from_numpy(X0.copy()))
    reference = torch.optim.Adam([param], lr=0.05)
    for _ in range(12):
        points = opt.ask()
        grads, losses = evaluate(points, opt.seeds)
        opt.tell(grads, losses)
        param.grad = torch.from_numpy(grads.astype(np.float64).mean(axis=0).astype(np.float32))
        reference.step()
        np.testing.assert_allclose(opt.x, param.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_identical_evaluations_are_one_evaluation() -> None:
    """A deterministic objective: D evaluations of each point average to the one
    evaluation (float32 gradients exactly; float64 losses to the rounding of their
    sum), so (N = 2D, D) follows the trajectory of (N = 2, D = 1) bit for bit."""
    f = problems.Rosenbrock()
    several = optex.OptEx(X0, optex.Adam(lr=0.02), parallelism=6, evaluations_per_point=3, seed=1)
    single = optex.OptEx(X0, optex.Adam(lr=0.02), parallelism=2, seed=1)
    for _ in range(10):
        rows = np.array(several.ask())
        points = np.array(single.ask())
        assert float_hex(rows[::3].ravel()) == float_hex(points.ravel())
        a = several.tell(*reversed(f.value_and_grad(rows)))
        b = single.tell(*reversed(f.value_and_grad(points)))
        assert float_hex(several.x) == float_hex(single.x)
        assert (a.grad_norm, a.committed_point) == (b.grad_norm, b.committed_point)
        assert repr(a.cosine) == repr(b.cosine)  # nan in the warm-up
        assert a.loss == pytest.approx(b.loss, rel=1e-15, abs=0.0)
        assert a.best_loss == pytest.approx(b.best_loss, rel=1e-15, abs=0.0)
        assert several.lengthscale == single.lengthscale
    assert several.evaluations == 3 * single.evaluations


def test_a_dropped_evaluation_leaves_the_mean_of_the_others() -> None:
    adam = optex.Adam(lr=0.05)
    opt = optex.OptEx(X0, adam, parallelism=4, evaluations_per_point=4, seed=2)
    points = opt.ask()
    grads, losses = evaluate(points, opt.seeds)
    grads[1, 2] = np.nan
    losses[3] = np.inf
    info = opt.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == 2 and info.point_evaluations == [4]
    mean_grad, mean_loss = point_mean(grads[[0, 2]], losses[[0, 2]])
    x, state = X0.copy(), optex.init_state(adam, X0.size)
    optex.apply_step(adam, x, state, mean_grad)
    assert float_hex(opt.x) == float_hex(x) and info.loss == mean_loss


def test_a_point_without_an_admissible_evaluation_is_dropped() -> None:
    f = problems.Sphere()
    opt = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=4, evaluations_per_point=2)
    for _ in range(2):
        losses, grads = f.value_and_grad(opt.ask())
        opt.tell(grads, losses)
    losses, grads = f.value_and_grad(opt.ask())
    losses[2:] = np.nan  # both evaluations of the last point
    info = opt.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == 2 and info.committed_point == 0
    assert info.loss == (losses[0] + losses[1]) / 2
    assert math.isnan(info.prediction_error[1])
    opt.ask()
    before = snapshot(opt)
    with pytest.raises(RuntimeError, match="can be committed"):
        opt.tell(grads, np.full(4, np.nan), drop_nonfinite=True)  # no point has one
    assert snapshot(opt) == before


def run(seed: int, rounds: int = 15, **options) -> tuple[np.ndarray, list[str]]:
    opt = optex.OptEx(X0, optex.Adam(lr=0.05), seed=seed, **options)
    infos = []
    for _ in range(rounds):
        points = opt.ask()
        infos.append(repr(opt.tell(*evaluate(points, opt.seeds))))
    return opt.x, infos


@pytest.mark.parametrize(
    "options",
    [dict(parallelism=6, evaluations_per_point=2),
     dict(parallelism=6, evaluations_per_point=3, continue_from="best_loss"),
     dict(options=optex.Options.adaptive(6)),
     dict(parallelism=4, evaluations_per_point=2, trust_region=1.0, max_posterior_variance=0.5)],
    ids=["D2", "D3-best-loss", "adaptive", "safeguards"],
)
def test_the_same_seed_gives_the_same_trajectory(options: dict) -> None:
    x, infos = run(7, **options)
    again_x, again_infos = run(7, **options)
    assert float_hex(x) == float_hex(again_x) and infos == again_infos
    other_x, _ = run(8, **options)
    assert float_hex(other_x) != float_hex(x)  # other seeds, other evaluations


def test_minimize_gives_each_evaluation_its_seed() -> None:
    res = optex.minimize(noisy_sphere, X0, optimizer=optex.Adam(lr=0.05), parallelism=6,
                         evaluations_per_point=3, seed=5, max_iters=8, pass_seed=True)
    opt = optex.OptEx(X0, optex.Adam(lr=0.05), parallelism=6, evaluations_per_point=3, seed=5)
    for _ in range(8):
        points = opt.ask()
        opt.tell(*evaluate(points, opt.seeds))
    assert float_hex(res.x) == float_hex(opt.x)
    assert res.n_gradient_evaluations == 8 * 6 + 1
