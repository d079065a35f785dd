"""Mutated checkpoints from Python: refused with RuntimeError or ValueError (or, when a
mutation leaves the file well-formed, a working engine), and a refused load leaves an
existing engine untouched. Paths that name no file are refused before anything is written.
"""

from __future__ import annotations

import os
import pathlib
import stat

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import optex

HEADER = 8 + 4 + 8  # magic, format version, payload size
TRAILER = 8  # FNV-1a of the payload


def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
    scale = np.arange(1, x.size + 1, dtype=np.float32)
    return float(np.sum(scale * x * x)), (2 * scale * x).astype(np.float32)


def step(opt: optex.OptEx) -> None:
    points = opt.ask()
    losses, grads = zip(*(objective(p) for p in points))
    opt.tell(np.stack(grads), np.array(losses))


def engine() -> optex.OptEx:
    opt = optex.OptEx(np.array([0.5, -1.0, 1.5, -0.25], dtype=np.float32),
                      optimizer=optex.Adam(lr=0.05), parallelism=3, history=4, seed=3)
    for _ in range(3):
        step(opt)
    return opt


def snapshot(opt: optex.OptEx) -> tuple:
    return (opt.x.tobytes(), opt.iteration, opt.evaluations, opt.options, opt.optimizer)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def with_checksum(data: bytearray) -> bytes:
    data[-TRAILER:] = fnv1a64(bytes(data[HEADER:-TRAILER])).to_bytes(8, "little")
    return bytes(data)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "good.ckpt"
    engine().save(path)
    return path.read_bytes()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), fix_checksum=st.booleans())
def test_mutated_checkpoints_are_refused_and_leave_an_engine_alone(
        tmp_path: pathlib.Path, saved: bytes, data: st.DataObject, fix_checksum: bool) -> None:
    mutated = bytearray(saved)
    lo, hi = (HEADER, len(saved) - TRAILER) if fix_checksum else (0, len(saved))
    positions = data.draw(st.lists(st.integers(lo, hi - 1), min_size=1, max_size=4))
    for at in positions:
        mutated[at] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(saved) - 1)))
    if cut is not None:
        del mutated[cut:]
    blob = with_checksum(mutated) if fix_checksum and cut is None else bytes(mutated)
    assume(blob != saved)  # two flips of one byte can cancel
    path = tmp_path / "mutated.ckpt"
    path.write_bytes(blob)

    existing = engine()
    before = snapshot(existing)
    try:
        existing = optex.OptEx.load(path)
    except (RuntimeError, ValueError) as error:
        assert "checkpoint" in str(error) or "path" in str(error)
        assert snapshot(existing) == before
        step(existing)  # still runs
        return
    # Still well-formed: only possible once the checksum was recomputed.
    assert fix_checksum and cut is None
    try:
        step(existing)
    except RuntimeError:
        pass  # the fit may refuse statistics that no longer match the points


# engine()'s file: Options with an empty lengthscale grid (95 bytes, the last one the
# proxy distances of format 7), the range count (u32) and the range's size (u64), then
# its step offset (i64, format 5).
PROXY_DISTANCES = HEADER + 94
STEP_OFFSET = HEADER + 95 + 4 + 8


def test_a_proxy_distances_byte_outside_the_enum_is_refused_naming_it(tmp_path: pathlib.Path,
                                                                      saved: bytes) -> None:
    assert saved[PROXY_DISTANCES] == 0  # "direct", the default
    path = tmp_path / "distances.ckpt"
    for bad in (2, 3, 255):
        data = bytearray(saved)
        data[PROXY_DISTANCES] = bad
        path.write_bytes(with_checksum(data))
        existing = engine()
        before = snapshot(existing)
        with pytest.raises(RuntimeError, match=rf"options at byte {HEADER}: proxy_distances: .*got {bad}$"):
            optex.OptEx.load(path)
        assert snapshot(existing) == before
    # 1 is "coefficients": it loads and comes back as that name.
    data = bytearray(saved)
    data[PROXY_DISTANCES] = 1
    path.write_bytes(with_checksum(data))
    loaded = optex.OptEx.load(path)
    assert loaded.options.proxy_distances == "coefficients"
    step(loaded)


def test_a_step_offset_beyond_the_state_step_is_refused_naming_it(tmp_path: pathlib.Path, saved: bytes) -> None:
    state_step = engine().state_arrays()["step"]
    assert int.from_bytes(saved[STEP_OFFSET:STEP_OFFSET + 8], "little", signed=True) == 0
    path = tmp_path / "offset.ckpt"
    for bad in (-1, -(2**63), state_step + 1, 2**63 - 1):
        data = bytearray(saved)
        data[STEP_OFFSET:STEP_OFFSET + 8] = bad.to_bytes(8, "little", signed=True)
        path.write_bytes(with_checksum(data))
        existing = engine()
        before = snapshot(existing)
        with pytest.raises(RuntimeError, match=rf"optimizer range 0 step_offset at byte {STEP_OFFSET}: "):
            optex.OptEx.load(path)
        assert snapshot(existing) == before
    # Within the step it is a value like any other, and comes back.
    data = bytearray(saved)
    data[STEP_OFFSET:STEP_OFFSET + 8] = state_step.to_bytes(8, "little", signed=True)
    path.write_bytes(with_checksum(data))
    loaded = optex.OptEx.load(path)
    assert loaded.optimizer == [(4, optex.Adam(lr=0.05), state_step)]
    step(loaded)
    loaded.save(tmp_path / "again.ckpt")
    assert optex.OptEx.load(tmp_path / "again.ckpt").optimizer == [(4, optex.Adam(lr=0.05), state_step)]


def test_paths_with_a_nul_byte_are_refused(tmp_path: pathlib.Path) -> None:
    opt = engine()
    for path in (str(tmp_path / "run.ckpt") + "\0evil", os.fsencode(tmp_path / "run.ckpt") + b"\0x",
                 ""):
        with pytest.raises(ValueError, match="path"):
            opt.save(path)
    assert list(tmp_path.iterdir()) == []
    opt.save(tmp_path / "run.ckpt")
    for path in (str(tmp_path / "run.ckpt") + "\0x", os.fsencode(tmp_path / "run.ckpt") + b"\0x"):
        with pytest.raises(ValueError, match="path"):
            optex.OptEx.load(path)


def test_non_regular_files_are_refused(tmp_path: pathlib.Path) -> None:
    opt = engine()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RuntimeError, match="is a fifo"):
        opt.save(fifo)
    with pytest.raises(RuntimeError, match="is a fifo, not a regular file"):
        optex.OptEx.load(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    with pytest.raises(RuntimeError, match="is a directory, not a regular file"):
        optex.OptEx.load(tmp_path)
    with pytest.raises(RuntimeError, match="is a character device, not a regular file"):
        optex.OptEx.load("/dev/zero")


def test_a_link_is_followed_and_kept(tmp_path: pathlib.Path) -> None:
    opt = engine()
    opt.save(tmp_path / "target.ckpt")
    (tmp_path / "latest.ckpt").symlink_to("target.ckpt")
    step(opt)
    opt.save(tmp_path / "latest.ckpt")
    assert (tmp_path / "latest.ckpt").is_symlink()
    assert optex.OptEx.load(tmp_path / "target.ckpt").iteration == opt.iteration
