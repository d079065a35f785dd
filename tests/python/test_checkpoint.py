"""Checkpoints from Python: a restored run continues bit for bit; bad files are refused."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from conftest import float_hex, run_iterations

import optex
from optex import problems


def engine() -> tuple[optex.OptEx, problems.Problem]:
    f = problems.Rastrigin()
    opt = optex.OptEx(f.standard_start(12), optimizer=optex.Sgd(lr=2e-3, momentum=0.9),
                      parallelism=4, history=10, seed=21)
    return opt, f


def trajectory(opt: optex.OptEx, f: problems.Problem, iterations: int) -> list[str]:
    out = []
    for info in run_iterations(opt, f, iterations):
        out.append(float_hex(opt.x) + f"/{info.loss!r}/{info.lengthscale!r}/{info.cosine!r}")
    return out


@pytest.mark.parametrize("as_str", [False, True])
def test_round_trip_continues_bit_for_bit(tmp_path: pathlib.Path, as_str: bool) -> None:
    opt, f = engine()
    trajectory(opt, f, 6)
    path = tmp_path / "run.ckpt"
    opt.save(str(path) if as_str else path)
    expected = trajectory(opt, f, 8)
    restored = optex.OptEx.load(str(path) if as_str else path)
    assert restored.iteration == 6
    assert restored.options == opt.options
    assert restored.optimizer == opt.optimizer
    assert trajectory(restored, f, 8) == expected
    assert np.array_equal(restored.x, opt.x)
    assert restored.evaluations == opt.evaluations


def test_round_trip_keeps_the_seeds(tmp_path: pathlib.Path) -> None:
    opt, f = engine()
    trajectory(opt, f, 2)
    opt.save(tmp_path / "run.ckpt")
    opt.ask()
    restored = optex.OptEx.load(tmp_path / "run.ckpt")
    restored.ask()
    assert np.array_equal(restored.seeds, opt.seeds)


def test_load_on_the_cpu_explicitly(tmp_path: pathlib.Path) -> None:
    opt, f = engine()
    trajectory(opt, f, 3)
    opt.save(tmp_path / "run.ckpt")
    expected = trajectory(opt, f, 3)
    restored = optex.OptEx.load(tmp_path / "run.ckpt", device="cpu", history_precision="fp32")
    assert trajectory(restored, f, 3) == expected


def test_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RuntimeError, match="cannot open for reading"):
        optex.OptEx.load(tmp_path / "nothing.ckpt")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "size mismatch|truncated"),
        (lambda b: b[:5], "too short to be an optex checkpoint"),
        (lambda b: b"NOTOPTEX" + b[8:], "bad magic number"),
        (lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:], "checksum mismatch"),
        (lambda b: b + b"\0", "size mismatch"),
    ],
)
def test_damaged_files_are_refused(tmp_path: pathlib.Path, damage, message) -> None:
    opt, f = engine()
    trajectory(opt, f, 2)
    path = tmp_path / "run.ckpt"
    opt.save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(RuntimeError, match=message):
        optex.OptEx.load(path)


def test_bf16_on_the_cpu_is_refused(tmp_path: pathlib.Path) -> None:
    opt, _ = engine()
    opt.save(tmp_path / "run.ckpt")
    with pytest.raises(ValueError, match="history_precision"):
        optex.OptEx.load(tmp_path / "run.ckpt", history_precision="bf16")


def several_evaluations_run() -> tuple[optex.OptEx, problems.Problem]:
    """Points with two evaluations, the adaptive split, best-loss commits and both
    safeguards: everything checkpoint format 4 added."""
    f = problems.WithGradientNoise(problems.Rastrigin(), 0.5, seed=3)
    options = optex.Options.adaptive(6)
    options.evaluations_per_point = 2
    options.trust_region = 3.0
    options.max_posterior_variance = 0.9
    return optex.OptEx(f.standard_start(8), optimizer=optex.Adam(lr=0.01), options=options), f


def rounds_of(opt: optex.OptEx, f: problems.Problem, iterations: int) -> list[str]:
    return [float_hex(opt.x) + repr(info) for info in run_iterations(opt, f, iterations)]


def test_round_trip_with_several_evaluations_per_point(tmp_path: pathlib.Path) -> None:
    opt, f = several_evaluations_run()
    rounds_of(opt, f, 7)
    opt.save(tmp_path / "run.ckpt")
    expected = rounds_of(opt, f, 10)
    restored = optex.OptEx.load(tmp_path / "run.ckpt")
    assert restored.options == opt.options
    assert restored.options.evaluations_per_point == 2 and restored.options.strategy == "adaptive"
    assert rounds_of(restored, f, 10) == expected  # the adaptive split's state came along


@pytest.mark.gpu
def test_a_run_with_several_evaluations_per_point_moves_to_a_device(tmp_path: pathlib.Path) -> None:
    opt, f = several_evaluations_run()
    rounds_of(opt, f, 3)
    opt.save(tmp_path / "run.ckpt")
    expected = rounds_of(opt, f, 4)
    # Without a GPU the device is refused; with one, every feature comes along.
    if optex.cuda_device_count() == 0:
        with pytest.raises(ValueError, match="^device: cuda:0 is not available"):
            optex.OptEx.load(tmp_path / "run.ckpt", device="cuda")
    else:
        on_gpu = optex.OptEx.load(tmp_path / "run.ckpt", device="cuda")
        assert on_gpu.options.evaluations_per_point == 2
        rounds_of(on_gpu, f, 4)
        assert np.all(np.isfinite(on_gpu.x))
    restored = optex.OptEx.load(tmp_path / "run.ckpt")  # the file is as it was
    assert rounds_of(restored, f, 4) == expected
