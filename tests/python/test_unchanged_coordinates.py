"""OptEx.tell's `unchanged` coordinate ranges and OptEx.optimizer_step.

A commit with unchanged ranges leaves x there as it was, bit for bit, and
everywhere else equals the same commit without them (a twin loaded from a
checkpoint taken before the round and told the same gradients); the C++ suite
(tests/engine/test_unchanged_coordinates.cpp) checks the optimizer state slots too.
Every spelling of the ranges commits the same bytes, and every hostile one is
refused with a ValueError naming the problem, leaving the engine exactly as an
untouched twin.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import optex

N, D = 4, 50
UNUSED = [(0, 3), (10, 15), (49, 1)]


def unused_mask(ranges=UNUSED) -> np.ndarray:
    mask = np.zeros(D, dtype=bool)
    for offset, size in ranges:
        mask[offset : offset + size] = True
    return mask


MASK = unused_mask()


def partly_used(points: np.ndarray, mask: np.ndarray = MASK) -> tuple[np.ndarray, np.ndarray]:
    """Losses and gradients of 0.5 sum w (x - 1)^2 over the used coordinates; exact zeros elsewhere."""
    w = 1.0 + np.arange(D) % 7
    diff = points.astype(np.float64) - 1.0
    grads = np.where(mask, 0.0, w * diff)
    return 0.5 * (np.where(mask, 0.0, w * diff * diff)).sum(axis=1), grads.astype(np.float32)


def make(optimizer: optex.Optimizer, **kwargs) -> optex.OptEx:
    x0 = np.random.default_rng(3).uniform(-2.0, 2.0, D).astype(np.float32)
    return optex.OptEx(x0, optimizer, parallelism=N, seed=5, history=8, **kwargs)


def run(opt: optex.OptEx, rounds: int, mask: np.ndarray) -> None:
    for _ in range(rounds):
        losses, grads = partly_used(opt.ask(), mask)
        opt.tell(grads, losses)


def checkpoint_bytes(opt: optex.OptEx) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.ckpt")
        opt.save(path)
        with open(path, "rb") as f:
            return f.read()


def twin_of(opt: optex.OptEx) -> optex.OptEx:
    """A copy of a run between rounds, through a checkpoint."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.ckpt")
        opt.save(path)
        return optex.OptEx.load(path)


