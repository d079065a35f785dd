"""pickle, copy.deepcopy and copy.copy of an optex.OptEx: the copy continues the run bit
for bit (iterate, optimizer state, history, lengthscale, random state, counters), and
independently of the original; a pending round, a slice and a corrupted payload are
refused with errors that say why, and nothing changes."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import optex
from optex import problems

OPTIMIZERS = {
    "sgd": optex.Sgd(lr=2e-3, momentum=0.9, nesterov=True),
    "adam": optex.Adam(lr=1e-2),
    "adamw": optex.AdamW(lr=1e-2, weight_decay=0.1),
    "rmsprop": optex.RmsProp(lr=1e-3, momentum=0.5, centered=True),
    "lion": optex.Lion(lr=1e-3),
    "ranges": [(5, optex.Adam(lr=1e-2)), (7, optex.Adam(lr=1e-3, beta1=0.8, weight_decay=0.1))],
}


def engine(optimizer=OPTIMIZERS["adam"], **options) -> tuple[optex.OptEx, problems.Problem]:
    f = problems.Rastrigin()
    options = {"parallelism": 4, "history": 10, "seed": 21, **options}
    return optex.OptEx(f.standard_start(12), optimizer=optimizer, **options), f


def drive(opt: optex.OptEx, f: problems.Problem, rounds: int, shift: float = 0.0) -> list[bytes]:
    """`rounds` ask/tell rounds of f (moved by `shift`); per round the bits of what the
    run depends on: the points, the seeds, the iterate and the info."""
    out = []
    for _ in range(rounds):
        points = opt.ask()
        out.append(points.tobytes() + np.asarray(opt.seeds).tobytes())
        losses, grads = f.value_and_grad(points - np.float32(shift))
        info = opt.tell(grads, losses)
        out.append(opt.x.tobytes() + repr((info.loss, info.lengthscale, info.committed_point)).encode())
    return out


def same_state(a, b) -> bool:
    """state_arrays() values equal bit for bit (arrays by dtype, shape and bytes)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return type(a) is type(b) and a == b


def copiers():
    def pickled(protocol):
        def copier(opt):
            return pickle.loads(pickle.dumps(opt, protocol=protocol))
        copier.__name__ = f"pickle{protocol}"
        return copier

    def out_of_band(opt):
        """Ray's and Dask's way: protocol 5 with the large buffers sent apart."""
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(opt, protocol=5, buffer_callback=buffers.append)
        return pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])

    found = [*(pickled(p) for p in range(2, pickle.HIGHEST_PROTOCOL + 1)), out_of_band,
             copy.deepcopy, copy.copy]
    try:
        import cloudpickle  # Dask's and Ray's pickler, where installed
    except ImportError:
        return found

    def cloudpickled(opt):
        return pickle.loads(cloudpickle.dumps(opt))

    found.append(cloudpickled)
    try:
        from distributed.protocol import deserialize, serialize
    except ImportError:
        return found

    def dask_shipped(opt):
        """Dask's own serialisation (pickle protocol 5, its frames out of band)."""
        header, frames = serialize(opt, serializers=("pickle",))
        return deserialize(header, [bytes(f) for f in frames])

    return [*found, dask_shipped]


