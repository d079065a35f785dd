"""The verified-mode benchmark (bench/python/verified_mode.py) on its ci preset, and its pieces.

Checked: the ci preset runs through the command line in seconds and writes every
problem x method x seed; committed steps per round lie in [1, 8] and add up to the
total; at tolerance 0 the distance to the sequential trajectory is exactly 0 and no
disagreement is accepted, above it none beyond the tolerance; on the deterministic
problems tolerance 0 reaches the target no later than vanilla (same trajectory, at
least one step per round); the markdown has one row per method and problem. The
sequential reference itself: equal to a tolerance-0 run bit for bit, different one
step short. No speed is asserted.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import optex

from bench_runners import BENCH_PYTHON, run_ci_preset

sys.path.insert(0, str(BENCH_PYTHON))

import verified_mode  # noqa: E402

CI = verified_mode.PRESETS["ci"]


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("verified_mode")
    doc = run_ci_preset("verified_mode.py", out / "ci.json", "--markdown", str(out / "ci.md"))
    return doc, (out / "ci.md").read_text()


def test_every_problem_method_and_seed(ci_run) -> None:
    doc, _ = ci_run
    assert doc["schema"] == "optex-verified-mode/1" and doc["preset"] == "ci"
    assert doc["config"]["problems"] == CI["problems"] == list(verified_mode.PROBLEMS)
    expected = {(p, m, s) for p in CI["problems"] for m in verified_mode.method_names(verified_mode.PROBLEMS[p])
                for s in range(CI["seeds"])}
    runs = doc["runs"]
    assert {(r["problem"], r["method"], r["seed"]) for r in runs} == expected and len(runs) == len(expected)
    assert {(e["problem"], e["method"]) for e in doc["summary"]} == {k[:2] for k in expected}
    methods = {m for _, m, _ in expected}
    assert {"vanilla", "vanilla_nlr", "line_search", "data_parallel", "optex_default", "target", "verified_0",
            "verified_1e-06", "verified_0.0001", "verified_0.01"} == methods
    for p in CI["problems"]:
        definition = doc["config"]["problem_definitions"][p]
        assert definition["lr"] in CI["lr_grid"]
        assert definition["target"] == sorted(definition["vanilla_final_losses"])[CI["seeds"] // 2]
    for r in runs:
        lr = doc["config"]["problem_definitions"][r["problem"]]["lr"]
        assert r["lr"] == pytest.approx(lr * (8 if r["method"] == "vanilla_nlr" else 1))
        assert (r["rounds"] is None) == (not r["reached"])
        assert r["rounds"] is None or 1 <= r["rounds"] == r["rounds_run"]


def test_committed_steps_per_round_lie_in_1_to_8(ci_run) -> None:
    doc, _ = ci_run
    verified = [r for r in doc["runs"] if r["method"].startswith("verified_")]
    assert len(verified) == len(CI["problems"]) * 4 * CI["seeds"]
    for r in verified:
        assert 1 <= r["steps_min"] <= r["steps_median"] <= r["steps_max"] <= 8, r
        assert r["rounds_run"] <= r["total_steps"] <= 8 * r["rounds_run"], r
        assert r["steps_mean"] * r["rounds_run"] == pytest.approx(r["total_steps"])


def test_tolerance_zero_is_the_sequential_trajectory(ci_run) -> None:
    doc, _ = ci_run
    for r in doc["runs"]:
        if r["method"] == "verified_0":
            assert r["distance"] == 0.0 and r["max_disagreement"] == 0.0, r
        elif r["method"].startswith("verified_"):
            tolerance = float(r["method"][len("verified_"):])
            assert 0.0 <= r["max_disagreement"] <= tolerance and math.isfinite(r["distance"]), r


def test_tolerance_zero_is_never_later_than_vanilla(ci_run) -> None:
    doc, _ = ci_run
    rounds = {(r["problem"], r["method"], r["seed"]): r["rounds"] for r in doc["runs"]}
    for (problem, method, seed), vanilla in rounds.items():
        if method != "vanilla" or vanilla is None or verified_mode.PROBLEMS[problem].noise > 0:
            continue
        exact = rounds[(problem, "verified_0", seed)]
        assert exact is not None and exact <= vanilla, (problem, seed)


def test_markdown_has_a_row_per_method(ci_run) -> None:
    _, md = ci_run
    sections = md.split("### ")[1:]
    assert [s.split(":", 1)[0] for s in sections] == CI["problems"]
    for section in sections:
        problem = section.split(":", 1)[0]
        methods = verified_mode.method_names(verified_mode.PROBLEMS[problem])
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert [line.split("`")[1] for line in rows] == methods
        assert f"**{problem}**:" in section
        exact = next(line for line in rows if line.startswith("| `verified_0` |"))
        assert exact.endswith("| 0 [0] |")  # its distance to the sequential trajectory, median [max]


def test_sequential_reference_matches_a_tolerance_zero_run_bit_for_bit() -> None:
    objective = verified_mode.Objective(verified_mode.PROBLEMS["rosenbrock"])
    x0 = objective.start(3)
    options = optex.Options.verified(8, 0.0)
    run = verified_mode.RecordedOptEx(x0, verified_mode.BaseOptimizer("adam", 0.01), 8, 0, options=options)
    for _ in range(10):
        run.run_round(objective.evaluate)
    steps = len(run.step_seeds)
    assert steps == sum(info.committed_steps for info in run.infos) > 10  # some round committed several
    x = np.asarray(run.iterate)
    assert np.array_equal(verified_mode.sequential_iterate(objective, x0, 0.01, run.step_seeds), x)
    assert not np.array_equal(verified_mode.sequential_iterate(objective, x0, 0.01, run.step_seeds[:-1]), x)


def test_seeds_perturb_deterministic_starts_only() -> None:
    sphere = verified_mode.Objective(verified_mode.PROBLEMS["sphere"])
    noisy = verified_mode.Objective(verified_mode.PROBLEMS["noisy_sphere"])
    assert not np.array_equal(sphere.start(0), sphere.start(1))
    assert 0 < np.abs(sphere.start(0) - 1.0).max() < 0.1
    assert np.array_equal(noisy.start(0), noisy.start(1))
    x = noisy.start(0)
    assert not np.array_equal(noisy(x, 1).grad, noisy(x, 2).grad) and noisy(x, 1).loss == noisy(x, 2).loss
