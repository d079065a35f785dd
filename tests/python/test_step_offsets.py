"""Step offsets from Python: a range given as (size, optimizer, step_offset).

A range's optimizer sees the state's step count minus its offset, as a
torch.optim parameter group added later counts its own steps. A range whose
state stayed zero until step k (its gradient was zero) and that joins with
offset k is, bit for bit, a fresh optimizer started k steps later; for the
optimizers that form no coefficient from the step count the offset changes
nothing. Offsets read back wherever ranges do, and one beyond the state's step
is refused with the engine unchanged.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import run_iterations, snapshot

import optex
from optex import problems

D = 5
JOIN = 4  # the step at which range 1 joins
STEPS = 6  # steps after it


def gradient(x: np.ndarray, t: int) -> np.ndarray:
    """A gradient that differs per coordinate and per step (float32)."""
    i = np.arange(x.size)
    return (np.sin(1.3 * x + 0.7 * i) + 0.1 * t * x).astype(np.float32)


JOINING = [
    ("adam", optex.Adam(lr=0.05), optex.Adam(lr=0.1, beta1=0.8)),
    ("adamw", optex.AdamW(lr=0.05, weight_decay=0.0), optex.AdamW(lr=0.1, weight_decay=0.0)),
    ("sgd_momentum", optex.Sgd(lr=0.05, momentum=0.9), optex.Sgd(lr=0.1, momentum=0.8, nesterov=True)),
]


@pytest.mark.parametrize(("name", "first", "second"), JOINING, ids=[c[0] for c in JOINING])
def test_a_range_that_joins_late_is_a_fresh_optimizer_started_later(name, first, second) -> None:
    # Until JOIN, range 1 sees zero gradients: with no weight decay its state stays zero and
    # its coordinates stay put, as a parameter that is not there yet.
    x = np.linspace(-1, 1, D).astype(np.float32)
    state = optex.init_state([(2, first), (3, second)], D)
    x0, s0 = x[:2].copy(), optex.init_state(first, 2)
    for t in range(JOIN):
        g = gradient(x, t)
        g[2:] = 0
        optex.apply_step([(2, first), (3, second)], x, state, g)
        optex.apply_step(first, x0, s0, g[:2])
    assert all(s is None or not s[2:].any() for s in state.slots)
    # Range 1 joins now: its steps count from the state's.
    joined = [(2, first), (3, second, state.step)]
    x1, s1 = x[2:].copy(), optex.init_state(second, 3)
    for t in range(JOIN, JOIN + STEPS):
        g = gradient(x, t)
        optex.apply_step(joined, x, state, g)
        optex.apply_step(first, x0, s0, g[:2])
        optex.apply_step(second, x1, s1, g[2:])
        np.testing.assert_array_equal(x[:2], x0)
        np.testing.assert_array_equal(x[2:], x1)
        for slot, s_first, s_second in zip(state.slots, s0.slots, s1.slots):
            if slot is not None:
                np.testing.assert_array_equal(slot[:2], s_first)
                np.testing.assert_array_equal(slot[2:], s_second)


def test_without_the_offset_adam_would_continue_the_bias_correction() -> None:
    # The same as above at offset 0: range 1's first steps are not a fresh Adam's.
    ranges = [(2, optex.Adam(lr=0.05)), (3, optex.Adam(lr=0.1))]
    x = np.linspace(-1, 1, D).astype(np.float32)
    state = optex.init_state(ranges, D)
    for t in range(JOIN):
        g = gradient(x, t)
        g[2:] = 0
        optex.apply_step(ranges, x, state, g)
    fresh_x, fresh = x[2:].copy(), optex.init_state(optex.Adam(lr=0.1), 3)
    g = gradient(x, JOIN)
    optex.apply_step(ranges, x, state, g)
    optex.apply_step(optex.Adam(lr=0.1), fresh_x, fresh, g[2:])
    assert not np.array_equal(x[2:], fresh_x)


@pytest.mark.parametrize("optimizer", [optex.Sgd(lr=0.1, weight_decay=0.1), optex.RmsProp(lr=0.01),
                                       optex.RmsProp(lr=0.01, momentum=0.5, centered=True),
                                       optex.Lion(lr=0.01, weight_decay=0.1)], ids=repr)
def test_offsets_change_nothing_where_the_step_count_is_not_used(optimizer) -> None:
    plain = [(2, optimizer), (3, optimizer)]
    x = np.linspace(-1, 1, D).astype(np.float32)
    state = optex.init_state(plain, D)
    for t in range(3):
        optex.apply_step(plain, x, state, gradient(x, t))
    y, other = x.copy(), copy.copy(state)
    offset = [(2, optimizer, 1), (3, optimizer, state.step)]
    for t in range(3, 8):
        g = gradient(x, t)
        optex.apply_step(plain, x, state, g)
        optex.apply_step(offset, y, other, g)
        np.testing.assert_array_equal(x, y)
        assert state == other


def test_an_engine_runs_a_late_range_as_a_fresh_adam() -> None:
    # N = 1 is the base optimizer: the engine follows the plain steps, range 1 restarting when
    # set_optimizer gives it the state's step as its offset.
    first, second = optex.Adam(lr=0.05), optex.Adam(lr=0.1, beta1=0.8)
    opt = optex.OptEx(np.linspace(-1, 1, D), optimizer=[(2, first), (3, second)], parallelism=1)
    x0, s0 = opt.x[:2].copy(), optex.init_state(first, 2)
    for t in range(JOIN):
        (point,) = opt.ask()
        g = gradient(point, t)
        g[2:] = 0
        opt.tell(g[None, :], [0.0])
        optex.apply_step(first, x0, s0, g[:2])
    opt.set_optimizer([(2, first), (3, second, JOIN)])
    assert opt.optimizer == [(2, first, 0), (3, second, JOIN)]
    x1, s1 = opt.x[2:].copy(), optex.init_state(second, 3)
    for t in range(JOIN, JOIN + STEPS):
        (point,) = opt.ask()
        g = gradient(point, t)
        opt.tell(g[None, :], [0.0])
        optex.apply_step(first, x0, s0, g[:2])
        optex.apply_step(second, x1, s1, g[2:])
        np.testing.assert_array_equal(opt.x, np.concatenate([x0, x1]))


def engine_at_step_two() -> optex.OptEx:
    """Two Adam ranges, two iterations in: with N = 1 the state's step is the iteration."""
    opt = optex.OptEx(problems.Rosenbrock().standard_start(D), optimizer=[(2, optex.Adam()), (3, optex.Adam())],
                      parallelism=1, seed=4)
    run_iterations(opt, problems.Rosenbrock(), 2)
    return opt


