"""Shared helpers of the Python tests.

The bit-for-bit comparisons run the C++ reference program
(tests/python/reference_trajectory.cpp, target optex_reference_trajectory)
named by the environment variable OPTEX_REFERENCE_TRAJECTORY; ctest and
scripts/test.sh set it. Without it those tests skip and say why.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    # Only the annotations name optex: the tests that need no build (the benchmark
    # tools', the design document's) still run where the package is not installed.
    import optex

REPO_ROOT = Path(__file__).resolve().parents[2]


def float_hex(values: np.ndarray) -> str:
    """The reference program's spelling of a float32 array: 8 hex digits per element."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return "".join(f"{b:08x}" for b in bits.tolist())


def double_hex(value: float) -> str:
    """16 hex digits of a float64's bits."""
    (bits,) = np.array([value], dtype=np.float64).view(np.uint64).tolist()
    return f"{bits:016x}"


def parse_floats(text: str) -> np.ndarray:
    """The inverse of float_hex."""
    words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
    return np.array(words, dtype=np.uint32).view(np.float32)


@dataclass(frozen=True)
class Reference:
    """Runs the C++ reference program."""

    path: str

    def run(self, mode: str, **args: object) -> list[dict[str, str]]:
        """One dict per output line, key=value fields."""
        command = [self.path, mode] + [f"{k}={v}" for k, v in args.items()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"{command} failed: {done.stderr}"
        return [dict(field.split("=", 1) for field in line.split()) for line in done.stdout.splitlines()]


@pytest.fixture(scope="session")
def reference() -> Reference:
    path = os.environ.get("OPTEX_REFERENCE_TRAJECTORY")
    if not path:
        pytest.skip(
            "OPTEX_REFERENCE_TRAJECTORY is not set: build the C++ reference program "
            "(target optex_reference_trajectory, with -DOPTEX_BUILD_TESTS=ON) and point "
            "the variable at it (ctest and scripts/test.sh do)"
        )
    if not os.access(path, os.X_OK):
        pytest.fail(f"OPTEX_REFERENCE_TRAJECTORY={path} is not an executable file")
    return Reference(path)


def snapshot(opt: optex.OptEx) -> tuple:
    """Everything observable that an error must leave unchanged."""
    return (
        float_hex(opt.x),
        opt.iteration,
        opt.evaluations,
        opt.pending,
        double_hex(opt.lengthscale),
    )


def run_iterations(opt: optex.OptEx, problem: optex.problems.Problem, iterations: int) -> list:
    """Plain ask/tell with the problem's gradients; returns the infos."""
    infos = []
    for _ in range(iterations):
        points = opt.ask()
        losses, grads = problem.value_and_grad(points)
        infos.append(opt.tell(grads, losses))
    return infos


# OPTEX_REQUIRE_TORCH=1 (scripts/test.sh sets it, and so CI): a test that skips
# because PyTorch is missing fails the run instead, so that the torch tests
# cannot go quietly unrun.
_REQUIRE_TORCH = os.environ.get("OPTEX_REQUIRE_TORCH") == "1"
_torch_skips: list[str] = []


def _skipped_for_torch(report: pytest.CollectReport | pytest.TestReport) -> bool:
    if not report.skipped:
        return False
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "pytorch" in reason.lower() or "no module named 'torch'" in reason.lower()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _REQUIRE_TORCH and _skipped_for_torch(report):
        _torch_skips.append(report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _REQUIRE_TORCH and _skipped_for_torch(report):
        _torch_skips.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _torch_skips:
        session.exitstatus = 1
        print(
            f"\nOPTEX_REQUIRE_TORCH=1, but {len(_torch_skips)} test(s) skipped for lack of PyTorch: "
            + ", ".join(_torch_skips[:5])
        )


# ---------------------------------------------------------------------------- GPU tests
# A test marked gpu exercises the CUDA build: the engine on a device, its DLPack rows,
# optex.torch on CUDA tensors. Without a GPU it skips and says why; with
# OPTEX_REQUIRE_GPU=1 (as for the C++ GPU suites, and as tier 4 of
# scripts/gpu-check.sh sets) the skip is a failure, so that a GPU run cannot pass by
# skipping. `pytest -m gpu` selects them.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: exercises the CUDA build (pytest -m gpu; "
                            "OPTEX_REQUIRE_GPU=1 turns their skips into failures)")


def gpu_required() -> bool:
    return os.environ.get("OPTEX_REQUIRE_GPU", "0") not in ("", "0")


def skip_or_fail_without_gpu(why: str) -> None:
    if gpu_required():
        pytest.fail(f"{why}, but OPTEX_REQUIRE_GPU is set: a GPU run must not skip")
    pytest.skip(f"{why}; set OPTEX_REQUIRE_GPU=1 to make this a failure")


def require_optex_cuda() -> None:
    """A CUDA device that this optex build can use."""
    import optex

    if optex.cuda_device_count() == 0:
        skip_or_fail_without_gpu(f"no CUDA device (built_with_cuda={optex.built_with_cuda()}, "
                                 f"devices={optex.cuda_device_count()})")


def require_torch_cuda(*, optex_build: bool) -> None:
    """A CUDA device that PyTorch sees, and with optex_build, this optex built with CUDA."""
    import torch

    import optex

    if not torch.cuda.is_available():
        skip_or_fail_without_gpu("no CUDA device visible to torch")
    if optex_build and not optex.built_with_cuda():
        skip_or_fail_without_gpu("this optex was built without CUDA")
