"""optex.OptEx(..., shard=(dim, offset, sums)): one slice of a sharded engine, its sums
completed by a Python object. A lone slice holding every coordinate (sums that
change nothing) is the whole engine bit for bit; two slices on two threads follow
it; hostile arguments and callbacks are refused, and say what they leave behind."""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import snapshot

import optex

D = 10_000  # three blocks of 4096: two slices of 8192 and 1808 coordinates
N = 3


def problem() -> optex.problems.Problem:
    return optex.problems.Rosenbrock()


def start(d: int = D) -> np.ndarray:
    return problem().standard_start(d)


class Sums:
    """The sums of a slice that holds every coordinate: nothing to add. Records each
    call (method, array size), and can misbehave at call number `fail_at` (counted
    from `arm()`): raise, complete to NaN, return a value, or change the dtype."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_at: int | None = None
        self.mode = "raise"

    def arm(self, fail_at: int, mode: str) -> None:
        self.calls.clear()
        self.fail_at, self.mode = fail_at, mode

    def _call(self, method: str, values: np.ndarray):
        self.calls.append((method, values.size))
        if self.fail_at != len(self.calls) - 1:
            return None
        self.fail_at = None
        if self.mode == "raise":
            raise KeyError("the collective failed")
        if self.mode == "nan":
            values[...] = np.nan if values.dtype == np.float64 else values
            return None
        if self.mode == "return":
            return values.copy()
        values.dtype = np.int8  # a view of other bytes, in place
        return None

    def sum(self, values: np.ndarray):
        assert values.dtype == np.float64 and values.ndim == 1
        return self._call("sum", values)

    def all(self, flags: np.ndarray):
        assert flags.dtype == np.uint8 and set(flags.tolist()) <= {0, 1}
        return self._call("all", flags)


def lone_slice(sums: Sums, **options) -> optex.OptEx:
    return optex.OptEx(start(), optex.Adam(lr=0.01), parallelism=N, seed=3, shard=(D, 0, sums), **options)


def whole(**options) -> optex.OptEx:
    return optex.OptEx(start(), optex.Adam(lr=0.01), parallelism=N, seed=3, **options)


def round_of(opt: optex.OptEx) -> None:
    points = opt.ask()
    losses, grads = problem().value_and_grad(points)
    opt.tell(grads, losses)


def same_state(a: optex.OptEx, b: optex.OptEx) -> bool:
    sa, sb = a.state_arrays(), b.state_arrays()

    def equal(x, y) -> bool:
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, list):
            return len(x) == len(y) and all(equal(u, v) for u, v in zip(x, y))
        if isinstance(x, np.ndarray):
            return x.tobytes() == y.tobytes()
        return x == y or (x != x and y != y)

    return equal(sa, sb)


# ---------------------------------------------------------------------------- the slice itself


def test_a_lone_slice_is_the_whole_engine_bit_for_bit() -> None:
    sums = Sums()
    sliced, reference = lone_slice(sums), whole()
    assert sliced.shard == (D, 0, D) and reference.shard == (D, 0, D)
    assert "shard=(10000, 0, ...)" in repr(sliced)
    for _ in range(6):
        assert sliced.ask().tobytes() == reference.ask().tobytes()
        round_of(sliced)
        round_of(reference)
    assert same_state(sliced, reference)
    assert {method for method, _ in sums.calls} == {"sum", "all"}


def test_the_slice_keeps_its_sums_alive() -> None:
    sums = Sums()
    ref = weakref.ref(sums)
    opt = lone_slice(sums)
    del sums
    gc.collect()
    assert ref() is not None
    round_of(opt)
    del opt
    gc.collect()
    assert ref() is None


class ThreadSums:
    """Sums across the slices of W threads: each thread's partials meet at a barrier
    and are added in slice order, as torch.distributed ranks add them."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=60)
        self.parts: list[np.ndarray | None] = [None] * world

    def of(self, rank: int) -> _Rank:
        return _Rank(self, rank)


class _Rank:
    def __init__(self, shared: ThreadSums, rank: int) -> None:
        self.shared, self.rank = shared, rank

    def _complete(self, values: np.ndarray, add) -> None:
        shared = self.shared
        shared.parts[self.rank] = values.copy()
        shared.barrier.wait()
        total = shared.parts[0].copy()
        for part in shared.parts[1:]:
            total = add(total, part)
        shared.barrier.wait()
        values[...] = total

    def sum(self, values: np.ndarray) -> None:
        self._complete(values, lambda a, b: a + b)

    def all(self, flags: np.ndarray) -> None:
        self._complete(flags, np.minimum)