def test_offsets_read_back_as_triples_and_are_taken_back() -> None:
    opt = engine_at_step_two()
    assert opt.optimizer == [(2, optex.Adam()), (3, optex.Adam())]  # pairs while every offset is 0
    step = opt.iteration
    opt.set_optimizer([(2, optex.Adam(), 0), (3, optex.Adam(), step)])
    assert opt.optimizer == [(2, optex.Adam(), 0), (3, optex.Adam(), step)]
    opt.set_optimizer(opt.optimizer)  # taken back as is
    assert opt.optimizer == [(2, optex.Adam(), 0), (3, optex.Adam(), step)]
    assert repr(opt.optimizer) in repr(opt)
    # One range with an offset is a list too: the bare optimizer would lose it.
    single = optex.OptEx(np.zeros(D), optimizer=optex.Lion(), parallelism=1)
    for _ in range(3):
        single.ask()
        single.tell(np.ones((1, D)), [0.0])
    single.set_optimizer([(D, optex.Lion(), 2)])
    assert single.optimizer == [(D, optex.Lion(), 2)]
    single.set_optimizer([(D, optex.Lion(), 0)])
    assert single.optimizer == optex.Lion()


def test_offsets_beyond_the_state_step_are_refused_and_change_nothing() -> None:
    # A new engine's state is at step 0.
    with pytest.raises(ValueError, match=r"^optimizer ranges: range 1 has step_offset 1, beyond the "
                                         r"optimizer state's step 0"):
        optex.OptEx(np.zeros(D), optimizer=[(2, optex.Adam()), (3, optex.Adam(), 1)])
    opt = engine_at_step_two()
    step = opt.iteration
    before, ranges = snapshot(opt), opt.optimizer
    for offset in (step + 1, 2**62):
        with pytest.raises(ValueError, match=rf"range 0 has step_offset {offset}, beyond the optimizer "
                                             rf"state's step {step}"):
            opt.set_optimizer([(2, optex.Adam(), offset), (3, optex.Adam())])
        assert snapshot(opt) == before
        assert opt.optimizer == ranges
    # apply_step refuses before writing anything.
    state = optex.init_state([(2, optex.Adam()), (3, optex.Adam())], D)
    x = np.ones(D, dtype=np.float32)
    with pytest.raises(ValueError, match="range 1 has step_offset 1, beyond the optimizer state's step 0"):
        optex.apply_step([(2, optex.Adam()), (3, optex.Adam(), 1)], x, state, np.ones(D))
    assert state == optex.init_state([(2, optex.Adam()), (3, optex.Adam())], D)
    np.testing.assert_array_equal(x, np.ones(D, dtype=np.float32))