OPTIMIZERS = {
    "adam_l2": optex.Adam(lr=0.05, weight_decay=0.1),
    "adamw": optex.AdamW(lr=0.05, weight_decay=0.1),
    "sgd_momentum": optex.Sgd(lr=0.02, momentum=0.9, weight_decay=0.05),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("continue_from", ["last", "best_loss"])
def test_the_ranges_keep_x_and_the_rest_is_as_without_them(name: str, continue_from: str) -> None:
    opt = make(OPTIMIZERS[name], continue_from=continue_from)
    run(opt, 3, np.zeros(D, dtype=bool))  # every coordinate takes part at first
    x_at_switch = opt.x
    for _ in range(5):
        twin = twin_of(opt)
        before = opt.x
        points = opt.ask()
        np.testing.assert_array_equal(points, twin.ask())
        losses, grads = partly_used(points)
        info = opt.tell(grads, losses, unchanged=UNUSED)
        twin_info = twin.tell(grads, losses)
        assert opt.x[MASK].tobytes() == before[MASK].tobytes()
        assert opt.x[~MASK].tobytes() == twin.x[~MASK].tobytes()
        assert opt.optimizer_step == twin.optimizer_step
        assert info.committed_point == twin_info.committed_point and info.loss == twin_info.loss
        # Without the ranges those coordinates moved (weight decay, momentum).
        assert twin.x[MASK].tobytes() != before[MASK].tobytes()
    assert opt.x[MASK].tobytes() == x_at_switch[MASK].tobytes()


def test_dropped_points_and_unchanged_ranges() -> None:
    opt = make(OPTIMIZERS["sgd_momentum"], continue_from="last")
    run(opt, 2, np.zeros(D, dtype=bool))
    twin = twin_of(opt)
    before = opt.x
    losses, grads = partly_used(opt.ask())
    twin.ask()
    grads[N - 1, 30] = np.nan  # the last point is dropped: the commit replays to point N-2
    grads[1, 12] = np.inf  # inside an unchanged range, and still dropped
    info = opt.tell(grads, losses, drop_nonfinite=True, unchanged=UNUSED)
    twin_info = twin.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == twin_info.dropped == 2
    assert info.committed_point == twin_info.committed_point == N - 2
    assert opt.x[MASK].tobytes() == before[MASK].tobytes()
    assert opt.x[~MASK].tobytes() == twin.x[~MASK].tobytes()
    # Without drop_nonfinite the same rows are refused before the ranges matter.
    losses, grads = partly_used(opt.ask())
    grads[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"grads: row 0, column 0 is nan"):
        opt.tell(grads, losses, unchanged=UNUSED)
    assert opt.pending


SPELLINGS = {
    "list of tuples": lambda: UNUSED,
    "list of lists": lambda: [list(r) for r in UNUSED],
    "tuple of tuples": lambda: tuple(UNUSED),
    "int64 array": lambda: np.array(UNUSED, dtype=np.int64),
    "int32 array": lambda: np.array(UNUSED, dtype=np.int32),
    "uint64 array": lambda: np.array(UNUSED, dtype=np.uint64),
    "fortran-ordered array": lambda: np.asfortranarray(np.array(UNUSED, dtype=np.int64)),
    "strided view": lambda: np.array([[0, 3, 9], [10, 15, 9], [49, 1, 9]])[:, :2],
    "adjacent ranges": lambda: [(0, 1), (1, 2), (10, 5), (15, 10), (49, 1)],
}


def test_every_spelling_of_the_ranges_commits_the_same_bytes() -> None:
    base = make(OPTIMIZERS["adamw"])
    run(base, 2, np.zeros(D, dtype=bool))
    results = {}
    for name, spelling in SPELLINGS.items():
        opt = twin_of(base)
        losses, grads = partly_used(opt.ask())
        opt.tell(grads, losses, unchanged=spelling())
        results[name] = checkpoint_bytes(opt)
    by_rows = twin_of(base)
    points = np.from_dlpack(by_rows.device_points())
    losses, grads = partly_used(points)
    np.from_dlpack(by_rows.device_grads())[...] = grads
    by_rows.tell_device(losses, unchanged=UNUSED)
    results["tell_device"] = checkpoint_bytes(by_rows)
    assert len(set(results.values())) == 1, sorted(results)


@pytest.mark.parametrize("none", [None, [], (), np.empty((0, 2), dtype=np.int64), np.empty(0)])
def test_no_ranges_is_a_plain_tell(none) -> None:
    opt = make(OPTIMIZERS["adam_l2"])
    plain = make(OPTIMIZERS["adam_l2"])
    for engine, kwargs in ((opt, {"unchanged": none}), (plain, {})):
        losses, grads = partly_used(engine.ask())
        engine.tell(grads, losses, **kwargs)
    assert checkpoint_bytes(opt) == checkpoint_bytes(plain)


HOSTILE = [
    ([(0, 5), (3, 4)], r"unchanged: range 1 \(offset 3, size 4\) overlaps range 0"),
    ([(10, 2), (0, 2)], r"range 1 \(offset 0, size 2\) starts before range 0 .*sorted"),
    ([(5, 5), (5, 1)], r"range 1 \(offset 5, size 1\) overlaps"),
    ([(D - 1, 2)], r"range 0 \(offset 49, size 2\) reaches past the dimension 50"),
    ([(D, 1)], r"range 0 \(offset 50, size 1\) reaches past the dimension"),
    ([(3, 0)], r"range 0 \(offset 3, size 0\) is empty"),
    ([(-1, 3)], r"range 0 \(offset -1, size 3\) has a negative offset"),
    ([(2, -3)], r"range 0 \(offset 2, size -3\) has a negative size"),
    (np.array([[1, 2**64 - 1]], dtype=np.uint64), r"size 18446744073709551615\) reaches past"),
    (np.array([[2**63, 1]], dtype=np.uint64), r"offset 9223372036854775808, size 1\) reaches past"),
    ([(0, 2**63)], r"got dtype float64"),
    ([(0, 2**70)], r"got dtype object"),
    (np.array([[0.0, 3.0]]), r"got dtype float64"),
    (np.array([[0.0, np.nan]]), r"got dtype float64"),
    (np.array([[True, True]]), r"got dtype bool"),
    (np.array([[1 + 0j, 2]]), r"got dtype complex128"),
    ("0:3", r"got shape \(\)"),
    ({"offset": 0, "size": 3}, r"got shape \(\)"),
    (object(), r"got shape \(\)"),
    (5, r"got shape \(\)"),
    ([0, 3], r"got shape \(2,\)"),
    ([(0, 3, 1)], r"got shape \(1, 3\)"),
    (np.zeros((1, 2, 2), dtype=np.int64), r"got shape \(1, 2, 2\)"),
    ([(0, 3), (5,)], r"unchanged: expected a sequence of \(offset, size\) pairs.*numpy cannot convert"),
]


@pytest.mark.parametrize(("ranges", "message"), HOSTILE, ids=[m for _, m in HOSTILE])
@pytest.mark.parametrize("via", ["tell", "tell_device"])
def test_hostile_ranges_are_refused_and_change_nothing(ranges, message: str, via: str) -> None:
    opt = make(OPTIMIZERS["adam_l2"])
    run(opt, 1, MASK)
    untouched = twin_of(opt)
    points = opt.ask()
    losses, grads = partly_used(points)
    if via == "tell":
        with pytest.raises(ValueError, match=message):
            opt.tell(grads, losses, unchanged=ranges)
    else:
        np.from_dlpack(opt.device_grads())[...] = grads
        with pytest.raises(ValueError, match=message):
            opt.tell_device(losses, unchanged=ranges)
    assert opt.pending and opt.iteration == 1
    np.testing.assert_array_equal(untouched.ask(), points)
    # The refused call left no trace: the same commit gives the untouched twin's bytes.
    opt.tell(grads, losses, unchanged=UNUSED)
    untouched.tell(grads, losses, unchanged=UNUSED)
    assert checkpoint_bytes(opt) == checkpoint_bytes(untouched)


def test_optimizer_step_counts_the_steps_of_each_round() -> None:
    opt = make(optex.Adam(lr=0.05), continue_from="best_loss")
    assert opt.optimizer_step == 0
    steps = []
    for t in range(6):
        before = opt.optimizer_step
        losses, grads = partly_used(opt.ask(), np.zeros(D, dtype=bool))
        losses = losses + 50.0 * ((t + np.arange(N)) % 3)  # best_loss then picks earlier points
        info = opt.tell(grads, losses)
        # The default warm-up holds the first round's points: one step; then the
        # replay to the committed point and the commit's own step.
        assert opt.optimizer_step - before == (1 if t == 0 else info.committed_point + 1)
        steps.append(info.committed_point)
    assert min(steps[1:]) < N - 1
    assert isinstance(opt.optimizer_step, int)
    reference = make(optex.Adam(lr=0.05), warmup="zero_gradient", continue_from="last")
    run(reference, 1, MASK)
    assert reference.optimizer_step == N  # the reference warm-up steps with zero gradients