def two_slices() -> list[optex.OptEx]:
    shared = ThreadSums(2)
    x0 = start()
    slices = []
    for r in range(2):
        offset, size = optex.shard_of(D, 2, r)
        slices.append(optex.OptEx(x0[offset:offset + size], optex.Adam(lr=0.01), parallelism=N, seed=3,
                                  shard=(D, offset, shared.of(r))))
    return slices


def on_both(pool: ThreadPoolExecutor, calls) -> list:
    """Runs the two slices' calls at once (they wait for each other in their sums);
    returns each one's result or exception."""
    futures = [pool.submit(call) for call in calls]
    out = []
    for f in futures:
        try:
            out.append(f.result(timeout=60))
        except Exception as error:  # noqa: BLE001 - returned for the test to inspect
            out.append(error)
    return out


def test_two_slices_on_two_threads_follow_the_whole_engine() -> None:
    slices, reference = two_slices(), whole()
    assert [s.shard for s in slices] == [(D, 0, 8192), (D, 8192, 1808)]
    worst = 0.0
    with ThreadPoolExecutor(2) as pool:
        for _ in range(15):
            parts = on_both(pool, [s.ask for s in slices])
            points = np.concatenate(parts, axis=1)
            losses, grads = problem().value_and_grad(points)
            on_both(pool, [lambda s=s: s.tell(grads[:, s.shard[1]:s.shard[1] + s.shard[2]].copy(), losses)
                           for s in slices])
            round_of(reference)
            x = np.concatenate([s.x for s in slices])
            worst = max(worst, float(np.abs(x - reference.x).max() / np.abs(reference.x).max()))
    # The completed sums add the slices' partials in slice order, the whole engine its
    # blocks in block order: the C++ sharded engine's tolerance (measured here: 0).
    assert worst <= 1e-5
    assert [s.iteration for s in slices] == [15, 15]


def test_a_gradient_one_slice_refuses_is_refused_on_every_slice() -> None:
    slices = two_slices()
    with ThreadPoolExecutor(2) as pool:
        parts = on_both(pool, [s.ask for s in slices])
        points = np.concatenate(parts, axis=1)
        losses, grads = problem().value_and_grad(points)
        bad = grads.copy()
        bad[1, 9000] = np.nan  # in the second slice only
        results = on_both(pool, [lambda s=s: s.tell(bad[:, s.shard[1]:s.shard[1] + s.shard[2]].copy(), losses)
                                 for s in slices])
        assert all(isinstance(r, ValueError) and "points 1" in str(r) for r in results), results
        assert [s.pending for s in slices] == [True, True]
        on_both(pool, [lambda s=s: s.tell(grads[:, s.shard[1]:s.shard[1] + s.shard[2]].copy(), losses)
                       for s in slices])
    assert [s.iteration for s in slices] == [1, 1]


def test_a_slice_resumes_from_its_state_arrays_and_refuses_save(tmp_path) -> None:
    sums = Sums()
    opt = lone_slice(sums)
    for _ in range(3):
        round_of(opt)
    resumed = optex.OptEx.from_state_arrays(opt.state_arrays(), shard=(D, 0, Sums()))
    assert resumed.shard == (D, 0, D)
    for _ in range(3):
        round_of(opt)
        round_of(resumed)
    assert same_state(opt, resumed)
    with pytest.raises(RuntimeError, match="save: this engine is a slice"):
        opt.save(tmp_path / "slice.ckpt")
    assert not (tmp_path / "slice.ckpt").exists()
    with pytest.raises(ValueError, match="pass neither device nor history_precision with shard"):
        optex.OptEx.from_state_arrays(opt.state_arrays(), device="cpu", shard=(D, 0, Sums()))
    with pytest.raises(ValueError, match="shard"):  # the state's 10000 coordinates do not fit
        optex.OptEx.from_state_arrays(opt.state_arrays(), shard=(D, 5, Sums()))


# ---------------------------------------------------------------------------- hostile arguments


class NotCallable:
    sum = 3

    def all(self, flags):
        return None


@pytest.mark.parametrize("sums", [object(), NotCallable(), None.__class__])
def test_sums_without_the_methods_is_a_type_error(sums) -> None:
    with pytest.raises(TypeError, match="shard: sums must have the methods sum"):
        optex.OptEx(start(), shard=(D, 0, sums))


