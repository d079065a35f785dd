"""Hyperparameters per range and the explicit optimizer state: every refusal.

The same parser reads an optimizer or a list of (size, optimizer) pairs (or
(size, optimizer, step_offset) triples) for
OptEx(optimizer=...), set_optimizer, init_state and apply_step, so every bad
specification below is tried on all four. Each refusal must raise the
documented exception and change nothing: the engine's iterate, counters and
optimizer, or apply_step's x array and state, bit for bit.
"""

from __future__ import annotations

import copy
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import run_iterations, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optex
from optex import problems

D = 5
CLASSES = (r"optex.Sgd, optex.Adam, optex.AdamW, optex.RmsProp or optex.Lion")
GOOD_RANGES = [(2, optex.Adam(lr=0.02)), (3, optex.AdamW(lr=0.01))]


def ranged_engine(ranges=None, n: int = 3, iterations: int = 2) -> optex.OptEx:
    """An engine some iterations in, with nothing pending."""
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(D), optimizer=GOOD_RANGES if ranges is None else ranges,
                      parallelism=n, seed=4)
    run_iterations(opt, f, iterations)
    return opt


def frozen(opt: optex.OptEx) -> tuple:
    """What a refused call must leave as it was (repr: the hyperparameters' exact values)."""
    return (*snapshot(opt), repr(opt.optimizer))


def state_bytes(state: optex.OptimizerState) -> tuple:
    return (state.step, *(None if s is None else s.tobytes() for s in state.slots))


def stepped_state(spec, dim: int = D) -> optex.OptimizerState:
    """A state one step in, so that a write would show."""
    state = optex.init_state(spec, dim)
    optex.apply_step(spec, np.linspace(-1, 1, dim).astype(np.float32), state,
                     np.linspace(0.5, 1.5, dim))
    return state


# ---- bad specifications, for every entry point --------------------------------------


def generator():
    yield (D, optex.Adam())


