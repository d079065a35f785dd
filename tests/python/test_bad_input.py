"""Every bad input raises an exception naming the argument and leaves the engine unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import snapshot

import optex
from optex import problems


def started(n: int = 3, d: int = 5, iterations: int = 2) -> optex.OptEx:
    """An engine some iterations in, with a pending batch."""
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(d), optimizer=optex.Adam(lr=0.02), parallelism=n)
    for _ in range(iterations):
        points = opt.ask()
        losses, grads = f.value_and_grad(points)
        opt.tell(grads, losses)
    opt.ask()
    return opt


# ---- x0 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x0", "error", "message"),
    [
        (np.zeros((2, 3)), ValueError, r"x0: expected a 1-D array of shape \(d,\), got shape \(2, 3\)"),
        (np.float64(1.0), ValueError, r"x0: expected a 1-D array.*got shape \(\)"),
        (np.zeros(0), ValueError, "x0: dimension must be >= 1, got 0"),
        ([], ValueError, "x0: dimension must be >= 1, got 0"),
        (np.array([0.0, np.nan, 1.0]), ValueError, "x0: element 1 is nan"),
        (np.array([0.0, 1.0, -np.inf], dtype=np.float32), ValueError, "x0: element 2 is -inf"),
        (np.array([1e300]), ValueError, "x0: element 0 is 1e\\+300, outside the float32 range"),
        (np.arange(3), ValueError, "x0: dtype int64 is not supported"),
        (np.zeros(3, dtype=np.float16), ValueError, "x0: dtype float16 is not supported"),
        (np.zeros(3, dtype=complex), ValueError, "x0: dtype complex128 is not supported"),
        (["a", "b"], ValueError, r"x0: must hold real numbers, got 'a' \(str\) at index \(0,\)"),
        (["1.0", "2.0"], ValueError, r"x0: must hold real numbers, got '1.0' \(str\)"),
        ([1.0, True], ValueError, r"x0: must hold real numbers, got True \(bool\) at index \(1,\)"),
        ([[1.0], [2.0, 3.0]], ValueError, "x0: cannot be converted to a float array"),
    ],
)
def test_bad_x0(x0, error, message) -> None:
    with pytest.raises(error, match=message):
        optex.OptEx(x0)


def test_x0_conversions() -> None:
    # Lists of ints are fine (a list has no dtype); strided arrays are fine for x0 (copied once).
    assert np.array_equal(optex.OptEx([1, 2, 3]).x, [1, 2, 3])
    strided = np.arange(10, dtype=np.float64)[::2]
    assert np.array_equal(optex.OptEx(strided).x, strided.astype(np.float32))
    assert optex.OptEx(np.array([0.1])).x.dtype == np.float32


# ---- options and optimizers --------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(parallelism=0), r"parallelism: must be in \[1, 65536\], got 0"),
        (dict(parallelism=1_000_000), r"parallelism: must be in \[1, 65536\], got 1000000"),
        (dict(parallelism=65537), r"parallelism: must be in \[1, 65536\], got 65537"),
        (dict(history=0), r"history: must be in \[1, 4096\], got 0"),
        (dict(history=5000), r"history: must be in \[1, 4096\], got 5000"),
        (dict(lengthscale=-1.0), "lengthscale: must be finite and > 0, got -1"),
        (dict(noise=float("nan")), "noise: must be finite and >= 0, got nan"),
        (dict(selection_interval=0), "selection_interval: must be >= 1, got 0"),
        (dict(lengthscale_grid=[1.0, -2.0]), "lengthscale_grid: must be finite and > 0, got -2"),
        (dict(kernel="gaussian"), "kernel: unknown value 'gaussian' \\(expected 'matern12', "
                                  "'matern32', 'matern52' or 'rbf'\\)"),
        (dict(proxy="oracle"), "proxy: unknown value 'oracle' \\(expected 'gp', 'target' or "
                               "'last_gradient'\\)"),
        (dict(input_scaling="unit"), "input_scaling: unknown value 'unit'"),
        (dict(warmup="none"), "warmup: unknown value 'none'"),
        (dict(proxy_distances="exact"), "proxy_distances: unknown value 'exact' \\(expected "
                                        "'direct' or 'coefficients'\\)"),
        (dict(proxy_distances="Direct"), "proxy_distances: unknown value 'Direct'"),
        (dict(proxy_distances=""), "proxy_distances: unknown value ''"),
        (dict(lengthscale_selection="loo"), "lengthscale_selection: unknown value 'loo'"),
        (dict(history_precision="fp16"), "history_precision: unknown value 'fp16'"),
        (dict(history_precision="bf16"), "history_precision: bf16 storage is available on CUDA "
                                         "devices only"),
        (dict(device="gpu"), "device: unknown device 'gpu' \\(expected 'cpu', 'cuda' or "
                             "'cuda:<index>'\\)"),
        (dict(device="cuda:-1"), "device: unknown device 'cuda:-1'"),
        (dict(device="cuda:x"), "device: unknown device 'cuda:x'"),
        (dict(seed=-1), r"seed: must be an integer in \[0, 2\*\*64\), got -1"),
        (dict(seed=2**64), r"seed: must be an integer in \[0, 2\*\*64\)"),
        (dict(parallelism=2**40), "parallelism: 1099511627776 is out of range"),
        # evaluations_per_point (D) must divide parallelism (N, 4 by default).
        (dict(evaluations_per_point=0), r"evaluations_per_point: must divide parallelism \(4\), got 0"),
        (dict(evaluations_per_point=-2), r"evaluations_per_point: must divide parallelism \(4\), got -2"),
        (dict(evaluations_per_point=3), r"evaluations_per_point: must divide parallelism \(4\), got 3"),
        (dict(evaluations_per_point=8), r"evaluations_per_point: must divide parallelism \(4\), got 8"),
        (dict(parallelism=6, evaluations_per_point=4),
         r"evaluations_per_point: must divide parallelism \(6\), got 4"),
        (dict(parallelism=1, evaluations_per_point=2),
         r"evaluations_per_point: must divide parallelism \(1\), got 2"),
        (dict(evaluations_per_point=2**31), "evaluations_per_point: 2147483648 is out of range"),
        (dict(evaluations_per_point=2**64),
         "evaluations_per_point: 18446744073709551616 is out of range"),
        (dict(evaluations_per_point=-(2**63) - 1),
         "evaluations_per_point: -9223372036854775809 is out of range"),
        (dict(evaluations_per_point=10**5000),
         "evaluations_per_point: an int of 16610 bits is out of range"),
        (dict(strategy="random"),
         "strategy: unknown value 'random' \\(expected 'fixed' or 'adaptive'\\)"),
        (dict(strategy="Adaptive"), "strategy: unknown value 'Adaptive'"),
        (dict(continue_from="best"),
         "continue_from: unknown value 'best' \\(expected 'last' or 'best_loss'\\)"),
        (dict(continue_from=""), "continue_from: unknown value ''"),
        # The safeguards: > 0 (>= 1 for max_lengthscale_change), +infinity for off.
        *[(dict([(name, bad)]), rf"{name}: must be > 0 \(\+infinity: off\), got {text}$")
          for name in ("max_posterior_variance", "trust_region")
          for bad, text in ((float("nan"), "nan"), (0.0, "0"), (-0.0, "-0"), (-1.0, "-1"),
                            (-1e-300, "-1e-300"), (float("-inf"), "-inf"), (0, "0"))],
        *[(dict(max_lengthscale_change=bad), rf"max_lengthscale_change: must be >= 1 "
                                             rf"\(\+infinity: off\), got {text}$")
          for bad, text in ((float("nan"), "nan"), (0.999, "0.999"), (0.5, "0.5"), (0.0, "0"),
                            (-2.0, "-2"), (float("-inf"), "-inf"), (0, "0"))],
        *[(dict([(name, 10**400)]), f"{name}: 1{'0' * 400} is out of range")
          for name in ("max_posterior_variance", "trust_region", "max_lengthscale_change")],
    ],
)
def test_bad_options(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        optex.OptEx(np.zeros(3), **kwargs)
    with pytest.raises(ValueError, match=message):
        optex.Options(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(parallelism=2.0), "parallelism: expected an int, got float"),
        (dict(parallelism=True), "parallelism: expected an int, got bool"),
        (dict(lengthscale="0.1"), "lengthscale: expected a float, got str"),
        (dict(kernel=3), "kernel: expected a str, got int"),
        (dict(lengthscale_grid=1.0), "lengthscale_grid: expected a sequence of floats, got float"),
        (dict(learning_rate=0.1), "got an unexpected keyword argument 'learning_rate'"),
        (dict(evaluations_per_point=2.0), "evaluations_per_point: expected an int, got float"),
        (dict(evaluations_per_point=True), "evaluations_per_point: expected an int, got bool"),
        (dict(evaluations_per_point="2"), "evaluations_per_point: expected an int, got str"),
        (dict(evaluations_per_point=None), "evaluations_per_point: expected an int, got NoneType"),
        (dict(strategy=1), "strategy: expected a str, got int"),
        (dict(strategy=None), "strategy: expected a str, got NoneType"),
        (dict(proxy_distances=1), "proxy_distances: expected a str, got int"),
        (dict(proxy_distances=None), "proxy_distances: expected a str, got NoneType"),
        (dict(proxy_distances=b"direct"), "proxy_distances: expected a str, got bytes"),
        (dict(continue_from=b"last"), "continue_from: expected a str, got bytes"),
        (dict(continue_from=["last"]), "continue_from: expected a str, got list"),
        *[(dict([(name, bad)]), f"{name}: expected a float, got {type(bad).__name__}")
          for name in ("max_posterior_variance", "trust_region", "max_lengthscale_change")
          for bad in ("inf", b"1", None, [2.0], complex(2.0, 0.0))],
    ],
)
def test_option_keywords_of_the_wrong_type(kwargs, message) -> None:
    with pytest.raises(TypeError, match=message):
        optex.OptEx(np.zeros(3), **kwargs)
    with pytest.raises(TypeError, match=message.replace("OptEx", "Options")):
        optex.Options(**kwargs)


@pytest.mark.parametrize(
    ("parallelism", "error", "message"),
    [
        (0, ValueError, r"parallelism: must be in \[1, 65536\], got 0"),
        (-2, ValueError, r"parallelism: must be in \[1, 65536\], got -2"),
        (2**40, ValueError, "parallelism: 1099511627776 is out of range"),
        (2.0, TypeError, "parallelism: expected an int, got float"),
        (True, TypeError, "parallelism: expected an int, got bool"),
    ],
)
def test_the_reference_preset_refuses_a_bad_parallelism_at_once(parallelism, error, message) -> None:
    # The same refusal as the field's, from the factory itself, not the first OptEx.
    with pytest.raises(error, match=message):
        optex.Options.reference(parallelism)
    with pytest.raises(error, match=message):
        optex.Options(parallelism=parallelism)
    assert optex.Options.reference(np.int64(3)).parallelism == 3


def test_options_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="options: expected optex.Options or None, got dict"):
        optex.OptEx(np.zeros(3), options={"parallelism": 2})
    with pytest.raises(TypeError, match="optimizer: expected optex.Sgd, optex.Adam, optex.AdamW, optex.RmsProp or optex.Lion, got str"):
        optex.OptEx(np.zeros(3), optimizer="adam")


@pytest.mark.parametrize(
    "kwargs",
    [dict(evaluations_per_point=2), dict(strategy="adaptive"), dict(max_posterior_variance=0.5),
     dict(trust_region=2.0)],
)
@pytest.mark.gpu
def test_every_feature_is_available_on_cuda(kwargs) -> None:
    # Without a GPU only the device is refused; with one, the engine runs rounds.
    if optex.cuda_device_count() == 0:
        with pytest.raises(ValueError, match="^device: cuda:0"):
            optex.OptEx(np.zeros(3), device="cuda", **kwargs)
        return
    opt = optex.OptEx(np.full(3, 0.5), device="cuda", **kwargs)
    for _ in range(4):
        x = opt.ask()
        opt.tell(2.0 * x, np.sum(x * x, axis=1))
    assert np.all(np.isfinite(opt.x)) and opt.iteration == 4


def test_cuda_device_on_a_build_or_machine_without_one() -> None:
    if optex.cuda_device_count() > 0:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ValueError, match="device: cuda:0"):
        optex.OptEx(np.zeros(3), device="cuda")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: optex.Sgd(lr=-1e-300), "lr: must be finite and >= 0, got -1e-300"),
        (lambda: optex.Sgd(lr=float("inf")), "lr: must be finite and >= 0, got inf"),
        (lambda: optex.Sgd(lr=float("nan")), "lr: must be finite and >= 0, got nan"),
        (lambda: optex.Sgd(lr=1e39), r"lr: must be at most 3.40282e\+38"),
        (lambda: optex.Sgd(momentum=-0.5), r"momentum: must be finite and >= 0, got -0.5"),
        (lambda: optex.Sgd(nesterov=True), "momentum: must be > 0 when nesterov is set, got 0"),
        (lambda: optex.Sgd(weight_decay=-1.0), "weight_decay: must be finite and >= 0, got -1"),
        (lambda: optex.Adam(lr=-1e-3), "lr: must be finite and >= 0, got -0.001"),
        (lambda: optex.Adam(beta1=1.0), r"beta1: must be in \[0, 1\), got 1"),
        (lambda: optex.Adam(beta2=-0.1), r"beta2: must be in \[0, 1\), got -0.1"),
        (lambda: optex.Adam(eps=-1e-8), "eps: must be finite and >= 0, got -1e-08"),
        (lambda: optex.AdamW(lr=-1.0), "lr: must be finite and >= 0, got -1"),
        (lambda: optex.RmsProp(alpha=-0.1), "alpha: must be finite and >= 0, got -0.1"),
        (lambda: optex.Lion(lr=-1e-4), "lr: must be finite and >= 0, got -0.0001"),
    ],
)
def test_bad_optimizer_hyperparameters(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_refused_setting_leaves_the_object_unchanged() -> None:
    adam = optex.Adam(lr=0.1)
    with pytest.raises(ValueError, match="beta1"):
        adam.beta1 = 2.0
    assert adam == optex.Adam(lr=0.1)
    options = optex.Options()
    with pytest.raises(ValueError, match="kernel"):
        options.kernel = "nope"
    with pytest.raises(ValueError, match="history"):
        options.history = 0
    assert options == optex.Options()


@pytest.mark.parametrize(
    ("name", "bad", "error"),
    [
        ("evaluations_per_point", 2, ValueError),  # N = 3
        ("evaluations_per_point", 2**64, ValueError),
        ("evaluations_per_point", 1.0, TypeError),
        ("strategy", "greedy", ValueError),
        ("continue_from", None, TypeError),
        ("max_posterior_variance", 0.0, ValueError),
        ("trust_region", float("nan"), ValueError),
        ("max_lengthscale_change", 0.5, ValueError),
        ("max_lengthscale_change", "2", TypeError),
    ],
)
def test_a_refused_option_leaves_a_running_engine_unchanged(name, bad, error) -> None:
    """The engine's options are fixed: OptEx.options is a copy, and a refused change
    of it, or a refused OptEx built from it, leaves the running engine as its twin."""
    opt, twin = started(), started()
    before = snapshot(opt)
    options = opt.options
    with pytest.raises(error, match=f"^{name}: "):
        setattr(options, name, bad)
    assert options == twin.options
    with pytest.raises(error, match=f"^{name}: "):
        optex.OptEx(opt.x, optex.Adam(lr=0.02), options=opt.options, **{name: bad})
    options.trust_region = 0.5  # an accepted change of the copy does not reach the engine either
    assert opt.options == twin.options and opt.options.trust_region == float("inf")
    assert snapshot(opt) == before
    f = problems.Rosenbrock()
    for engine in (opt, twin):
        engine.tell(*good_batch(engine))
        for _ in range(2):
            losses, grads = f.value_and_grad(engine.ask())
            engine.tell(grads, losses)
    assert snapshot(opt) == snapshot(twin)


# ---- tell -----------------------------------------------------------------------


def good_batch(opt: optex.OptEx):
    f = problems.Rosenbrock()
    losses, grads = f.value_and_grad(opt.ask())
    return grads, losses


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda g, l: (g[:, :-1], l), ValueError, r"grads: expected shape \(3, 5\), got \(3, 4\)"),
        (lambda g, l: (g[:2], l), ValueError, r"grads: expected shape \(3, 5\), got \(2, 5\)"),
        (lambda g, l: (g.ravel(), l), ValueError, r"grads: expected shape \(3, 5\), got \(15,\)"),
        (lambda g, l: (g, l[:2]), ValueError, r"losses: expected shape \(3,\), got \(2,\)"),
        (lambda g, l: (g, l.reshape(3, 1)), ValueError, r"losses: expected shape \(3,\), got \(3, 1\)"),
        (lambda g, l: (g, 1.0), ValueError, r"losses: expected shape \(3,\), got \(\)"),
        (lambda g, l: (g.astype(np.int32), l), ValueError, "grads: dtype int32 is not supported"),
        (lambda g, l: (g.astype(np.float16), l), ValueError, "grads: dtype float16 is not supported"),
        (lambda g, l: (g, l.astype(np.int64)), ValueError, "losses: dtype int64 is not supported"),
        (lambda g, l: (g > 0, l), ValueError, "grads: dtype bool is not supported"),
        (lambda g, l: (g.astype(">f4"), l), ValueError, "grads: dtype >f4 is not supported"),
        (lambda g, l: (np.asfortranarray(g), l), ValueError,
         r"grads: the array is not C-contiguous \(strides \(4, 12\)\); pass "
         r"numpy.ascontiguousarray\(grads\)"),
        (lambda g, l: (np.repeat(g, 2, axis=1)[:, ::2], l), ValueError,
         "grads: the array is not C-contiguous"),
        (lambda g, l: (g, np.repeat(l, 2)[::2]), ValueError, "losses: the array is not C-contiguous"),
        (lambda g, l: ([["x"] * 5] * 3, l), ValueError,
         r"grads: must hold real numbers, got 'x' \(str\) at index \(0, 0\)"),
        (lambda g, l: ([[0.0] * 5, [0.0] * 4, [0.0] * 5], l), ValueError,
         "grads: cannot be converted to a float array"),
        (lambda g, l: (None, l), ValueError, "grads: dtype object is not supported"),
        (lambda g, l: (with_value(g, (1, 2), np.nan), l), ValueError,
         r"grads: row 1, column 2 is nan \(must be finite; pass drop_nonfinite=True"),
        (lambda g, l: (with_value(g, (2, 4), -np.inf), l), ValueError,
         "grads: row 2, column 4 is -inf"),
        (lambda g, l: (with_value(g.astype(np.float64), (0, 3), 1e39), l), ValueError,
         "grads: row 0, column 3 is 1e\\+39, outside the float32 range"),
        (lambda g, l: (g, with_value(l, 2, np.nan)), ValueError, "losses: element 2 is nan"),
        (lambda g, l: (g, with_value(l.astype(np.float32), 0, np.inf)), ValueError,
         "losses: element 0 is inf"),
    ],
)
def test_bad_tell_leaves_the_engine_unchanged(mutate, error, message) -> None:
    opt = started()
    before = snapshot(opt)
    points = opt.ask().copy()
    grads, losses = good_batch(opt)
    with pytest.raises(error, match=message):
        opt.tell(*mutate(grads, losses))
    assert snapshot(opt) == before
    assert np.array_equal(opt.ask(), points)  # the same batch is still pending
    # ... and the good batch still commits.
    opt.tell(grads, losses)
    assert opt.iteration == before[1] + 1


def with_value(a: np.ndarray, index, value) -> np.ndarray:
    a = a.copy()
    a[index] = value
    return a


def test_tell_without_ask() -> None:
    opt = started()
    grads, losses = good_batch(opt)
    opt.tell(grads, losses)
    before = snapshot(opt)
    with pytest.raises(RuntimeError, match=r"tell: no pending batch \(iteration 3\): call ask\(\) first"):
        opt.tell(grads, losses)
    assert snapshot(opt) == before
    fresh = optex.OptEx(np.zeros(5), parallelism=3)
    with pytest.raises(RuntimeError, match="call ask"):
        fresh.tell(grads, losses)


def test_all_nonfinite_with_drop_raises_and_keeps_the_batch_pending() -> None:
    opt = started()
    before = snapshot(opt)
    grads, losses = good_batch(opt)
    with pytest.raises(RuntimeError, match="no pair of iteration 2 can be committed"):
        opt.tell(np.full_like(grads, np.nan), losses, drop_nonfinite=True)
    assert snapshot(opt) == before
    opt.tell(grads, losses)


def test_ints_are_refused_but_lists_are_converted() -> None:
    opt = optex.OptEx(np.zeros(2), parallelism=2)
    opt.ask()
    with pytest.raises(ValueError, match="grads: dtype int64"):
        opt.tell(np.zeros((2, 2), dtype=np.int64), [0.0, 0.0])
    info = opt.tell([[1, 2], [3, 4]], [0, 1])  # lists: converted to float64
    assert info.iteration == 1


# ---- checkpoints ----------------------------------------------------------------


def test_save_while_pending(tmp_path) -> None:
    opt = started()
    before = snapshot(opt)
    with pytest.raises(RuntimeError, match="save"):
        opt.save(tmp_path / "x.ckpt")
    assert snapshot(opt) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(device="tpu"), "device: unknown device 'tpu'"),
        (dict(history_precision="fp8"), "history_precision: unknown value 'fp8'"),
    ],
)
def test_bad_load_arguments(tmp_path, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        optex.OptEx.load(tmp_path / "x.ckpt", **kwargs)


def test_path_of_the_wrong_type() -> None:
    opt = optex.OptEx(np.zeros(2))
    with pytest.raises(TypeError):
        opt.save(3)