@pytest.mark.parametrize(("shard", "message"), [
    ((D - 1, 0), "expected a tuple \\(dim, offset, sums\\)"),
    ([D, 0, Sums()], "expected a tuple"),
    ((True, 0, Sums()), "dim must be an int, got a bool"),
    ((D, 1.0, Sums()), "offset must be an int"),
    ((0, 0, Sums()), "dim must be >= 1"),
    ((D, -1, Sums()), "offset must be >= 0"),
    ((D, 2**70, Sums()), "offset is out of range"),
    ((D - 1, 0, Sums()), "shard: a slice of 10000 coordinates at offset 0 of dimension 9999"),
    ((D, 1, Sums()), "shard: a slice of 10000 coordinates at offset 1 of dimension 10000"),
])
def test_a_shard_that_does_not_fit_is_a_value_error(shard, message) -> None:
    with pytest.raises(ValueError, match=message):
        optex.OptEx(start(), shard=shard)


def test_a_slice_refuses_the_target_proxy() -> None:
    with pytest.raises(ValueError, match="proxy: Proxy::target needs the whole point"):
        lone_slice(Sums(), proxy="target")


def test_shard_of_and_slice_ranges() -> None:
    assert [optex.shard_of(D, 2, r) for r in range(2)] == [(0, 8192), (8192, 1808)]
    assert [optex.shard_of(D, 3, r) for r in range(3)] == [(0, 4096), (4096, 4096), (8192, 1808)]
    with pytest.raises(ValueError, match="fewer than the 4 ranks"):
        optex.shard_of(D, 4, 0)
    with pytest.raises(ValueError, match="rank"):
        optex.shard_of(D, 2, 2)
    a, b = optex.Adam(lr=0.1), optex.Adam(lr=0.2)
    assert optex.slice_ranges(a, D, 8192, 1808) == a
    assert optex.slice_ranges([(5000, a), (5000, b, 0)], D, 4096, 4096) == [(904, a), (3192, b)]
    assert optex.slice_ranges([(5000, a, 2), (5000, b)], D, 0, 8192) == [(5000, a, 2), (3192, b, 0)]
    with pytest.raises(ValueError):
        optex.slice_ranges([(5000, a), (4000, b)], D, 0, 10)  # the ranges do not add up to dim
    with pytest.raises(ValueError):
        optex.slice_ranges(a, D, 8192, 2000)  # past the end


# ---------------------------------------------------------------------------- hostile callbacks

# What each call of the sums does in a round of a lone slice after warm-up: ask
# completes N - 1 GP distances and one flag; tell completes the rows' finiteness
# (once: the commit's check, which also refuses them), the commit step's, and, in one call,
# the commit statistics (4 per compared prediction, 2 more) with the statistics of
# the N new history pairs against the 2N pairs then held (2 rows of 2N and a norm each).
ASK = [("sum", 3), ("sum", 3), ("all", 1)]
TELL = [("all", N), ("all", 1), ("sum", 10 + N * (2 * 2 * N + 1))]


def warmed_up(sums: Sums | None = None) -> tuple[optex.OptEx, Sums, optex.OptEx]:
    """A lone slice (over `sums`, a new Sums by default) and the whole engine after one
    round (the next uses the GP)."""
    sums = Sums() if sums is None else sums
    sliced, reference = lone_slice(sums), whole()
    round_of(sliced)
    round_of(reference)
    return sliced, sums, reference


def test_the_calls_of_a_round_are_as_listed() -> None:
    sliced, sums, _ = warmed_up()
    sums.arm(-1, "raise")
    sliced.ask()
    assert sums.calls == ASK
    sums.arm(-1, "raise")
    losses, grads = problem().value_and_grad(sliced.ask())
    sliced.tell(grads, losses)
    assert sums.calls == TELL


def failures(calls: list[tuple[str, int]], modes: list[str]) -> list[tuple[int, str]]:
    """(call, mode) for each call and misbehaviour (flags have no NaN to complete to)."""
    return [(i, mode) for i, (method, _) in enumerate(calls) for mode in modes
            if not (mode == "nan" and method == "all")]