BAD_SPECS = [
    # Not an optimizer, nor a list or tuple of pairs.
    (lambda: "adam", TypeError, rf"^optimizer: expected {CLASSES}, got str$"),
    (lambda: optex.Adam, TypeError, rf"^optimizer: expected {CLASSES}, got "),
    (lambda: {D: optex.Adam()}, TypeError, "^optimizer: expected .* got dict$"),
    (lambda: 3, TypeError, "^optimizer: expected .* got int$"),
    # Generators and other iterables are not read: a clear TypeError, nothing consumed.
    (generator, TypeError, "^optimizer: expected .* got generator$"),
    (lambda: iter(GOOD_RANGES), TypeError, "^optimizer: expected .* got list_iterator$"),
    (lambda: np.array([D]), TypeError, "^optimizer: expected .* got ndarray$"),
    # Entries that are not (size, optimizer) pairs or (size, optimizer, step_offset) triples.
    (lambda: [optex.Adam()], TypeError,
     r"^optimizer\[0\]: expected a \(size, optimizer\) pair or a \(size, optimizer, step_offset\) "
     r"triple, got Adam\(lr=0.001"),
    (lambda: [(D,)], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair or .*, got \(5,\)$"),
    (lambda: [(D, optex.Adam(), 0, 1)], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair"),
    (lambda: [[(D, optex.Adam())]], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair"),
    (lambda: [(2, optex.Adam()), optex.Adam()], TypeError, r"^optimizer\[1\]: expected a \(size"),
    (lambda: ["ab"], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair or .*, got 'ab'$"),
    (lambda: [None], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair or .*, got None$"),
    (lambda: [np.array([D, 0])], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair"),
    (lambda: [{D: optex.Adam()}], TypeError, r"^optimizer\[0\]: expected a \(size, optimizer\) pair"),
    (lambda: [(x for x in (D, optex.Adam()))], TypeError, r"^optimizer\[0\]: expected a \(size"),
    # Sizes that are not ints (bool and numpy.bool_ refused, floats refused even when whole).
    (lambda: [(5.0, optex.Adam())], TypeError, r"^optimizer\[0\]: the size must be an int, got 5.0$"),
    (lambda: [("5", optex.Adam())], TypeError, r"^optimizer\[0\]: the size must be an int, got '5'$"),
    (lambda: [(None, optex.Adam())], TypeError, r"^optimizer\[0\]: the size must be an int, got None$"),
    (lambda: [(True, optex.Adam()), (4, optex.Adam())], TypeError,
     r"^optimizer\[0\]: the size must be an int, got True$"),
    (lambda: [(4, optex.Adam()), (False, optex.Adam())], TypeError,
     r"^optimizer\[1\]: the size must be an int, got False$"),
    (lambda: [(np.bool_(True), optex.Adam()), (4, optex.Adam())], TypeError,
     r"^optimizer\[0\]: the size must be an int"),
    (lambda: [(np.float64(5), optex.Adam())], TypeError, r"^optimizer\[0\]: the size must be an int"),
    (lambda: [((5,), optex.Adam())], TypeError, r"^optimizer\[0\]: the size must be an int, got \(5,\)$"),
    (lambda: [(2, optex.Adam()), (3 + 0j, optex.Adam())], TypeError,
     r"^optimizer\[1\]: the size must be an int"),
    # Step offsets that are not ints, or below zero (one beyond the state's step is refused
    # where there is a state: test_step_offsets.py).
    (lambda: [(2, optex.Adam()), (3, optex.Adam(), 1.0)], TypeError,
     r"^optimizer\[1\]: the step_offset must be an int, got 1.0$"),
    (lambda: [(D, optex.Adam(), True)], TypeError, r"^optimizer\[0\]: the step_offset must be an int, got True$"),
    (lambda: [(D, optex.Adam(), None)], TypeError, r"^optimizer\[0\]: the step_offset must be an int"),
    (lambda: [(D, optex.Adam(), "0")], TypeError, r"^optimizer\[0\]: the step_offset must be an int"),
    (lambda: [(2, optex.Adam(), 0), (3, optex.Adam(), -1)], ValueError,
     r"^optimizer\[1\]: the step_offset must be >= 0, got -1$"),
    (lambda: [(D, optex.Adam(), -(2**70))], ValueError, r"^optimizer\[0\]: the step_offset must be >= 0"),
    (lambda: [(D, optex.Adam(), 2**63)], ValueError,
     r"^optimizer\[0\]: the step_offset 9223372036854775808 is larger than any step count$"),
    # Optimizers that are not optimizers.
    (lambda: [(D, "adam")], TypeError, rf"^optimizer\[0\]'s optimizer: expected {CLASSES}, got str$"),
    (lambda: [(D, None)], TypeError, r"^optimizer\[0\]'s optimizer: expected .* got NoneType$"),
    (lambda: [(D, optex.Adam)], TypeError, r"^optimizer\[0\]'s optimizer: expected "),
    (lambda: [(D, [optex.Adam()])], TypeError, r"^optimizer\[0\]'s optimizer: expected .* got list$"),
    (lambda: [(D, (2, optex.Adam()))], TypeError, r"^optimizer\[0\]'s optimizer: expected .* got tuple$"),
    (lambda: [(2, optex.Adam()), (3, optex.Options())], TypeError,
     r"^optimizer\[1\]'s optimizer: expected .* got Options$"),
    # No range.
    (lambda: [], ValueError, "^optimizer ranges: need at least one range, got none$"),
    (lambda: (), ValueError, "^optimizer ranges: need at least one range, got none$"),
    # Sizes out of range.
    (lambda: [(0, optex.Adam()), (D, optex.Adam())], ValueError,
     r"^optimizer\[0\]: the size must be >= 1, got 0$"),
    (lambda: [(D, optex.Adam()), (-1, optex.Adam())], ValueError,
     r"^optimizer\[1\]: the size must be >= 1, got -1$"),
    (lambda: [(-(2**70), optex.Adam())], ValueError,
     r"^optimizer\[0\]: the size must be >= 1, got -1180591620717411303424$"),
    (lambda: [(2**63, optex.Adam())], ValueError,
     r"^optimizer\[0\]: the size 9223372036854775808 is larger than any dimension$"),
    (lambda: [(2, optex.Adam()), (10**30, optex.Adam())], ValueError,
     r"^optimizer\[1\]: the size 10{30} is larger than any dimension$"),
    (lambda: [(2**63 - 1, optex.Adam())], ValueError,
     "^optimizer ranges: the sizes add up to 9223372036854775807, but the dimension is 5$"),
    # Sizes whose sum wraps around 2**64 to d: refused, not a range past the end of x.
    (lambda: [(2**63 - 1, optex.Adam()), (2**63 - 1, optex.Adam()), (7, optex.Adam())], ValueError,
     "^optimizer ranges: the sizes add up to more than 18446744073709551615, but the dimension "
     "is 5$"),
    (lambda: [(2, optex.Adam())] + [(2**63 - 1, optex.Adam())] * 4 + [(3, optex.Adam())], ValueError,
     "^optimizer ranges: the sizes add up to more than 18446744073709551615"),
    # Sizes that do not add up to d.
    (lambda: [(2, optex.Adam()), (2, optex.Adam())], ValueError,
     "^optimizer ranges: the sizes add up to 4, but the dimension is 5$"),
    (lambda: [(3, optex.Adam()), (3, optex.Adam())], ValueError,
     "^optimizer ranges: the sizes add up to 6, but the dimension is 5$"),
    (lambda: [(1, optex.Adam())] * 6, ValueError, "the sizes add up to 6, but the dimension is 5$"),
    # Mixed kinds (Adam and AdamW are one kind: see the accepted specs).
    (lambda: [(2, optex.Adam()), (3, optex.Sgd())], ValueError,
     r"^optimizer ranges: range 1 is sgd but range 0 is adam \(every range shares one optimizer "
     r"kind and one state layout\)$"),
    (lambda: [(2, optex.AdamW()), (1, optex.Adam()), (2, optex.Lion())], ValueError,
     "^optimizer ranges: range 2 is lion but range 0 is adam"),
    (lambda: [(2, optex.RmsProp()), (3, optex.Lion())], ValueError, "range 1 is lion but range 0 is rmsprop"),
    # Hyperparameters beyond float32, where the steps would see infinity.
    (lambda: [(2, optex.Sgd(lr=1e39)), (3, optex.Sgd())], ValueError,
     r"^lr: must be at most 3.40282e\+38, the largest float32 \(the steps run in float32\), got 1e\+39$"),
    (lambda: [(D, optex.Lion(weight_decay=1.7976931348623157e308))], ValueError, "^weight_decay: must be at most"),
]
BAD_IDS = [f"spec{i}" for i in range(len(BAD_SPECS))]


@pytest.mark.parametrize(("spec", "error", "message"), BAD_SPECS, ids=BAD_IDS)
def test_bad_spec_in_the_constructor(spec, error, message) -> None:
    with pytest.raises(error, match=message):
        optex.OptEx(np.zeros(D), optimizer=spec())


@pytest.mark.parametrize(("spec", "error", "message"), BAD_SPECS, ids=BAD_IDS)
def test_bad_spec_in_set_optimizer_changes_nothing(spec, error, message) -> None:
    opt = ranged_engine()
    before = frozen(opt)
    optimizer = opt.optimizer
    with pytest.raises(error, match=message):
        opt.set_optimizer(spec())
    assert frozen(opt) == before
    assert opt.optimizer == optimizer


@pytest.mark.parametrize(("spec", "error", "message"), BAD_SPECS, ids=BAD_IDS)
def test_bad_spec_in_init_state(spec, error, message) -> None:
    with pytest.raises(error, match=message):
        optex.init_state(spec(), D)


@pytest.mark.parametrize(("spec", "error", "message"), BAD_SPECS, ids=BAD_IDS)
def test_bad_spec_in_apply_step_writes_nothing(spec, error, message) -> None:
    state = stepped_state(optex.Adam())
    x = np.linspace(-1, 1, D).astype(np.float32)
    before = (x.tobytes(), state_bytes(state))
    with pytest.raises(error, match=message):
        optex.apply_step(spec(), x, state, np.ones(D))
    assert (x.tobytes(), state_bytes(state)) == before


def test_a_refused_generator_is_not_consumed() -> None:
    pairs = generator()
    with pytest.raises(TypeError, match="got generator"):
        optex.OptEx(np.zeros(D), optimizer=pairs)
    assert next(pairs)[0] == D


def test_hyperparameters_that_cannot_exist_cannot_reach_a_range() -> None:
    # Every optimizer value is valid: NaN, inf or a negative rate is refused where
    # the value is made or set, so a list of ranges never holds one.
    for bad in (math.nan, math.inf, -math.inf, -1.0, -1e-300):
        with pytest.raises(ValueError, match="^lr: must be finite and >= 0"):
            [(2, optex.Adam()), (3, optex.Adam(lr=bad))]  # noqa: B018
    adam = optex.Adam()
    ranges = [(2, optex.Adam()), (3, adam)]
    with pytest.raises(ValueError, match="^eps: must be finite and >= 0, got nan$"):
        adam.eps = math.nan
    assert optex.OptEx(np.zeros(D), optimizer=ranges).optimizer == [(2, optex.Adam()), (3, optex.Adam())]


def test_a_range_at_lr_zero_stays_while_the_others_move() -> None:
    """A range whose schedule is at lr 0 (a frozen head, a warmup that starts later) keeps
    its coordinates bit for bit through rounds of N points, while its Adam state advances;
    set_optimizer moves each range's lr from and to 0."""
    x0 = np.linspace(-1.0, 1.0, D)
    engine = optex.OptEx(x0, optimizer=[(2, optex.Adam(lr=0.05)), (D - 2, optex.Adam(lr=0.0))],
                         parallelism=3, seed=1)
    start = engine.x.copy()
    for t in range(6):
        if t == 3:  # the frozen range starts, the other one stops
            engine.set_optimizer([(2, optex.Adam(lr=0.0)), (D - 2, optex.Adam(lr=0.05))])
            held = engine.x.copy()
        points = engine.ask()
        engine.tell(2.0 * (points - 0.3), np.sum((points - 0.3) ** 2, axis=1))
        if t < 3:
            assert engine.x[2:].tobytes() == start[2:].tobytes()
            assert not np.array_equal(engine.x[:2], start[:2])
        else:
            assert engine.x[:2].tobytes() == held[:2].tobytes()
    assert not np.array_equal(engine.x[2:], start[2:])
    exp_avg_sq = engine.state_arrays()["slots"]["exp_avg_sq"]
    assert np.all(exp_avg_sq > 0)  # the moments advanced while lr was 0, in both ranges


# ---- accepted specifications ----------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # Lists or tuples, of tuples or lists.
        (lambda: [(2, optex.Adam()), (3, optex.AdamW())], [(2, optex.Adam()), (3, optex.AdamW())]),
        (lambda: ((2, optex.Adam()), (3, optex.AdamW())), [(2, optex.Adam()), (3, optex.AdamW())]),
        (lambda: [[2, optex.Sgd()], [3, optex.Sgd(momentum=0.5)]],
         [(2, optex.Sgd()), (3, optex.Sgd(momentum=0.5))]),
        # Sizes of any integer type but bool.
        (lambda: [(np.int64(2), optex.Lion()), (np.uint8(3), optex.Lion(lr=1e-3))],
         [(2, optex.Lion()), (3, optex.Lion(lr=1e-3))]),
        (lambda: [(np.int32(1), optex.RmsProp())] * 5, [(1, optex.RmsProp())] * 5),
        # One range covering d: the optimizer itself comes back.
        (lambda: [(D, optex.Adam(lr=0.1))], optex.Adam(lr=0.1)),
        (lambda: [(np.int64(D), optex.Sgd())], optex.Sgd()),
        (lambda: optex.RmsProp(centered=True), optex.RmsProp(centered=True)),
        # The extremes of float32, where the steps run, are valid and come back exactly.
        (lambda: [(2, optex.Sgd(lr=3.4028234663852886e38)), (3, optex.Sgd(weight_decay=1e38))],
         [(2, optex.Sgd(lr=3.4028234663852886e38)), (3, optex.Sgd(weight_decay=1e38))]),
        (lambda: [(4, optex.Lion(lr=5e-324, weight_decay=3e38)), (1, optex.Lion())],
         [(4, optex.Lion(lr=5e-324, weight_decay=3e38)), (1, optex.Lion())]),
    ],
)
def test_accepted_specs_and_what_optimizer_returns(spec, expected) -> None:
    opt = optex.OptEx(np.zeros(D), optimizer=spec())
    assert opt.optimizer == expected
    assert type(opt.optimizer) is type(expected)
    # What the property returns is taken back as is.
    assert optex.OptEx(np.zeros(D), optimizer=opt.optimizer).optimizer == expected
    opt.set_optimizer(opt.optimizer)
    assert opt.optimizer == expected
    assert optex.init_state(spec(), D) == optex.init_state(opt.optimizer, D)
    assert repr(expected) in repr(opt)


def test_optimizer_returns_copies() -> None:
    opt = optex.OptEx(np.zeros(D), optimizer=[(2, optex.Sgd()), (3, optex.Sgd())])
    ranges = opt.optimizer
    ranges[0][1].lr = 0.5
    ranges.append((1, optex.Sgd()))
    assert opt.optimizer == [(2, optex.Sgd()), (3, optex.Sgd())]


# ---- apply_step's x, state and grad ------------------------------------------------------


def read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


X_REFUSALS = [
    (lambda: [0.0] * D, TypeError, "^x: expected a float32 numpy array, got list$"),
    (lambda: None, TypeError, "^x: expected a float32 numpy array, got NoneType$"),
    (lambda: np.zeros(D), ValueError,
     r"^x: must be a writable, C-contiguous float32 array of shape \(d,\), updated in place; "
     r"got dtype float64 shape \(5,\)$"),
    (lambda: np.zeros(D, np.float16), ValueError, r"got dtype float16 shape \(5,\)$"),
    (lambda: np.zeros(D, ">f4"), ValueError, r"got dtype >f4 shape \(5,\)$"),
    (lambda: read_only(np.zeros(D, np.float32)), ValueError, r"got dtype float32 shape \(5,\)$"),
    (lambda: np.zeros(2 * D, np.float32)[::2], ValueError, r"got dtype float32 shape \(5,\)$"),
    (lambda: np.zeros(D, np.float32)[::-1], ValueError, r"got dtype float32 shape \(5,\)$"),
    (lambda: np.zeros((1, D), np.float32), ValueError, r"got dtype float32 shape \(1, 5\)$"),
    (lambda: np.zeros((D, 1), np.float32), ValueError, r"got dtype float32 shape \(5, 1\)$"),
    (lambda: np.array(1.0, np.float32), ValueError, r"got dtype float32 shape \(\)$"),
    (lambda: np.zeros(D + 1, np.float32), ValueError,
     "^apply_step: the state's slot 0 has 5 coordinates, the dimension is 6$"),
    (lambda: np.zeros(D - 1, np.float32), ValueError,
     "^apply_step: the state's slot 0 has 5 coordinates, the dimension is 4$"),
]


@pytest.mark.parametrize(("make_x", "error", "message"), X_REFUSALS)
def test_bad_x_writes_nothing(make_x, error, message) -> None:
    spec = optex.Adam(lr=0.1)
    state = stepped_state(spec)
    x = make_x()
    x_before = copy.deepcopy(x)
    before = state_bytes(state)
    grad = np.ones(np.shape(x)[0] if np.ndim(x) == 1 else D)
    with pytest.raises(error, match=message):
        optex.apply_step(spec, x, state, grad)
    assert state_bytes(state) == before
    if isinstance(x, np.ndarray):
        assert x.tobytes() == x_before.tobytes() and x.dtype == x_before.dtype


def test_a_numpy_view_is_updated_in_place() -> None:
    base = np.zeros(2 * D, np.float32)
    view = base[D:]  # C-contiguous and writable: accepted, the base sees the step
    optex.apply_step(optex.Sgd(lr=0.5), view, optex.init_state(optex.Sgd(), D), np.ones(D))
    assert np.array_equal(base, [0.0] * D + [-0.5] * D)


OVERLAP_OPTIMIZERS = [
    optex.Sgd(lr=0.1, momentum=0.5, nesterov=True, weight_decay=0.5),
    optex.Adam(lr=0.1, weight_decay=0.5),
    optex.AdamW(lr=0.1, weight_decay=0.5),
    optex.RmsProp(lr=0.1, weight_decay=0.3, momentum=0.5, centered=True),
    optex.Lion(lr=0.1, weight_decay=0.5),
    [(17, optex.Sgd(lr=0.1)), (20, optex.Sgd(lr=0.3, weight_decay=0.1))],
]


@pytest.mark.parametrize("spec", OVERLAP_OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("overlap", ["same array", "grad ahead", "grad behind"])
def test_a_grad_that_overlaps_x_is_read_before_x_is_written(spec, overlap) -> None:
    # The gradient of 0.5 |x|^2 is x itself: apply_step(opt, x, state, x) must be the
    # step with the gradient x had before the call, as for any overlap of the two.
    d = 37
    buf = np.linspace(-1, 1, d + 1).astype(np.float32)
    x, grad = {"same array": (buf[:d], buf[:d]), "grad ahead": (buf[:d], buf[1:]),
               "grad behind": (buf[1:], buf[:d])}[overlap]
    expected_x, expected_grad = x.copy(), grad.copy()
    state, expected_state = optex.init_state(spec, d), optex.init_state(spec, d)
    for _ in range(3):
        expected_grad = grad.copy()
        optex.apply_step(spec, expected_x, expected_state, expected_grad)
        optex.apply_step(spec, x, state, grad)
        assert x.tobytes() == expected_x.tobytes()
        assert state == expected_state
        expected_x = x.copy()  # the next step starts from the shared buffer's values


GRAD_REFUSALS = [
    (lambda: np.ones(D - 1), r"^grad: expected shape \(5,\), got \(4,\)$"),
    (lambda: np.ones((1, D)), r"^grad: expected shape \(5,\), got \(1, 5\)$"),
    (lambda: np.ones((D, 1)), r"^grad: expected shape \(5,\), got \(5, 1\)$"),
    (lambda: 1.0, r"^grad: expected shape \(5,\), got \(\)$"),
    (lambda: [1.0] * (D + 1), r"^grad: expected shape \(5,\), got \(6,\)$"),
    (lambda: np.ones(D, np.int64), "^grad: dtype int64 is not supported"),
    (lambda: np.ones(D, bool), "^grad: dtype bool is not supported"),
    (lambda: np.ones(D, np.float16), "^grad: dtype float16 is not supported"),
    (lambda: None, "^grad: dtype object is not supported"),
    (lambda: ["a"] * D, r"^grad: must hold real numbers, got 'a' \(str\) at index \(0,\)$"),
    (lambda: with_value(np.ones(D), 2, math.nan), "^grad: element 2 is nan"),
    (lambda: with_value(np.ones(D, np.float32), 0, math.inf), "^grad: element 0 is inf"),
    (lambda: with_value(np.ones(D), 4, -math.inf), "^grad: element 4 is -inf"),
    (lambda: [1.0, 1.0, math.nan, 1.0, 1.0], "^grad: element 2 is nan"),
    # Finite float64 values that float32 cannot hold: named as tell() names them.
    (lambda: with_value(np.ones(D), 3, 1e39),
     r"^grad: element 3 is 1e\+39, outside the float32 range \(must be finite\)$"),
    (lambda: [1.0, -1e300, 1.0, 1.0, 1.0], r"^grad: element 1 is -1e\+300, outside the float32 range"),
]


def with_value(a: np.ndarray, index: int, value: float) -> np.ndarray:
    a = a.copy()
    a[index] = value
    return a


@pytest.mark.parametrize(("make_grad", "message"), GRAD_REFUSALS)
def test_bad_grad_writes_nothing(make_grad, message) -> None:
    for spec in (optex.Adam(lr=0.1), [(2, optex.Sgd(momentum=0.5)), (3, optex.Sgd())]):
        state = stepped_state(spec)
        x = np.linspace(-1, 1, D).astype(np.float32)
        before = (x.tobytes(), state_bytes(state))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's cast warnings are not the refusal
            with pytest.raises(ValueError, match=message):
                optex.apply_step(spec, x, state, make_grad())
        assert (x.tobytes(), state_bytes(state)) == before


def test_float64_grads_are_rounded_to_float32() -> None:
    grad = np.array([0.1, -1e-40, 3.4028235e38, 1.0 / 3.0, -2.5e-45])  # subnormals, near the max
    for spec in (optex.Sgd(lr=0.5), optex.Adam(lr=0.1), optex.Lion(lr=0.25)):
        x, expected_x = np.ones(D, np.float32), np.ones(D, np.float32)
        state, expected_state = optex.init_state(spec, D), optex.init_state(spec, D)
        optex.apply_step(spec, x, state, grad)
        optex.apply_step(spec, expected_x, expected_state, grad.astype(np.float32))
        assert x.tobytes() == expected_x.tobytes() and state == expected_state


@pytest.mark.parametrize(
    ("spec", "state_spec", "dim"),
    [
        # Another dimension.
        (optex.Adam(), optex.Adam(), D - 1),
        (optex.Adam(), optex.Adam(), D + 1),
        (optex.Lion(), optex.Lion(), 1),
        # Another layout: other slots, fewer slots, more slots.
        (optex.Adam(), optex.Sgd(momentum=0.9), D),
        (optex.Adam(), optex.Lion(), D),
        (optex.Sgd(), optex.Sgd(momentum=0.9), D),
        (optex.Sgd(momentum=0.9), optex.Sgd(), D),
        (optex.RmsProp(), optex.RmsProp(centered=True), D),
        (optex.RmsProp(centered=True), optex.RmsProp(), D),
        (optex.RmsProp(momentum=0.5), optex.RmsProp(centered=True), D),
        (optex.Lion(), optex.RmsProp(momentum=0.5, centered=True), D),
        ([(2, optex.Sgd()), (3, optex.Sgd())], [(2, optex.Sgd()), (3, optex.Sgd(momentum=0.5))], D),
        ([(2, optex.Sgd(momentum=0.5)), (3, optex.Sgd())], optex.Sgd(), D),
        ([(2, optex.RmsProp()), (3, optex.RmsProp(centered=True))], optex.RmsProp(), D),
    ],
)
def test_a_state_of_another_layout_or_dimension_writes_nothing(spec, state_spec, dim) -> None:
    state = stepped_state(state_spec, dim)
    x = np.linspace(-1, 1, D).astype(np.float32)
    before = (x.tobytes(), state_bytes(state))
    message = (f"^apply_step: the state's slot 0 has {dim} coordinates, the dimension is {D}$"
               if dim != D else "^apply_step: the state keeps other slots than the optimizer")
    with pytest.raises(ValueError, match=message):
        optex.apply_step(spec, x, state, np.ones(D))
    assert (x.tobytes(), state_bytes(state)) == before


def test_a_state_of_the_same_layout_is_accepted() -> None:
    # The layout is what counts, not the optimizer that made the state: the union of the
    # ranges' slots is Sgd-with-momentum's single buffer.
    state = optex.init_state(optex.Sgd(momentum=0.9), D)
    x = np.zeros(D, np.float32)
    optex.apply_step([(2, optex.Sgd()), (3, optex.Sgd(momentum=0.5))], x, state, np.ones(D))
    assert state.step == 1


@pytest.mark.parametrize(
    ("state", "error"),
    [(None, TypeError), ("state", TypeError), ((None, None, None), TypeError)],
)
def test_a_state_that_is_not_a_state(state, error) -> None:
    x = np.zeros(D, np.float32)
    with pytest.raises(error, match="incompatible function arguments"):
        optex.apply_step(optex.Sgd(), x, state, np.ones(D))
    assert not x.any()


@pytest.mark.parametrize(
    ("dim", "error", "message"),
    [
        (0, ValueError, "^dim: must be >= 1, got 0$"),
        (-1, TypeError, "incompatible function arguments"),
        (2.0, TypeError, "incompatible function arguments"),
        ("5", TypeError, "incompatible function arguments"),
        (None, TypeError, "incompatible function arguments"),
        (2**64, TypeError, "incompatible function arguments"),
        (D + 1, ValueError, "^optimizer ranges: the sizes add up to 5, but the dimension is 6$"),
    ],
)
def test_bad_init_state_dimensions(dim, error, message) -> None:
    with pytest.raises(error, match=message):
        optex.init_state(GOOD_RANGES, dim)


# ---- set_optimizer with ranges ----------------------------------------------------------


@pytest.mark.parametrize(
    ("ranges", "new", "message"),
    [
        (GOOD_RANGES, optex.Adam(), r"^optimizer ranges: 1 cannot replace 2 \(give one optimizer per "
                                    r"range of the running engine\)$"),
        (GOOD_RANGES, [(5, optex.Adam())], "^optimizer ranges: 1 cannot replace 2"),
        (GOOD_RANGES, [(1, optex.Adam()), (1, optex.Adam()), (3, optex.AdamW())],
         "^optimizer ranges: 3 cannot replace 2"),
        (GOOD_RANGES, [(3, optex.Adam()), (2, optex.AdamW())],
         "^optimizer ranges: range 0 has size 3, the running engine's has 2$"),
        (GOOD_RANGES, [(2, optex.Lion()), (3, optex.Lion())],
         r"^range 0: optimizer: lion cannot replace adam \(the optimizer state differs\); start a "
         r"new engine$"),
        (GOOD_RANGES, [(2, optex.AdamW()), (3, optex.AdamW())],
         "^range 0: decoupled_weight_decay: AdamW cannot replace Adam"),
        (GOOD_RANGES, [(2, optex.Adam()), (3, optex.Adam())],
         "^range 1: decoupled_weight_decay: Adam cannot replace AdamW"),
        ([(2, optex.Sgd()), (3, optex.Sgd(momentum=0.9))], [(2, optex.Sgd(momentum=0.5)),
                                                           (3, optex.Sgd(momentum=0.9))],
         "^range 0: momentum: 0.5 cannot replace 0 "),
        ([(2, optex.Sgd()), (3, optex.Sgd(momentum=0.9))], [(2, optex.Sgd()), (3, optex.Sgd())],
         "^range 1: momentum: 0 cannot replace 0.9 "),
        ([(2, optex.RmsProp()), (3, optex.RmsProp(centered=True))],
         [(2, optex.RmsProp()), (3, optex.RmsProp())], "^range 1: centered: false cannot replace true "),
        ([(2, optex.RmsProp(momentum=0.1)), (3, optex.RmsProp())],
         [(2, optex.RmsProp()), (3, optex.RmsProp())], "^range 0: momentum: 0 cannot replace 0.1 "),
        # An engine made from one optimizer has one range, which any list must match.
        (optex.Adam(), [(2, optex.Adam()), (3, optex.Adam())], "^optimizer ranges: 2 cannot replace 1"),
        (optex.Sgd(), [(D, optex.Sgd(momentum=0.5))], "^momentum: 0.5 cannot replace 0 "),
    ],
)
def test_set_optimizer_keeps_sizes_kinds_and_layouts(ranges, new, message) -> None:
    opt = ranged_engine(ranges)
    before = frozen(opt)
    optimizer = opt.optimizer
    with pytest.raises(ValueError, match=message):
        opt.set_optimizer(new)
    assert frozen(opt) == before
    assert opt.optimizer == optimizer
    run_iterations(opt, problems.Rosenbrock(), 1)  # and it still runs


def test_set_optimizer_between_ask_and_tell_is_refused() -> None:
    f = problems.Rosenbrock()
    opt = ranged_engine()
    points = opt.ask().copy()
    before = frozen(opt)
    optimizer = opt.optimizer
    for new in ([(2, optex.Adam(lr=0.5)), (3, optex.AdamW(lr=0.5))], opt.optimizer,
                [(3, optex.Adam()), (2, optex.Adam())]):
        with pytest.raises(RuntimeError, match=r"^set_optimizer: between ask\(\) and tell\(\) "
                                               r"\(iteration 2\)"):
            opt.set_optimizer(new)
        assert frozen(opt) == before
        assert opt.optimizer == optimizer
    assert np.array_equal(opt.ask(), points)  # the batch is still pending
    losses, grads = f.value_and_grad(points)
    opt.tell(grads, losses)
    opt.set_optimizer([(2, optex.Adam(lr=0.5)), (3, optex.AdamW(lr=0.5))])  # and now it is taken
    assert opt.optimizer == [(2, optex.Adam(lr=0.5)), (3, optex.AdamW(lr=0.5))]


def test_set_optimizer_takes_new_values_per_range() -> None:
    opt = ranged_engine([(2, optex.RmsProp(momentum=0.5)), (3, optex.RmsProp(centered=True))])
    new = [(2, optex.RmsProp(lr=0.5, alpha=0.5, eps=1e-3, weight_decay=0.1, momentum=0.9)),
           (np.int64(3), optex.RmsProp(lr=1e-4, centered=True, momentum=0.0))]
    opt.set_optimizer(new)
    assert opt.optimizer == [(2, new[0][1]), (3, new[1][1])]
    # A single-range engine takes an optimizer or a one-pair list.
    single = ranged_engine(optex.Lion())
    single.set_optimizer([(D, optex.Lion(lr=0.5, weight_decay=1.0))])
    assert single.optimizer == optex.Lion(lr=0.5, weight_decay=1.0)
    single.set_optimizer(optex.Lion(lr=1e-3))
    assert single.optimizer == optex.Lion(lr=1e-3)


# ---- checkpoints ---------------------------------------------------------------------------


def test_a_checkpoint_carries_the_ranges_and_continues_bit_for_bit(tmp_path: Path) -> None:
    f = problems.Rosenbrock()
    ranges = [(1, optex.RmsProp(lr=3e-3, momentum=0.5, centered=True)),
              (2, optex.RmsProp(lr=1e-2, alpha=0.9, weight_decay=0.01)),
              (2, optex.RmsProp(lr=1e-3, eps=1e-6, momentum=0.2))]
    opt = ranged_engine(ranges, n=4, iterations=3)
    opt.set_optimizer([(1, ranges[0][1]), (2, optex.RmsProp(lr=5e-3)), (2, ranges[2][1])])
    in_force = opt.optimizer
    opt.save(tmp_path / "run.ckpt")
    expected = [(info.loss, opt.x.tobytes()) for info in run_iterations(opt, f, 5)]
    restored = optex.OptEx.load(tmp_path / "run.ckpt")
    assert restored.optimizer == in_force
    assert repr(restored.optimizer) == repr(in_force)
    assert [(info.loss, restored.x.tobytes()) for info in run_iterations(restored, f, 5)] == expected


# ---- property: any valid split round-trips ------------------------------------------------

# Up to the largest float32: the steps run in float32.
UNIT = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
POSITIVE = st.floats(min_value=0.0, exclude_min=True, max_value=3.4028234663852886e38)
NON_NEGATIVE = st.floats(min_value=0.0, max_value=3.4028234663852886e38)


@st.composite
def optimizers_of_kind(draw, kind: str):
    if kind == "sgd":
        momentum = draw(UNIT)
        return optex.Sgd(draw(POSITIVE), momentum, draw(st.booleans()) and momentum > 0,
                         draw(NON_NEGATIVE))
    if kind == "adam":
        cls = draw(st.sampled_from([optex.Adam, optex.AdamW]))
        lr, weight_decay = draw(POSITIVE), draw(NON_NEGATIVE)
        if cls is optex.AdamW and lr * weight_decay >= 1.0:
            weight_decay = 0.0
        return cls(lr, draw(UNIT), draw(UNIT), draw(POSITIVE), weight_decay)
    if kind == "rmsprop":
        return optex.RmsProp(draw(POSITIVE), draw(UNIT), draw(POSITIVE), draw(NON_NEGATIVE),
                             draw(UNIT), draw(st.booleans()))
    lr, weight_decay = draw(POSITIVE), draw(NON_NEGATIVE)
    if lr * weight_decay >= 1.0:
        weight_decay = 0.0
    return optex.Lion(lr, draw(UNIT), draw(UNIT), weight_decay)


@st.composite
def range_splits(draw):
    d = draw(st.integers(min_value=1, max_value=12))
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=d - 1), max_size=d - 1))) if d > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, d])]
    kind = draw(st.sampled_from(["sgd", "adam", "rmsprop", "lion"]))
    ranges = [(size, draw(optimizers_of_kind(kind))) for size in sizes]
    return d, ranges


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(range_splits())
def test_any_valid_split_round_trips(split) -> None:
    d, ranges = split
    expected = ranges[0][1] if len(ranges) == 1 else ranges
    opt = optex.OptEx(np.zeros(d), optimizer=ranges, parallelism=2)
    assert opt.optimizer == expected
    assert repr(opt.optimizer) == repr(expected)  # exact values, not just equal ones
    assert optex.OptEx(np.zeros(d), optimizer=opt.optimizer).optimizer == expected
    assert eval(repr(opt.optimizer), vars(optex)) == expected  # noqa: S307
    opt.set_optimizer(opt.optimizer)  # the same values: always a valid replacement
    assert opt.optimizer == expected
    state = optex.init_state(ranges, d)
    assert state.step == 0
    for slot in state.slots:
        assert slot is None or (slot.shape == (d,) and not slot.any())
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "run.ckpt"
        opt.save(path)
        restored = optex.OptEx.load(path)
    assert restored.optimizer == expected
    assert repr(restored.optimizer) == repr(expected)


def test_none_means_adam_only_in_the_constructor() -> None:
    """OptEx(x0) defaults to Adam; everywhere else None is a mistake, not a default."""
    assert optex.OptEx(np.zeros(D)).optimizer == optex.Adam()
    assert optex.OptEx(np.zeros(D), optimizer=None).optimizer == optex.Adam()
    opt = ranged_engine()
    before = frozen(opt)
    with pytest.raises(TypeError, match=r"^optimizer: expected optex\.Sgd, .* got NoneType$"):
        opt.set_optimizer(None)
    assert frozen(opt) == before
    with pytest.raises(TypeError, match="got NoneType"):
        optex.init_state(None, D)
    x, state = np.ones(D, np.float32), optex.init_state(optex.Adam(), D)
    with pytest.raises(TypeError, match="got NoneType"):
        optex.apply_step(None, x, state, np.ones(D, np.float32))
    assert np.array_equal(x, np.ones(D, np.float32)) and state.step == 0
