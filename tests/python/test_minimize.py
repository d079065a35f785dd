"""optex.minimize: threads and processes, stop criteria, seeds, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from objectives import (
    fails_far_from_start,
    noisy_sphere,
    not_a_pair,
    pure_python_quadratic,
    rosenbrock,
    wrong_shape,
)

import optex
from optex import problems

X0 = problems.Rosenbrock().standard_start(12)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_processes_give_the_result_of_threads() -> None:
    kwargs = dict(optimizer=optex.Adam(lr=0.01), parallelism=4, max_iters=15)
    threads = optex.minimize(rosenbrock, X0, workers="threads", **kwargs)
    processes = optex.minimize(rosenbrock, X0, workers="processes", max_workers=2, **kwargs)
    assert same_bits(threads.x, processes.x)
    assert threads.fun == processes.fun
    assert threads.loss_history == processes.loss_history
    assert threads.nit == processes.nit == 15


def test_a_pure_python_objective_runs_in_processes() -> None:
    x0 = np.zeros(8, dtype=np.float32)
    res = optex.minimize(pure_python_quadratic, x0, optimizer=optex.Adam(lr=0.05),
                         parallelism=2, max_iters=40, workers="processes", max_workers=2)
    threads = optex.minimize(pure_python_quadratic, x0, optimizer=optex.Adam(lr=0.05),
                             parallelism=2, max_iters=40)
    assert same_bits(res.x, threads.x)
    assert res.fun < pure_python_quadratic(x0)[0] / 10


def test_minimize_is_the_ask_tell_loop() -> None:
    res = optex.minimize(rosenbrock, X0, optimizer=optex.Sgd(lr=1e-4, momentum=0.9),
                         parallelism=3, seed=5, max_iters=10)
    opt = optex.OptEx(X0, optex.Sgd(lr=1e-4, momentum=0.9), parallelism=3, seed=5)
    history = []
    for _ in range(10):
        losses, grads = problems.Rosenbrock().value_and_grad(opt.ask())
        history.append(opt.tell(grads, losses).loss)
    assert same_bits(res.x, opt.x)
    assert res.loss_history == history
    assert res.fun == rosenbrock(opt.x)[0]


def test_result_fields_count_every_evaluation() -> None:
    res = optex.minimize(rosenbrock, X0, parallelism=4, max_iters=7)
    assert res.nit == 7
    assert len(res.loss_history) == 7
    assert res.n_gradient_evaluations == 7 * 4 + 1  # plus the final loss
    assert res.stop_reason == "max_iters"
    assert res.x.dtype == np.float32 and res.x.shape == X0.shape
    assert "nit=7" in repr(res)


def test_zero_iterations_evaluates_the_start_once() -> None:
    res = optex.minimize(rosenbrock, X0, max_iters=0)
    assert same_bits(res.x, X0)
    assert res.fun == rosenbrock(X0)[0]
    assert res.n_gradient_evaluations == 1
    assert res.nit == 0


def test_target_loss_stops_as_soon_as_it_is_reached() -> None:
    full = optex.minimize(rosenbrock, X0, optimizer=optex.Adam(lr=0.02), max_iters=60)
    target = full.loss_history[20]
    res = optex.minimize(rosenbrock, X0, optimizer=optex.Adam(lr=0.02), max_iters=60,
                         target_loss=target)
    first = next(t for t, loss in enumerate(full.loss_history) if loss <= target)
    assert res.stop_reason == "target_loss"
    assert res.nit == first + 1


def test_grad_tol_stops_on_the_committed_gradient_norm() -> None:
    norms = []
    optex.minimize(rosenbrock, X0, max_iters=20, callback=lambda info: norms.append(info.grad_norm))
    tol = sorted(norms)[len(norms) // 2]
    res = optex.minimize(rosenbrock, X0, max_iters=20, grad_tol=tol)
    assert res.stop_reason == "grad_tol"
    assert res.nit == next(t for t, g in enumerate(norms) if g <= tol) + 1


def test_callbacks_see_every_round_and_can_stop() -> None:
    seen = []
    res = optex.minimize(rosenbrock, X0, max_iters=30,
                         callback=[lambda info: seen.append(info.iteration),
                                   lambda info: info.iteration == 4])
    assert res.stop_reason == "callback"
    assert seen == [1, 2, 3, 4]


def test_seeds_reach_a_stochastic_objective() -> None:
    a = optex.minimize(noisy_sphere, X0, parallelism=3, seed=11, max_iters=8, pass_seed=True)
    b = optex.minimize(noisy_sphere, X0, parallelism=3, seed=11, max_iters=8, pass_seed=True,
                       workers="processes", max_workers=3)
    c = optex.minimize(noisy_sphere, X0, parallelism=3, seed=12, max_iters=8, pass_seed=True)
    assert same_bits(a.x, b.x)  # the same seeds, whichever worker evaluates
    assert not same_bits(a.x, c.x)  # another run seed, other minibatches
    # The seeds are the engine's: an ask/tell loop with them agrees.
    opt = optex.OptEx(X0, parallelism=3, seed=11)
    for _ in range(8):
        points = opt.ask()
        pairs = [noisy_sphere(points[i], int(s)) for i, s in enumerate(opt.seeds)]
        opt.tell(np.array([g for _, g in pairs]), np.array([f for f, _ in pairs]))
    assert same_bits(a.x, opt.x)


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_an_exception_in_the_objective_propagates(workers: str) -> None:
    with pytest.raises(RuntimeError, match="simulation diverged"):
        optex.minimize(fails_far_from_start, X0, optimizer=optex.Adam(lr=0.05), max_iters=50,
                       workers=workers, max_workers=2)


def test_the_target_proxy_uses_the_objective_sequentially() -> None:
    res = optex.minimize(rosenbrock, X0, parallelism=3, proxy="target", max_iters=5)
    opt = optex.OptEx(X0, parallelism=3, proxy="target")
    opt.set_gradient_oracle(rosenbrock)
    for _ in range(5):
        losses, grads = problems.Rosenbrock().value_and_grad(opt.ask())
        opt.tell(grads, losses)
    assert same_bits(res.x, opt.x)


def test_a_progress_bar_only_when_asked_or_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm", reason="tqdm draws the progress bar")
    optex.minimize(rosenbrock, X0, max_iters=3)  # stderr is captured: not a terminal
    assert capsys.readouterr().err == ""
    optex.minimize(rosenbrock, X0, max_iters=3, progress=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "round" in err


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(workers="gpu"), "workers"),
        (dict(max_iters=-1), "max_iters"),
        (dict(max_iters=2.5), "max_iters"),
        (dict(target_loss=math.nan), "target_loss"),
        (dict(grad_tol=-1.0), "grad_tol"),
        (dict(max_workers=0), "max_workers"),
        (dict(parallelism=0), "parallelism"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        optex.minimize(rosenbrock, X0, **kwargs)


def test_a_bad_objective_is_named() -> None:
    with pytest.raises(ValueError, match="fun_and_grad"):
        optex.minimize(42, X0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fun_and_grad.*shape"):
        optex.minimize(wrong_shape, X0, max_iters=1)
    with pytest.raises(TypeError, match="fun_and_grad.*tuple"):
        optex.minimize(not_a_pair, X0, max_iters=1)


# One bad gradient, handed to tell() and returned by a minimize objective: the
# same rule (float32 or float64, shape (d,)) gives the same exception, naming it.
BAD_GRADIENTS = [
    (lambda g: g.astype(np.int64), "dtype int64 is not supported"),
    (lambda g: g.astype(np.float16), "dtype float16 is not supported"),
    (lambda g: g > 0, "dtype bool is not supported"),
    (lambda g: g.astype(np.complex128), "dtype complex128 is not supported"),
    (lambda g: np.array([str(v) for v in g]), "is not supported"),
    (lambda g: g[:-1], "shape"),
    (lambda g: g.reshape(1, -1), "shape"),
]


@pytest.mark.parametrize(("spoil", "complaint"), BAD_GRADIENTS)
def test_minimize_refuses_the_gradients_tell_refuses(spoil, complaint: str) -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, optimizer=optex.Adam(lr=0.01), parallelism=2)
    losses, grads = f.value_and_grad(opt.ask())
    bad_rows = np.stack([grads[0], grads[1]])
    with pytest.raises(Exception) as by_tell:
        opt.tell(np.stack([spoil(g) for g in bad_rows]) if "shape" not in complaint
                 else spoil(grads.ravel()), losses)

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = f.value_and_grad(x[None, :])
        return float(loss[0]), spoil(grad[0])

    with pytest.raises(Exception) as by_minimize:
        optex.minimize(objective, X0, optimizer=optex.Adam(lr=0.01), parallelism=2, max_iters=1)
    assert by_minimize.type is by_tell.type is ValueError
    assert complaint in str(by_tell.value) and "grads" in str(by_tell.value)
    assert complaint in str(by_minimize.value)
    assert "fun_and_grad: the gradient at point 0" in str(by_minimize.value)


def test_a_list_of_ints_is_a_gradient_for_both() -> None:
    # tell() reads lists as float64; so does minimize.
    opt = optex.OptEx(np.zeros(3), optimizer=optex.Sgd(lr=0.1), parallelism=2)
    opt.ask()
    opt.tell([[1, 2, 3], [1, 2, 3]], [0.0, 0.0])
    res = optex.minimize(lambda x: (0.0, [1, 2, 3]), np.zeros(3), optimizer=optex.Sgd(lr=0.1),
                         parallelism=2, max_iters=1)
    assert same_bits(res.x, opt.x)


def test_a_nan_gradient_is_dropped_as_tell_drops_it() -> None:
    # minimize commits with drop_nonfinite=True: the pair never enters the history.
    f = problems.Rosenbrock()
    opt = optex.OptEx(X0, optimizer=optex.Adam(lr=0.01), parallelism=3)
    losses, grads = f.value_and_grad(opt.ask())
    opt.tell(grads, losses)
    points = opt.ask().copy()  # round 2: the points differ
    assert not np.array_equal(points[1], points[0])
    losses, grads = f.value_and_grad(points)
    grads[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"grads: row 1, column 3 is nan"):
        opt.tell(grads, losses)
    info = opt.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == 1

    def spoiled(x: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = f.value_and_grad(x[None, :])
        g = grad[0].copy()
        if np.array_equal(x, points[1]):
            g[3] = np.nan
        return float(loss[0]), g

    res = optex.minimize(spoiled, X0, optimizer=optex.Adam(lr=0.01), parallelism=3, max_iters=2)
    assert same_bits(res.x, opt.x)