@pytest.mark.parametrize(("call", "mode"), failures(ASK, ["raise", "nan", "return", "dtype"]))
def test_a_failing_sums_leaves_ask_unchanged(call: int, mode: str) -> None:
    sliced, sums, reference = warmed_up()
    before = snapshot(sliced)
    sums.arm(call, mode)
    expected = {"raise": KeyError, "nan": ValueError, "return": TypeError, "dtype": TypeError}[mode]
    with pytest.raises(expected):
        sliced.ask()
    assert snapshot(sliced) == before and not sliced.pending
    # The engine goes on as if nothing had happened.
    for _ in range(2):
        assert sliced.ask().tobytes() == reference.ask().tobytes()
        round_of(sliced)
        round_of(reference)
    assert same_state(sliced, reference)


@pytest.mark.parametrize(("call", "mode"), failures(TELL, ["raise", "nan"]))
def test_a_failing_sums_in_tell(call: int, mode: str) -> None:
    sliced, sums, reference = warmed_up()
    losses, grads = problem().value_and_grad(sliced.ask())
    reference.ask()
    before = snapshot(sliced)
    sums.arm(call, mode)
    with pytest.raises(KeyError if mode == "raise" else ValueError):
        sliced.tell(grads, losses)
    # Anywhere, the history write included (a push keeps what it overwrites
    # until its sums are complete): unchanged, the round pending; tell again commits.
    assert snapshot(sliced) == before and sliced.pending
    sliced.tell(grads, losses)
    reference.tell(grads, losses)
    round_of(sliced)
    round_of(reference)
    assert same_state(sliced, reference)


def test_a_callback_that_calls_back_into_its_engine_is_refused() -> None:
    holder: list[optex.OptEx] = []

    class Reentrant(Sums):
        def all(self, flags):
            return holder[0].x  # a call into the busy engine

    opt = lone_slice(Reentrant())
    holder.append(opt)
    with pytest.raises(RuntimeError, match="busy"):
        opt.ask()
    assert not opt.pending


# ------------------------------------------------- hostile sums: impossible completions (fuzzed)

# What no honest sums can complete to, and what the engine does about it: the
# trampoline refuses a non-finite sum or a flag other than 0 and 1 (ValueError);
# the engine refuses negative squared distances and norms, a history point's
# distance to itself other than 0, statistics that contradict each other, and a
# flag of 1 where its own slice's is 0 (RuntimeError naming the sums, "the
# ShardSums is faulty"). Either way the engine is as it was, and goes on with
# honest sums as a twin that never met the fault. Seeded, so that CI runs the
# same cases every time.

FAULTY = "the ShardSums is faulty"


class HostileSums(Sums):
    """Honest (a lone slice: nothing to add) but at call `fail_at` (from arm()),
    where `fault(values)` rewrites the completion in place."""

    def arm(self, fail_at: int, fault) -> None:  # type: ignore[override]
        self.calls.clear()
        self.fail_at, self.fault = fail_at, fault

    def _call(self, method: str, values: np.ndarray):
        self.calls.append((method, values.size))
        if self.fail_at == len(self.calls) - 1:
            self.fail_at = None
            self.fault(values)
        return None


def hostile_pair() -> tuple[optex.OptEx, HostileSums, optex.OptEx]:
    """A lone slice with hostile sums and the whole engine, after one round."""
    return warmed_up(HostileSums())  # type: ignore[return-value]


def nonfinite(rng: np.random.Generator):
    def fault(values: np.ndarray) -> None:
        values[rng.integers(values.size)] = [np.nan, np.inf, -np.inf][int(rng.integers(3))]
    return fault, ValueError, "sums.sum completed value"


def negative(rng: np.random.Generator):
    scale, shift = 10.0 ** rng.uniform(-3, 30), 10.0 ** rng.uniform(-300, 300)

    def fault(values: np.ndarray) -> None:
        values[...] = -np.abs(values) * scale - shift
    return fault, RuntimeError, "impossible for squared"


def huge(rng: np.random.Generator):
    shift = 10.0 ** rng.uniform(20, 300)

    def fault(values: np.ndarray) -> None:
        values += shift  # a history point's distance to itself is no longer 0
    return fault, RuntimeError, FAULTY


def inconsistent(rng: np.random.Generator):
    factor = rng.uniform(1.5, 4.0)

    def fault(values: np.ndarray) -> None:
        values[1::2] = values[1::2] * factor + 1.0  # every other value of the call
    return fault, RuntimeError, FAULTY


def bad_flag(rng: np.random.Generator):
    flag = [2, 255, int(rng.integers(2, 256))][int(rng.integers(3))]

    def fault(flags: np.ndarray) -> None:
        flags[rng.integers(flags.size)] = flag
    return fault, ValueError, f"sums.all completed flag .* to {flag}"


