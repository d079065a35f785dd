"""bench/python/torch_round_cost.py: what it writes is well-formed and self-consistent.

A few repetitions only, so the numbers are not a measurement; the test checks their
shape and the relations between them, not timing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the benchmark needs PyTorch")
pytest.importorskip("sklearn", reason="the benchmark needs scikit-learn (the digits data)")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "python" / "torch_round_cost.py"
CASES = ["adam_step", "optex_sequential", "optex_batched", "engine_only", "batched_evaluation",
         "stacked_evaluation"]


def run_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--models", "mlp", "--repetitions", "4", "--warmup", "1",
                           *args], capture_output=True, text=True, timeout=600, check=False)


def test_the_json_result_is_consistent(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    done = run_benchmark("--output", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert doc["threads"] == 1 and doc["parallelism"] == 4 and doc["batch_size"] == 64
    assert doc["dimensions"] == {"mlp": 64 * 32 + 32 + 32 * 10 + 10}
    results = {r["case"]: r for r in doc["results"]}
    assert list(results) == CASES and all(r["model"] == "mlp" for r in doc["results"])
    for clock in ("wall", "thread"):
        adam = results["adam_step"][clock]["median_us"]
        assert results["adam_step"][clock]["ratio_to_adam"] == 1.0
        for case, r in results.items():
            t = r[clock]
            assert 0 < t["q1_us"] <= t["median_us"] <= t["q3_us"] < math.inf, (case, clock)
            assert t["ratio_to_adam"] == pytest.approx(t["median_us"] / adam, rel=1e-9), (case, clock)
    # The printed table has one row per case, and the goal line.
    rows = [line for line in done.stdout.splitlines() if line.startswith("| mlp |")]
    assert [row.split("|")[2].strip() for row in rows] == CASES
    assert "mlp: a batched round costs" in done.stdout


def test_markdown_output_and_bad_arguments(tmp_path: Path) -> None:
    out = tmp_path / "cost.md"
    done = run_benchmark("--output", str(out), "--repetitions", "2")
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.startswith("# optex.torch round cost")
    assert "| mlp | optex_batched |" in text and "2 interleaved repetitions" in text
    for bad in (["--output", str(tmp_path / "cost.txt")], ["--repetitions", "0"], ["--threads", "0"]):
        refused = run_benchmark(*bad)
        assert refused.returncode == 2, bad
        assert "must" in refused.stderr


def test_every_output_is_written(tmp_path: Path) -> None:
    table, numbers = tmp_path / "cost.md", tmp_path / "cost.json"
    done = run_benchmark("--output", str(table), "--output", str(numbers), "--repetitions", "2")
    assert done.returncode == 0, done.stderr
    assert table.read_text().startswith("# optex.torch round cost")
    doc = json.loads(numbers.read_text())
    assert doc["device"] == "cpu" and doc["repetitions"] == 2


def test_cuda_without_a_device_torch_sees_is_refused() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here")
    refused = run_benchmark("--device", "cuda")
    assert refused.returncode == 2
    assert "--device cuda: torch sees no CUDA device here" in refused.stderr


@pytest.mark.gpu
def test_on_cuda_tensors_the_result_is_consistent(tmp_path: Path) -> None:
    from conftest import require_torch_cuda

    require_torch_cuda(optex_build=False)
    import torch

    out = tmp_path / "cost.json"
    done = run_benchmark("--device", "cuda", "--output", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["device"] == torch.cuda.get_device_name()
    results = {r["case"]: r for r in doc["results"]}
    assert list(results) == CASES
    assert all(0 < r["wall"]["median_us"] < math.inf for r in results.values())
