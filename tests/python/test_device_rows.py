"""Zero-copy rows (optex.DeviceArray over DLPack) and set_optimizer.

On a CPU engine the rows are host memory, so numpy.from_dlpack consumes them
here; tests/python/test_cuda.py checks the same arrays on a GPU.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import optex


def quadratic(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Losses and gradients of sum((x - 0.5)^2) at each row."""
    diff = points.astype(np.float64) - 0.5
    return (diff**2).sum(axis=1), (2.0 * diff).astype(np.float32)


def make(n: int = 3, d: int = 6, **kwargs) -> optex.OptEx:
    x0 = np.linspace(-1.0, 1.0, d, dtype=np.float32)
    return optex.OptEx(x0, optex.Adam(lr=0.05), parallelism=n, seed=3, **kwargs)


def test_device_points_are_the_batch_rows_without_a_copy() -> None:
    engine = make()
    rows = engine.device_points()
    assert rows.shape == (3, 6) and rows.device == "cpu" and not rows.writable
    assert rows.__dlpack_device__() == (1, 0)
    wrapped = np.from_dlpack(rows)
    asked = engine.ask()
    assert wrapped.shape == (3, 6) and wrapped.dtype == np.float32
    assert wrapped.ctypes.data == asked.ctypes.data
    np.testing.assert_array_equal(wrapped, asked)
    # DLPack 1.0 consumers see the points read-only, the gradient rows writable.
    assert not wrapped.flags.writeable
    engine_rows = np.from_dlpack(engine.device_grads())
    assert engine_rows.flags.writeable
    assert "DeviceArray(shape=(3, 6), device='cpu', writable=False)" in repr(rows)


def test_tell_device_equals_tell_bit_for_bit() -> None:
    by_rows, by_arrays = make(history=5), make(history=5)
    for _ in range(6):
        points = np.from_dlpack(by_rows.device_points())
        losses, grads = quadratic(points)
        np.from_dlpack(by_rows.device_grads())[...] = grads
        info = by_rows.tell_device(losses)

        losses2, grads2 = quadratic(by_arrays.ask())
        info2 = by_arrays.tell(grads2, losses2)
        assert by_rows.x.tobytes() == by_arrays.x.tobytes()
        assert info.loss == info2.loss and info.dropped == info2.dropped == 0
    x = np.from_dlpack(by_rows.device_x())
    assert x.shape == (6,) and x.tobytes() == by_rows.x.tobytes()


def test_the_rows_keep_the_engine_alive() -> None:
    engine = make()
    wrapped = np.from_dlpack(engine.device_points())
    expected = np.array(wrapped)
    del engine
    gc.collect()
    np.testing.assert_array_equal(wrapped, expected)


def test_device_grads_needs_a_pending_batch() -> None:
    engine = make()
    with pytest.raises(RuntimeError, match="device_grads: no pending batch"):
        engine.device_grads()
    with pytest.raises(RuntimeError, match="tell_device: no pending batch"):
        engine.tell_device(np.zeros(3))
    engine.ask()
    grads = engine.device_grads()
    assert grads.writable and grads.shape == (3, 6)


def test_tell_device_refuses_bad_losses_and_non_finite_rows_and_changes_nothing() -> None:
    engine = make()
    twin = make()
    points = np.from_dlpack(engine.device_points())
    twin.ask()
    losses, grads = quadratic(points)
    rows = np.from_dlpack(engine.device_grads())
    rows[...] = grads
    with pytest.raises(ValueError, match=r"losses: expected shape \(3,\)"):
        engine.tell_device(np.zeros(4))
    with pytest.raises(ValueError, match="losses"):
        engine.tell_device([0.0, float("nan"), 1.0])
    rows[1, 4] = np.inf
    with pytest.raises(ValueError, match="grads: the gradient rows of points 1 .*drop_nonfinite"):
        engine.tell_device(losses)
    assert engine.pending and engine.iteration == 0
    assert engine.x.tobytes() == twin.x.tobytes()
    info = engine.tell_device(losses, drop_nonfinite=True)
    assert info.dropped == 1 and engine.iteration == 1


def test_dlpack_arguments_are_checked() -> None:
    rows = make().device_points()
    with pytest.raises(BufferError, match="copy"):
        rows.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="dl_device"):
        rows.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="stream"):
        rows.__dlpack__(stream="default")
    assert '"dltensor_versioned"' in repr(rows.__dlpack__(stream=None, max_version=(1, 0), dl_device=(1, 0)))
    assert '"dltensor"' in repr(rows.__dlpack__())  # consumers of DLPack < 1.0


# ---------------------------------------------------------------------------- set_optimizer


def test_set_optimizer_with_parallelism_one_is_the_scheduled_optimizer() -> None:
    """N = 1: the engine under a schedule is plain SGD under that schedule (float32 arithmetic)."""
    engine = make(n=1, d=4)
    engine.set_optimizer(optex.Adam(lr=0.05))  # the same kind: accepted
    sgd_engine = optex.OptEx(np.linspace(-1.0, 1.0, 4, dtype=np.float32), optex.Sgd(lr=0.1), parallelism=1)
    x = np.linspace(-1.0, 1.0, 4, dtype=np.float32)
    for t in range(6):
        lr = 0.1 * 0.5 ** (t // 2)
        sgd_engine.set_optimizer(optex.Sgd(lr=lr))
        losses, grads = quadratic(sgd_engine.ask())
        sgd_engine.tell(grads, losses)
        x = (x - np.float32(lr) * (2.0 * (x.astype(np.float64) - 0.5)).astype(np.float32)).astype(np.float32)
        np.testing.assert_allclose(sgd_engine.x, x, rtol=0, atol=1e-6)
    assert sgd_engine.optimizer == optex.Sgd(lr=0.025)


def test_set_optimizer_refusals_name_the_setting_and_change_nothing(tmp_path) -> None:
    engine = optex.OptEx(np.ones(4, np.float32), optex.Sgd(lr=0.1), parallelism=2)
    with pytest.raises(ValueError, match="optimizer: adam cannot replace sgd"):
        engine.set_optimizer(optex.Adam())
    with pytest.raises(ValueError, match="momentum: 0.9 cannot replace 0"):
        engine.set_optimizer(optex.Sgd(lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match="lr"):
        engine.set_optimizer(optex.Sgd(lr=-1.0))
    with pytest.raises(TypeError, match="optimizer"):
        engine.set_optimizer("sgd")
    adam = optex.OptEx(np.ones(4, np.float32), optex.Adam(), parallelism=2)
    with pytest.raises(ValueError, match="decoupled_weight_decay: AdamW cannot replace Adam"):
        adam.set_optimizer(optex.AdamW())
    assert engine.optimizer == optex.Sgd(lr=0.1)
    engine.ask()
    with pytest.raises(RuntimeError, match="between ask\\(\\) and tell\\(\\)"):
        engine.set_optimizer(optex.Sgd(lr=0.01))
    assert engine.optimizer == optex.Sgd(lr=0.1)


def test_a_checkpoint_keeps_the_values_in_force(tmp_path) -> None:
    engine = make()
    engine.set_optimizer(optex.Adam(lr=0.01))
    losses, grads = quadratic(engine.ask())
    engine.tell(grads, losses)
    engine.save(tmp_path / "run.ckpt")
    assert optex.OptEx.load(tmp_path / "run.ckpt").optimizer == optex.Adam(lr=0.01)
