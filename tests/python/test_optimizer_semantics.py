"""What the base optimizers compute, through Python, bit for bit.

With N = 1 an OptEx takes exactly the base optimizer's steps (DESIGN.md
section 2): the engine with (size, optimizer) ranges, optex.apply_step with the
same ranges, and each range's slice stepped on its own with its own optimizer
(the updates are per coordinate) must all give the same float32 bits, with or
without a set_optimizer schedule and across a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import optex
from optex import problems

D = 10

RANGE_SPECS = {
    "sgd": [(3, optex.Sgd(lr=2e-4)),
            (4, optex.Sgd(lr=1e-4, momentum=0.9, nesterov=True, weight_decay=0.01)),
            (3, optex.Sgd(lr=5e-5, momentum=0.5))],
    "adam+adamw": [(4, optex.Adam(lr=1e-2, weight_decay=0.1)),
                   (6, optex.AdamW(lr=3e-3, beta1=0.8, weight_decay=0.05))],
    "rmsprop": [(2, optex.RmsProp(lr=1e-3)),
                (5, optex.RmsProp(lr=2e-3, momentum=0.9, centered=True)),
                (3, optex.RmsProp(lr=1e-3, alpha=0.9, eps=1e-6, weight_decay=0.1))],
    "lion": [(5, optex.Lion(lr=1e-3, weight_decay=0.1)),
             (5, optex.Lion(lr=3e-4, beta1=0.95, beta2=0.98))],
    "one per coordinate": [(1, optex.Sgd(lr=1e-4 * (k + 1), momentum=0.1 * k)) for k in range(D)],
    "one range": [(D, optex.RmsProp(lr=1e-3, momentum=0.5, centered=True))],
}
SINGLE_OPTIMIZERS = [
    optex.Sgd(lr=1e-3, momentum=0.9),
    optex.Adam(lr=1e-2),
    optex.AdamW(lr=1e-2, weight_decay=0.1),
    optex.RmsProp(lr=1e-3, centered=True),
    optex.Lion(lr=1e-3),
]


def start() -> np.ndarray:
    return problems.Rosenbrock().standard_start(D).astype(np.float32)


def bounds(ranges) -> list[tuple[int, int]]:
    ends = np.cumsum([size for size, _ in ranges]).tolist()
    return list(zip([0, *ends[:-1]], ends))


def gradient(x: np.ndarray, dtype) -> np.ndarray:
    _, grads = problems.Rosenbrock().value_and_grad(x[None, :].astype(np.float32))
    return grads[0].astype(dtype)


def bits(a: np.ndarray | None) -> bytes | None:
    return None if a is None else np.ascontiguousarray(a, dtype=np.float32).tobytes()


# ---- the engine, apply_step and the slices -------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", RANGE_SPECS)
def test_engine_apply_step_and_slices_agree_bit_for_bit(name, dtype) -> None:
    ranges = RANGE_SPECS[name]
    engine = optex.OptEx(start(), optimizer=ranges, parallelism=1)
    x = start()
    state = optex.init_state(ranges, D)
    slices = [(a, b, opt, start()[a:b].copy(), optex.init_state(opt, b - a))
              for (a, b), (_, opt) in zip(bounds(ranges), ranges)]
    for t in range(30):
        points = engine.ask()
        assert bits(points[0]) == bits(x)  # N = 1: the one point is the iterate
        grad = gradient(x, dtype)
        losses, _ = problems.Rosenbrock().value_and_grad(points)
        engine.tell(grad[None, :], losses)
        optex.apply_step(ranges, x, state, grad)
        for a, b, opt, x_slice, slice_state in slices:
            optex.apply_step(opt, x_slice, slice_state, grad[a:b])
        assert bits(engine.x) == bits(x), f"iteration {t}: the engine and apply_step differ"
        assert bits(np.concatenate([s[3] for s in slices])) == bits(x), (
            f"iteration {t}: the slices stepped on their own differ")
    assert state.step == 30 and engine.iteration == 30
    assert not np.array_equal(x, start())  # it moved
    # Each slot of the full state is the slices' where they keep it, and stays zero where
    # the union of the ranges' layouts keeps one that the range does not use.
    for a, b, _, _, slice_state in slices:
        for full, part in zip(state.slots, slice_state.slots):
            if part is not None:
                assert bits(full[a:b]) == bits(part)
            elif full is not None:
                assert not full[a:b].any()


@pytest.mark.parametrize("opt", SINGLE_OPTIMIZERS, ids=repr)
def test_a_single_optimizer_is_one_range(opt) -> None:
    as_list = optex.OptEx(start(), optimizer=[(D, opt)], parallelism=1)
    as_value = optex.OptEx(start(), optimizer=opt, parallelism=1)
    x, state = start(), optex.init_state(opt, D)
    assert optex.init_state([(D, opt)], D) == state
    for _ in range(20):
        for engine in (as_list, as_value):
            points = engine.ask()
            losses, grads = problems.Rosenbrock().value_and_grad(points)
            engine.tell(grads, losses)
        optex.apply_step(opt, x, state, gradient(x, np.float32))
        assert bits(as_list.x) == bits(x) == bits(as_value.x)


# ---- state layouts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "used"),
    [
        (optex.Sgd(), (False, False, False)),
        (optex.Sgd(lr=0.1, weight_decay=0.5), (False, False, False)),
        (optex.Sgd(momentum=0.9), (True, False, False)),
        (optex.Sgd(momentum=0.9, nesterov=True), (True, False, False)),
        (optex.Adam(), (True, True, False)),
        (optex.AdamW(), (True, True, False)),
        (optex.RmsProp(), (True, False, False)),
        (optex.RmsProp(momentum=0.5), (True, True, False)),
        (optex.RmsProp(centered=True), (True, False, True)),
        (optex.RmsProp(momentum=0.5, centered=True), (True, True, True)),
        (optex.Lion(), (True, False, False)),
        # Ranges keep the union of their layouts.
        ([(2, optex.Sgd()), (3, optex.Sgd(momentum=0.9))], (True, False, False)),
        ([(2, optex.Sgd()), (3, optex.Sgd())], (False, False, False)),
        ([(2, optex.Adam()), (3, optex.AdamW())], (True, True, False)),
        ([(2, optex.RmsProp(momentum=0.5)), (3, optex.RmsProp(centered=True))], (True, True, True)),
        ([(4, optex.RmsProp()), (1, optex.RmsProp(centered=True))], (True, False, True)),
    ],
    ids=repr,
)
def test_init_state_slot_layout(spec, used) -> None:
    dim = 5
    state = optex.init_state(spec, dim)
    assert state.step == 0
    assert len(state.slots) == 3
    assert tuple(slot is not None for slot in state.slots) == used
    for slot in state.slots:
        if slot is not None:
            assert slot.dtype == np.float32 and slot.shape == (dim,) and not slot.any()
    assert repr(state) == f"OptimizerState(step=0, slots {sum(used)})"
    assert optex.init_state(spec, dim) == state
    if isinstance(spec, list):
        return  # sized ranges: another dimension is refused (test_ranges.py)
    if any(used):
        assert optex.init_state(spec, dim + 1) != state
    else:
        assert optex.init_state(spec, dim + 1) == state  # no buffer: nothing records the dimension


def test_states_of_one_layout_are_equal_whatever_made_them() -> None:
    assert optex.init_state(optex.Adam(), 4) == optex.init_state(optex.AdamW(lr=0.5), 4)
    assert optex.init_state(optex.Lion(), 4) == optex.init_state(optex.RmsProp(), 4)
    assert optex.init_state(optex.Sgd(momentum=0.5), 4) == optex.init_state(optex.Lion(), 4)
    # Two slots each, but not the same two.
    assert optex.init_state(optex.Adam(), 4) != optex.init_state(optex.RmsProp(centered=True), 4)


def test_the_first_step_fills_the_slots_as_torch_does() -> None:
    g = np.array([0.5, -1.0, 3.0, 1e-3], np.float32)
    f32 = np.float32

    def one_step(opt):
        state = optex.init_state(opt, 4)
        optex.apply_step(opt, np.zeros(4, np.float32), state, g)
        assert state.step == 1
        return state.slots

    # SGD's buffer starts as the first gradient.
    buf, _, _ = one_step(optex.Sgd(momentum=0.9))
    assert bits(buf) == bits(g)
    # Adam: m = lerp(0, g, 1 - beta1) = (1 - beta1) g; v = (1 - beta2) g g.
    m, v, _ = one_step(optex.Adam(beta1=0.8, beta2=0.99))
    assert bits(m) == bits(f32(1.0 - 0.8) * g)
    assert bits(v) == bits(f32(1.0 - 0.99) * g * g)
    # RMSprop: square_avg = (1 - alpha) g g; the gradient average (1 - alpha) g; the
    # buffer the scaled gradient.
    sq, b, ga = one_step(optex.RmsProp(alpha=0.9, momentum=0.5, centered=True))
    assert bits(sq) == bits(f32(1.0 - 0.9) * g * g)
    assert bits(ga) == bits(f32(1.0 - 0.9) * g)
    assert bits(b) == bits(g / (np.sqrt(sq - ga * ga) + f32(1e-8)))
    # Lion: m = (1 - beta2) g.
    m, _, _ = one_step(optex.Lion(beta2=0.98))
    assert bits(m) == bits(f32(1.0 - 0.98) * g)


# ---- schedules ----------------------------------------------------------------------------------


def scheduled(ranges, t: int):
    """The ranges of step t: every value may change, the layout may not."""
    out = []
    for r, (size, opt) in enumerate(ranges):
        new = type(opt)(*(getattr(opt, n) for n in opt.hyperparameters))
        new.lr = opt.lr * 0.7 ** (t // 3 + r)
        if "weight_decay" in opt.hyperparameters:
            new.weight_decay = opt.weight_decay * (t % 2)
        for name in ("beta1", "beta2", "alpha"):
            if name in opt.hyperparameters:
                setattr(new, name, getattr(opt, name) - 0.01 * (t % 3))
        if "momentum" in opt.hyperparameters and opt.momentum > 0:
            new.momentum = 0.5 + 0.1 * (t % 4)
        out.append((size, new))
    return out


@pytest.mark.parametrize("name", [n for n in RANGE_SPECS if n != "one per coordinate"])
def test_a_schedule_with_ranges_is_the_same_schedule_of_apply_step(name, tmp_path: Path) -> None:
    ranges = RANGE_SPECS[name]
    engine = optex.OptEx(start(), optimizer=ranges, parallelism=1)
    x, state = start(), optex.init_state(ranges, D)
    schedule = [scheduled(ranges, t) for t in range(24)]

    def advance(engine, t: int) -> None:
        engine.set_optimizer(schedule[t])
        expected = schedule[t][0][1] if len(schedule[t]) == 1 else schedule[t]
        assert engine.optimizer == expected
        points = engine.ask()
        losses, grads = problems.Rosenbrock().value_and_grad(points)
        engine.tell(grads, losses)

    for t in range(12):
        advance(engine, t)
        optex.apply_step(schedule[t], x, state, gradient(x, np.float32))
        assert bits(engine.x) == bits(x), f"step {t}"
    engine.save(tmp_path / "run.ckpt")
    restored = optex.OptEx.load(tmp_path / "run.ckpt")
    for t in range(12, 24):
        advance(engine, t)
        advance(restored, t)
        optex.apply_step(schedule[t], x, state, gradient(x, np.float32))
        assert bits(engine.x) == bits(x) == bits(restored.x), f"step {t}"
    assert state.step == 24