# Each fault and the calls of a round (ASK, TELL above) it is tried at. The GP
# distances of ask() may be +inf or NaN for a proxy point that left the bound
# (the engine then holds the batch): only a negative one is impossible there,
# and only the commit's values relate to each other (huge, inconsistent).
ASK_FAULTS = [(nonfinite, [0, 1]), (negative, [0, 1]), (bad_flag, [2])]
TELL_FAULTS = [(bad_flag, [0, 1]), (nonfinite, [2]), (negative, [2]), (huge, [2]),
               (inconsistent, [2])]


def pick(rng: np.random.Generator, faults: list) -> tuple[int, object, type, str]:
    """A fault, then one of the calls it is tried at: (call, fault, error, message)."""
    make, calls = faults[int(rng.integers(len(faults)))]
    call = calls[int(rng.integers(len(calls)))]
    return (call, *make(rng))


@pytest.mark.parametrize("seed", range(16))
def test_hostile_sums_in_ask_are_refused_and_change_nothing(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sliced, sums, reference = hostile_pair()
    call, fault, error, message = pick(rng, ASK_FAULTS)
    before = sliced.state_arrays()
    sums.arm(call, fault)
    with pytest.raises(error, match=message):
        sliced.ask()
    assert not sliced.pending
    assert same_state_arrays(sliced.state_arrays(), before)
    for _ in range(2):  # the honest rounds that follow are the whole engine's
        assert sliced.ask().tobytes() == reference.ask().tobytes()
        round_of(sliced)
        round_of(reference)
    assert same_state(sliced, reference)


@pytest.mark.parametrize("seed", range(24))
def test_hostile_sums_in_tell_are_refused_and_change_nothing(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    sliced, sums, reference = hostile_pair()
    losses, grads = problem().value_and_grad(sliced.ask())
    reference.ask()
    call, fault, error, message = pick(rng, TELL_FAULTS)
    before = snapshot(sliced)
    sums.arm(call, fault)
    with pytest.raises(error, match=message):
        sliced.tell(grads, losses)
    assert snapshot(sliced) == before and sliced.pending
    sliced.tell(grads, losses)  # honest now: commits what the whole engine commits
    reference.tell(grads, losses)
    assert same_state(sliced, reference)
    round_of(sliced)
    round_of(reference)
    assert same_state(sliced, reference)


def test_a_flag_of_one_where_the_slice_says_zero_is_refused() -> None:
    """Row 1 holds a NaN: this slice's flag is 0, so no AND of the slices' flags is
    1. Sums that said 1 would let the NaN into the history."""
    sliced, sums, reference = hostile_pair()
    losses, grads = problem().value_and_grad(sliced.ask())
    reference.ask()
    bad = grads.copy()
    bad[1, 17] = np.nan

    def all_ones(flags: np.ndarray) -> None:
        flags[...] = 1

    sums.arm(0, all_ones)
    with pytest.raises(RuntimeError, match="to 1 where this slice's is 0"):
        sliced.tell(bad, losses)
    assert sliced.pending
    sliced.tell(grads, losses)
    reference.tell(grads, losses)
    assert same_state(sliced, reference)


def same_state_arrays(a: dict, b: dict) -> bool:
    def equal(x, y) -> bool:
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, list):
            return len(x) == len(y) and all(equal(u, v) for u, v in zip(x, y))
        if isinstance(x, np.ndarray):
            return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        return x == y or (x != x and y != y)

    return equal(a, b)


@pytest.mark.parametrize("seed", range(8))
def test_a_slice_off_the_block_grid_is_a_value_error(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x0 = start()
    # An offset inside a block (the slice reaching to the end), or on the grid
    # with a partial block that does not end at the dimension.
    offset = int(rng.integers(0, 2)) * 4096 + int(rng.integers(1, 4096))
    with pytest.raises(ValueError, match="shard: .* off the block grid"):
        optex.OptEx(x0[offset:], shard=(D, offset, HostileSums()))
    size = int(rng.integers(1, 4096))
    with pytest.raises(ValueError, match="shard: .* off the block grid"):
        optex.OptEx(x0[4096:4096 + size], shard=(D, 4096, HostileSums()))
    # What shard_of cuts is on it, and so is a run of whole blocks.
    for offset, size in [optex.shard_of(D, 2, 1), (4096, 4096), (4096, D - 4096)]:
        opt = optex.OptEx(x0[offset:offset + size], shard=(D, offset, HostileSums()))
        assert opt.shard == (D, offset, size)
