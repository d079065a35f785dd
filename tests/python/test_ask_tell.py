"""The ask/tell protocol as Python sees it: views, properties, reports."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run_iterations

import optex
from optex import problems


def make(d: int = 6, n: int = 4, **kwargs) -> optex.OptEx:
    return optex.OptEx(problems.Rosenbrock().standard_start(d), optimizer=optex.Adam(lr=0.02),
                       parallelism=n, **kwargs)


def test_ask_returns_an_n_by_d_float32_array() -> None:
    opt = make(d=6, n=4)
    points = opt.ask()
    assert isinstance(points, np.ndarray)
    assert points.shape == (4, 6)
    assert points.dtype == np.float32
    assert points.flags.c_contiguous


def test_ask_is_a_view_of_the_engine_batch_not_a_copy() -> None:
    f = problems.Rosenbrock()
    opt = make()
    first = opt.ask()
    again = opt.ask()  # before tell: the same batch, the same memory
    assert first.ctypes.data == again.ctypes.data
    assert np.shares_memory(first, again)
    kept = first.copy()
    losses, grads = f.value_and_grad(first)
    opt.tell(grads, losses)
    second = opt.ask()
    # The next iteration's points are written into the same memory in place:
    # the old array now shows them.
    assert second.ctypes.data == first.ctypes.data
    assert np.array_equal(first, second)
    assert not np.array_equal(first, kept)


def test_the_view_keeps_the_engine_alive() -> None:
    points = make().ask()
    expected = points.copy()
    assert isinstance(points.base, optex.OptEx)
    # The OptEx object is referenced only by the array now.
    import gc

    gc.collect()
    assert np.array_equal(points, expected)


def test_ask_returns_a_read_only_array() -> None:
    opt = make()
    points = opt.ask()
    assert not points.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        points[0, 0] = 1.0
    with pytest.raises(ValueError):
        points.setflags(write=True)
    # A copy is the user's to change.
    mine = np.array(points)
    mine[0, 0] = 1.0


def test_first_point_is_the_iterate_and_tell_commits() -> None:
    f = problems.Rosenbrock()
    opt = make(d=6, n=4)
    x0 = opt.x
    points = opt.ask()
    assert np.array_equal(points[0], x0)
    assert opt.pending
    losses, grads = f.value_and_grad(points)
    info = opt.tell(grads, losses)
    assert not opt.pending
    assert opt.iteration == 1 == info.iteration
    assert opt.evaluations == 4 == info.evaluations
    assert info.committed_point == 3
    assert info.dropped == 0
    assert info.loss == losses[3]
    assert info.best_loss == losses.min()
    assert info.grad_norm == pytest.approx(float(np.linalg.norm(grads[3].astype(np.float64))))
    assert math.isnan(info.cosine)  # the first round predicts nothing
    assert not np.array_equal(opt.x, x0)


def test_x_is_a_copy() -> None:
    opt = make()
    x = opt.x
    x[:] = 0.0
    assert not np.array_equal(opt.x, x)
    assert opt.x.dtype == np.float32


def test_a_run_converges() -> None:
    f = problems.Sphere()
    opt = optex.OptEx(f.standard_start(50), optimizer=optex.Adam(lr=0.05), parallelism=4)
    start = f(opt.x)
    infos = run_iterations(opt, f, 60)
    assert f(opt.x) < 1e-2 * start
    assert infos[-1].cosine > 0.5  # the predictions point the right way


def test_properties() -> None:
    opt = make(d=6, n=3, history=8, seed=5)
    assert opt.dim == 6
    assert opt.parallelism == 3
    assert opt.iteration == 0
    assert opt.evaluations == 0
    assert not opt.pending
    assert opt.options.history == 8
    assert opt.options.seed == 5
    assert opt.optimizer == optex.Adam(lr=0.02)
    assert opt.lengthscale == opt.options.lengthscale
    # Copies: changing them does not change the engine.
    options = opt.options
    options.history = 16
    assert opt.options.history == 8


def test_options_and_keywords_combine() -> None:
    base = optex.Options(parallelism=2, history=10, kernel="rbf")
    opt = optex.OptEx(np.zeros(3), options=base, parallelism=5)
    assert opt.parallelism == 5
    assert opt.options.history == 10
    assert opt.options.kernel == "rbf"
    assert base.parallelism == 2  # the caller's object is not changed


def test_default_optimizer_is_adam_with_torch_defaults() -> None:
    opt = optex.OptEx(np.zeros(3))
    assert opt.optimizer == optex.Adam()
    assert opt.optimizer.lr == 1e-3
    assert opt.options == optex.Options()


def test_optimizer_kind_survives() -> None:
    for optimizer in (optex.Sgd(lr=0.1, momentum=0.9), optex.Adam(lr=0.1), optex.AdamW(lr=0.1)):
        opt = optex.OptEx(np.zeros(3), optimizer=optimizer)
        assert type(opt.optimizer) is type(optimizer)
        assert opt.optimizer == optimizer


def test_seeds_are_the_pending_batch_seeds() -> None:
    opt = make(n=4, seed=3)
    with pytest.raises(RuntimeError, match="call ask"):
        opt.seeds
    opt.ask()
    seeds = opt.seeds
    assert seeds.dtype == np.uint64
    assert seeds.shape == (4,)
    assert len(set(seeds.tolist())) == 4
    # The same seed gives the same seeds.
    other = make(n=4, seed=3)
    other.ask()
    assert np.array_equal(other.seeds, seeds)


def test_predicted_gradient() -> None:
    f = problems.Rosenbrock()
    opt = make(d=6, n=4)
    with pytest.raises(RuntimeError, match="call ask"):
        opt.predicted_gradient(0)
    run_iterations(opt, f, 3)
    points = opt.ask()
    predicted = opt.predicted_gradient(0)
    assert predicted.shape == (6,) and predicted.dtype == np.float32
    _, true = f.value_and_grad(points[0])
    cosine = predicted @ true / (np.linalg.norm(predicted) * np.linalg.norm(true))
    assert cosine > 0.5
    with pytest.raises(IndexError, match="i: 3"):
        opt.predicted_gradient(3)  # the last point has no proxy step from it
    with pytest.raises(IndexError):
        opt.predicted_gradient(-1)


def test_drop_nonfinite_drops_points() -> None:
    f = problems.Sphere()
    opt = make(n=4)
    points = opt.ask()
    losses, grads = f.value_and_grad(points)
    grads[3, 0] = np.nan
    losses[1] = np.inf
    info = opt.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == 2
    assert info.committed_point == 2
    assert opt.iteration == 1


def test_gradient_oracle_drives_target_proxy_steps() -> None:
    f = problems.Sphere()
    calls = []

    def oracle(x):
        assert x.dtype == np.float32 and x.shape == (5,)
        calls.append(x.copy())
        return f.value_and_grad(x)

    opt = optex.OptEx(f.standard_start(5), optimizer=optex.Sgd(lr=0.1), parallelism=3,
                      proxy="target")
    with pytest.raises(RuntimeError, match="gradient oracle"):
        opt.ask()
    opt.set_gradient_oracle(oracle)
    run_iterations(opt, f, 2)
    assert len(calls) == 4  # N - 1 sequential true steps per iteration
    # N * T true SGD steps: x_{k+1} = (1 - 2 lr) x_k in float32.
    expected = f.standard_start(5)
    for _ in range(6):
        expected = expected - np.float32(0.1) * (np.float32(2.0) * expected)
    assert np.allclose(opt.x, expected, rtol=1e-6)
    opt.set_gradient_oracle(None)
    with pytest.raises(RuntimeError, match="gradient oracle"):
        opt.ask()


def test_gradient_oracle_errors_propagate_and_leave_the_engine_unchanged() -> None:
    opt = optex.OptEx(np.ones(4), parallelism=3, proxy="target")

    def broken(x):
        raise KeyError("from the oracle")

    opt.set_gradient_oracle(broken)
    with pytest.raises(KeyError, match="from the oracle"):
        opt.ask()
    assert not opt.pending and opt.iteration == 0
    opt.set_gradient_oracle(lambda x: 1.0)
    with pytest.raises(TypeError, match="must return a tuple"):
        opt.ask()
    opt.set_gradient_oracle(lambda x: (1.0, np.zeros(3)))
    with pytest.raises(ValueError, match=r"expected shape \(4,\)"):
        opt.ask()
    opt.set_gradient_oracle(lambda x: (1.0, np.full(4, np.nan)))
    with pytest.raises(RuntimeError, match="non-finite"):
        opt.ask()
    assert not opt.pending and opt.iteration == 0
    with pytest.raises(TypeError, match="callable"):
        opt.set_gradient_oracle(3)


def test_the_oracle_cannot_reenter_the_engine() -> None:
    opt = optex.OptEx(np.ones(4), parallelism=2, proxy="target")
    opt.set_gradient_oracle(lambda x: (opt.iteration, np.zeros(4)))
    with pytest.raises(RuntimeError, match="busy"):
        opt.ask()


def test_repr() -> None:
    opt = make(d=6, n=3)
    text = repr(opt)
    assert text.startswith("OptEx(dim=6, parallelism=3, iteration=0, pending=False")
    assert "Adam(lr=0.02" in text and "device='cpu'" in text
    f = problems.Sphere()
    info = run_iterations(opt, f, 1)[0]
    assert repr(info).startswith("IterationInfo(iteration=1, evaluations=3, loss=")
    for field in ("best_loss", "grad_norm", "cosine", "lengthscale", "committed_point", "dropped"):
        assert f"{field}=" in repr(info)
