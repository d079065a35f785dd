"""bench/python/copy_cost.py: what it writes is well-formed, and its "no copies"
variant is minimize without the copies (and only within its blocks).

A few rounds only, so the numbers are not a measurement; the test checks their shape.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import optex
from optex import _evaluation, _rounds

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "python" / "copy_cost.py"


def load_script():
    spec = importlib.util.spec_from_file_location("copy_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_json_result_has_every_round_of_both_variants(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dims", "1000", "3000", "--block", "3",
                           "--repetitions", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["parallelism"] == 4 and doc["history"] == 32
    assert [row["dim"] for row in doc["rows"]] == [1000, 3000]
    for row in doc["rows"]:
        for variant in ("copies", "no copies"):
            q = row[variant]
            assert q["rounds"] == 2 * 3  # the warm-up block left out
            assert 0 < q["q1"] <= q["median"] <= q["q3"]
        assert row["copies alone"]["median"] > 0
    assert "| 1e3 |" in done.stdout and "the 2 N copies alone" in done.stdout


def test_no_copies_is_minimize_before_it_copied_and_only_inside_the_block() -> None:
    bench = load_script()
    kept = []

    def keeps(x):
        kept.append(x)
        return bench.quadratic(x)

    engine = optex.OptEx(np.zeros(5, np.float32), optex.Sgd(lr=0.05), parallelism=2, seed=0)
    with bench.without_copies():
        optex.minimize(keeps, engine, max_iters=3)
    # Without the copies the objective saw the engine's own rows (its kept points alias).
    assert any(np.shares_memory(a, b) for a in kept for b in kept if a is not b)
    assert _rounds.objective_point is _evaluation.objective_point  # restored
    assert _evaluation.owned_gradient.__name__ == "owned_gradient"
    kept.clear()
    optex.minimize(keeps, engine, max_iters=6)
    assert not any(np.shares_memory(a, b) for a in kept for b in kept if a is not b)