@pytest.mark.parametrize("copier", copiers(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_copy_continues_the_run_bit_for_bit(kind: str, copier) -> None:
    opt, f = engine(OPTIMIZERS[kind])
    drive(opt, f, 5)
    twin = copier(opt)
    assert type(twin) is optex.OptEx and twin is not opt
    assert same_state(twin.state_arrays(), opt.state_arrays())
    assert twin.options == opt.options and twin.optimizer == opt.optimizer
    expected = drive(opt, f, 6)
    assert drive(twin, f, 6) == expected
    assert same_state(twin.state_arrays(), opt.state_arrays())


def test_the_copy_is_the_uninterrupted_run() -> None:
    """Independently of the original: a run from scratch that never was copied."""
    opt, f = engine(strategy="adaptive")
    drive(opt, f, 4)
    twin = pickle.loads(pickle.dumps(opt))
    del opt
    reference, _ = engine(strategy="adaptive")
    drive(reference, f, 4)
    assert drive(twin, f, 5) == drive(reference, f, 5)
    assert same_state(twin.state_arrays(), reference.state_arrays())


def test_deepcopy_branches_diverge_independently() -> None:
    opt, f = engine(optimizer=OPTIMIZERS["ranges"])
    drive(opt, f, 3)
    branch = copy.deepcopy(opt)
    # Each branch follows its own objective; neither sees the other's rounds.
    a = drive(opt, f, 4, shift=0.0)
    b = drive(branch, f, 4, shift=0.5)
    assert a != b
    for shift, run in ((0.0, a), (0.5, b)):
        reference, _ = engine(optimizer=OPTIMIZERS["ranges"])
        drive(reference, f, 3)
        assert drive(reference, f, 4, shift=shift) == run


def test_a_pending_round_is_refused_and_the_run_goes_on() -> None:
    opt, f = engine()
    drive(opt, f, 2)
    points = opt.ask().copy()
    for attempt in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError, match="a round is pending .*call tell\\(\\) first"):
            attempt(opt)
    assert opt.pending
    # Nothing changed: the round finishes as if the copies were never tried.
    losses, grads = f.value_and_grad(points)
    opt.tell(grads, losses)
    reference, _ = engine()
    drive(reference, f, 3)
    assert same_state(opt.state_arrays(), reference.state_arrays())
    assert np.array_equal(points, np.asarray(reference_points(3)))


def reference_points(rounds: int) -> np.ndarray:
    reference, f = engine()
    drive(reference, f, rounds - 1)
    return reference.ask().copy()


def test_a_gradient_oracle_is_not_copied() -> None:
    """As save() and state_arrays(): the oracle is set again on the copy."""
    f = problems.Rastrigin()

    def oracle(x):
        loss, grad = f.value_and_grad(x[None, :])
        return float(loss[0]), grad[0]

    def made():
        opt, _ = engine(proxy="target")
        opt.set_gradient_oracle(oracle)
        drive(opt, f, 3)
        return opt

    opt = made()
    twin = pickle.loads(pickle.dumps(opt))
    with pytest.raises(RuntimeError, match="oracle"):
        twin.ask()
    assert not twin.pending
    twin.set_gradient_oracle(oracle)
    assert drive(twin, f, 3) == drive(opt, f, 3)  # the original kept its oracle


def test_a_truncated_payload_raises_and_builds_nothing() -> None:
    opt, f = engine()
    drive(opt, f, 3)
    data = pickle.dumps(opt, protocol=5)
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises((pickle.UnpicklingError, EOFError), match="truncated|ran out of input"):
            pickle.loads(data[:cut])


def test_a_corrupted_array_is_refused_by_its_checksum() -> None:
    opt, f = engine()
    drive(opt, f, 3)
    data = bytearray(pickle.dumps(opt, protocol=5))
    at = bytes(data).find(opt.x.tobytes())  # the iterate's bytes, in place
    assert at > 0
    data[at + 5] ^= 0x01  # one bit of one coordinate: still a finite float32
    with pytest.raises(ValueError, match="corrupted: its state does not match its checksum"):
        pickle.loads(bytes(data))


def blank() -> optex.OptEx:
    """What pickle makes before __setstate__: an OptEx not yet built."""
    return optex.OptEx.__new__(optex.OptEx)


@pytest.mark.parametrize("payload, message", [
    ((), "not a pickled optex.OptEx"),
    (("optex.OptEx", 1, {}), "not a pickled optex.OptEx"),
    (("another.Class", 1, {}, 0), "not a pickled optex.OptEx"),
    (("optex.OptEx", 99, {}, 0), "pickle format 99 is not one this optex reads"),
    (("optex.OptEx", 1, [], 0), "corrupted \\(no state or no checksum\\)"),
    (("optex.OptEx", 1, {}, -1), "a checksum out of range"),
    (("optex.OptEx", 1, {"x": object()}, 0), "corrupted \\(unexpected value of type object\\)"),
    (("optex.OptEx", 1, {}, 0), "does not match its checksum"),
])
def test_a_payload_that_is_not_one_is_refused_naming_why(payload, message) -> None:
    with pytest.raises(ValueError, match=message):
        blank().__setstate__(payload)


def test_a_state_that_the_engine_refuses_is_named() -> None:
    """A payload with a valid checksum (written by hand) over a state the engine
    refuses: from_state_arrays' error, naming the key; nothing is built."""
    opt, f = engine()
    drive(opt, f, 2)
    kind, version, state, _ = opt.__getstate__()
    state["x"] = np.full_like(state["x"], np.nan)
    with pytest.raises(ValueError, match="^x"):
        blank().__setstate__((kind, version, state, _fnv_state(state)))


def _fnv_state(value) -> int:
    h = 0xCBF29CE484222325

    def feed(data: bytes) -> None:
        nonlocal h
        for byte in data:
            h ^= byte
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF

    def count(n: int) -> None:
        feed(int(n).to_bytes(8, "little"))

    def text(s: str) -> None:
        raw = s.encode()
        count(len(raw))
        feed(raw)

    def add(v) -> None:
        if v is None:
            feed(b"n")
        elif isinstance(v, bool):
            feed(b"b" + (b"1" if v else b"0"))
        elif isinstance(v, int):
            feed(b"i")
            text(str(v))
        elif isinstance(v, float):
            feed(b"f" + np.float64(v).tobytes())
        elif isinstance(v, str):
            feed(b"s")
            text(v)
        elif isinstance(v, np.ndarray):
            feed(b"a")
            text(v.dtype.str)
            count(v.ndim)
            for s in v.shape:
                count(s)
            feed(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, dict):
            feed(b"d")
            count(len(v))
            for k in sorted(v):
                text(k)
                add(v[k])
        else:
            feed(b"l")
            count(len(v))
            for item in v:
                add(item)

    add(value)
    return h


def test_the_checksum_is_the_documented_one() -> None:
    """The Python FNV-1a above is an independent reimplementation: it agrees with the
    engine's on a real state (so the hostile-state test above exercises the engine's
    own refusal, not the checksum's)."""
    opt, f = engine(optimizer=OPTIMIZERS["ranges"])
    drive(opt, f, 3)
    _, _, state, checksum = opt.__getstate__()
    assert _fnv_state(state) == checksum


def test_a_slice_of_a_sharded_engine_is_refused() -> None:
    """Its sums exchange with the other slices and cannot travel: TypeError naming
    state_arrays() and from_state_arrays(shard=), and the slice goes on."""
    from test_shard import Sums, lone_slice

    sliced = lone_slice(Sums())
    before = sliced.state_arrays()
    for attempt in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError, match="a slice of a sharded engine .*from_state_arrays"):
            attempt(sliced)
    assert same_state(sliced.state_arrays(), before)
    sliced.ask()  # still usable
