"""What the tests of the Python benchmark runners share: running one through its command line.

``run_ci_preset("rl.py", out, "--methods", ...)`` runs ``bench/python/<script>
--preset ci --quiet --json out`` plus any extra flags in a new process, fails
the test with the runner's stderr unless it exits 0, and returns the document
it wrote, parsed as strict JSON (no NaN or Infinity). ``runs_of`` groups a
document's records by run, in the file's order (so tests can check that order).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_PYTHON = Path(__file__).resolve().parents[2] / "bench" / "python"


def run_ci_preset(script: str, out: Path, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(BENCH_PYTHON / script), "--preset", "ci", "--quiet", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def runs_of(doc: dict) -> dict[tuple, list[dict]]:
    """(task, parallelism, method, seed) -> that run's records, in file order."""
    runs: dict[tuple, list[dict]] = {}
    for r in doc["records"]:
        runs.setdefault((r["task"], r["parallelism"], r["method"], r["seed"]), []).append(r)
    return runs
