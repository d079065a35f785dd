"""CI runs every torch test: with OPTEX_REQUIRE_TORCH=1 (scripts/test.sh sets it), a
test skipped for lack of PyTorch fails the run (the hooks in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SKIPS_FOR_TORCH = '''
import pytest
pytest.importorskip("a_module_that_does_not_exist", reason="optex.torch needs PyTorch (pip install torch)")

def test_never_runs():
    pass
'''

SKIPS_FOR_OTHER_REASONS = '''
import pytest

@pytest.mark.skip(reason="needs a CUDA device")
def test_skipped():
    pass

def test_runs():
    assert 1 + 1 == 2
'''


def run_pytest(tmp_path: Path, source: str, require: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "OPTEX_REQUIRE_TORCH"}
    if require is not None:
        env["OPTEX_REQUIRE_TORCH"] = require
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, timeout=120, check=False, env=env, cwd=tmp_path,
    )


def test_a_skip_for_lack_of_torch_fails_when_torch_is_required(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, SKIPS_FOR_TORCH, "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "skipped for lack of PyTorch" in done.stdout


def test_without_the_requirement_the_skip_is_a_skip(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, SKIPS_FOR_TORCH, None)
    # 5: pytest's "no tests ran" (the module skipped whole), not a failure.
    assert done.returncode == 5, done.stdout + done.stderr
    assert "1 skipped" in done.stdout


def test_other_skips_stay_skips_when_torch_is_required(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, SKIPS_FOR_OTHER_REASONS, "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout


@pytest.mark.skipif(os.environ.get("OPTEX_REQUIRE_TORCH") != "1", reason="only where torch is required")
def test_torch_imports_where_it_is_required() -> None:
    import torch

    assert torch.tensor([1.0, 2.0]).sum().item() == 3.0
