"""The Python binding of a CUDA engine (device='cuda').

Skips without a CUDA device, with the reason; with OPTEX_REQUIRE_GPU=1 (as for
the C++ GPU suites) a missing device is a failure, so that a GPU run cannot
pass by skipping.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import float_hex, require_optex_cuda, run_iterations

import optex
from optex import problems

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def cuda_device() -> None:
    require_optex_cuda()


def test_ask_is_a_read_only_view_of_the_host_copy() -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(100), optimizer=optex.Adam(lr=1e-2), parallelism=4,
                      device="cuda")
    assert opt.options.device == "cuda:0"
    first = opt.ask()
    assert first.shape == (4, 100) and not first.flags.writeable
    assert opt.ask().ctypes.data == first.ctypes.data
    losses, grads = f.value_and_grad(first)
    opt.tell(grads.astype(np.float64), losses)
    second = opt.ask()
    assert second.ctypes.data == first.ctypes.data  # refreshed in place
    assert np.array_equal(second[0], opt.x)


def test_device_rows_live_on_the_gpu() -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(100), optimizer=optex.Adam(lr=1e-2), parallelism=4,
                      device="cuda")
    points = opt.device_points()
    assert points.device == "cuda:0" and points.__dlpack_device__() == (2, 0)
    assert points.shape == (4, 100) and not points.writable
    grads = opt.device_grads()
    assert grads.device == "cuda:0" and grads.writable
    assert opt.device_x().__dlpack_device__() == (2, 0)
    with pytest.raises(BufferError, match="dl_device"):
        points.__dlpack__(dl_device=(1, 0))


def test_parallelism_one_matches_the_cpu_bit_for_bit() -> None:
    # N = 1: one elementwise update per iteration, compiled without FMA on both
    # sides (tests/backend/test_cuda.cpp, test 1).
    f = problems.Rosenbrock()
    x0 = f.standard_start(1000)
    cpu = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=1)
    gpu = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=1, device="cuda")
    for _ in range(20):
        run_iterations(cpu, f, 1)
        run_iterations(gpu, f, 1)
        assert float_hex(gpu.x) == float_hex(cpu.x)


def test_trajectories_match_the_cpu_closely() -> None:
    # Tolerance as tests/backend/test_cuda.cpp (TrajectoriesMatchTheCpu): 1e-3 relative
    # after 25 iterations; the reductions differ in the last bits.
    f = problems.Sphere()
    x0 = problems.uniform_start(1000, -1.0, 1.0, 3)
    cpu = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=4)
    gpu = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=4, device="cuda")
    run_iterations(cpu, f, 25)
    run_iterations(gpu, f, 25)
    rel = np.linalg.norm(gpu.x - cpu.x) / np.linalg.norm(cpu.x)
    assert rel < 1e-3


def test_checkpoint_moves_to_the_cpu_and_bf16(tmp_path) -> None:
    f = problems.Levy()
    opt = optex.OptEx(f.standard_start(200), optimizer=optex.Sgd(lr=1e-3, momentum=0.9),
                      parallelism=3, device="cuda", history_precision="bf16_gradients")
    assert opt.options.history_precision == "bf16_gradients"
    run_iterations(opt, f, 5)
    opt.save(tmp_path / "gpu.ckpt")
    on_cpu = optex.OptEx.load(tmp_path / "gpu.ckpt", device="cpu")
    assert on_cpu.options.device == "cpu" and on_cpu.options.history_precision == "fp32"
    assert np.array_equal(on_cpu.x, opt.x)
    run_iterations(on_cpu, f, 3)
    bf16 = optex.OptEx.load(tmp_path / "gpu.ckpt", history_precision="bf16")
    assert bf16.options.history_precision == "bf16"
    run_iterations(bf16, f, 3)


def test_bad_gradients_leave_a_device_engine_unchanged() -> None:
    f = problems.Sphere()
    opt = optex.OptEx(np.ones(50), parallelism=2, device="cuda")
    run_iterations(opt, f, 2)
    x, iteration = opt.x, opt.iteration
    losses, grads = f.value_and_grad(opt.ask())
    grads[1, 7] = np.nan
    with pytest.raises(ValueError, match="grads: row 1, column 7 is nan"):
        opt.tell(grads, losses)
    assert np.array_equal(opt.x, x) and opt.iteration == iteration and opt.pending
    info = opt.tell(grads, losses, drop_nonfinite=True)
    assert info.dropped == 1 and info.committed_point == 0
