"""The stragglers benchmark runner (bench/python/stragglers.py) on a tiny config, and its pieces.

Checked: the ci preset runs through the command line in seconds and writes the
document it promises (every run, summary row and verdict, strict JSON, the
markdown tables); the baselines' round times on a VirtualClockExecutor with scripted
durations equal the schedules computed by hand (one worker 4x slower: waiting for
all pays it every round, K-of-N rounds carry its queued evaluations into the next
round); the verdict rule; reproducibility. No speed is asserted.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import optex  # noqa: F401
from optex.executors import VirtualClockExecutor

from bench_runners import BENCH_PYTHON

sys.path.insert(0, str(BENCH_PYTHON))

import stragglers  # noqa: E402

N, K = 8, 7
OPTEX_READY = stragglers.minimize_supports_stragglers()
BASELINES = ["vanilla", "vanilla_nlr", "data_parallel", "data_parallel_k7", "line_search", "line_search_k7"]


def one_slow_worker(task: int, worker: int) -> float:
    """Workers 0-6 take 1 s, worker 7 takes 4 s."""
    return 4.0 if worker == N - 1 else 1.0


def round_times(method: str, problem: str = "noisy_sphere", rounds: int = 6) -> list[float]:
    ex = VirtualClockExecutor(N, one_slow_worker)
    objective = stragglers.Objective(problem)
    x0 = objective.base().standard_start(20)
    trace = stragglers.run_baseline(method, objective, x0, 0.01, N, K, ex, 0, rounds, -math.inf)
    assert len(trace.losses) == rounds and all(math.isfinite(v) for v in trace.losses)
    return trace.times


def test_vanilla_runs_on_one_typical_worker() -> None:
    assert round_times("vanilla") == [1, 2, 3, 4, 5, 6]
    assert round_times("vanilla_nlr") == [1, 2, 3, 4, 5, 6]


def test_waiting_for_all_pays_the_slow_worker_every_round() -> None:
    assert round_times("data_parallel") == [4, 8, 12, 16, 20, 24]
    # The line search's first round evaluates only the start (1 s on worker 0).
    assert round_times("line_search") == [1, 5, 9, 13, 17, 21]


def test_k_of_n_rounds_carry_queued_evaluations_over() -> None:
    # Round 1 closes at 1 (workers 0-6); worker 7 is busy until 4. Round 2: 7 evaluations
    # start at 1, the 8th queues and starts at 2 on worker 0 (it has begun when round 2
    # closes at 2, so it cannot be cancelled): round 3 finds 6 free workers, its 7th result
    # comes at 4. Round 4 starts with every worker free: the pattern repeats every 4 s.
    assert round_times("data_parallel_k7") == [1, 2, 4, 5, 6, 8]
    # Round 1: the start alone [0, 1]; round 2 from 1: worker 7 busy until 5; round 3's
    # 8th evaluation queues to worker 0 [3, 4]; round 4 gets 6 results at 4, the 7th at 5.
    assert round_times("line_search_k7", rounds=7) == [1, 2, 3, 5, 6, 7, 9]


def test_k_of_n_baseline_uses_only_what_arrived() -> None:
    # The mean of 7 gradients is not the mean of 8: the K-of-N run must differ from the
    # wait-for-all run on a noisy problem (same evaluation seeds), and equal it with N = K.
    def final_x(method: str, k: int) -> np.ndarray:
        ex = VirtualClockExecutor(N, one_slow_worker)
        objective = stragglers.Objective("noisy_sphere")
        x0 = objective.base().standard_start(20)
        trace = stragglers.run_baseline(method, objective, x0, 0.01, N, k, ex, 0, 3, -math.inf)
        return np.array(trace.losses)

    all_n = final_x("data_parallel", K)
    assert not np.array_equal(final_x("data_parallel_k7", K), all_n)
    assert np.array_equal(final_x("data_parallel_k8", N), all_n)


def test_runs_stop_at_the_target() -> None:
    ex = VirtualClockExecutor(N, one_slow_worker)
    objective = stragglers.Objective("sphere")
    x0 = objective.base().standard_start(20)
    full = stragglers.run_baseline("vanilla", objective, x0, 0.1, N, K, VirtualClockExecutor(N, one_slow_worker),
                                   0, 30, -math.inf)
    target = full.losses[11]
    stopped = stragglers.run_baseline("vanilla", objective, x0, 0.1, N, K, ex, 0, 30, target)
    first = next(i for i, v in enumerate(full.losses) if v <= target)
    assert len(stopped.losses) == first + 1 and stopped.losses == full.losses[: first + 1]


@pytest.mark.skipif(not OPTEX_READY, reason="optex.minimize without min_results / OptEx.observe yet")
def test_optex_k_of_n_round_times_follow_the_same_schedule() -> None:
    ex = VirtualClockExecutor(N, one_slow_worker)
    objective = stragglers.Objective("sphere")
    x0 = objective.base().standard_start(20)
    trace = stragglers.run_optex("optex_k7", objective, x0, 0.01, N, K, 1.5, ex, 0, 6, -math.inf)
    assert trace.times == [1, 2, 4, 5, 6, 8]
    # Rounds 1, 2, 4 and 5 commit without one row; rounds 3 and 6 get all 8 at once (their
    # last two results arrive together). Every dropped evaluation arrives later: observed.
    assert trace.dropped == 4 and trace.observed == 4
    ex = VirtualClockExecutor(N, one_slow_worker)
    trace = stragglers.run_optex("optex_wait_all", objective, x0, 0.01, N, K, 1.5, ex, 0, 3, -math.inf)
    assert trace.times == [4, 8, 12] and trace.dropped == 0


def test_verdict_rule() -> None:
    def entry(q1, median, q3):
        return {"virtual_seconds_to_target": {"q1": q1, "median": median, "q3": q3}}

    assert stragglers.verdict(entry(1, 2, 3), entry(4, 5, 6)) == "win"
    assert stragglers.verdict(entry(4, 5, 6), entry(1, 2, 3)) == "loss"
    assert stragglers.verdict(entry(1, 2, 4), entry(4, 5, 6)) == "no clear difference"
    assert stragglers.verdict(entry(1, 2, 3), entry(4, None, None)) == "win"  # never reached: +inf
    assert stragglers.verdict(entry(None, None, None), entry(None, None, None)) == "no clear difference"


def test_executor_seed_depends_on_seed_and_scenario_only() -> None:
    assert stragglers.executor_seed(3, "one_slow") == stragglers.executor_seed(3, "one_slow")
    assert len({stragglers.executor_seed(s, sc) for s in range(3) for sc in stragglers.SCENARIOS}) == 9


def test_quick_and_bad_flags() -> None:
    args = stragglers.parse_args(["--quick", "--methods", *BASELINES])
    assert args.seeds == 3 and args.tuning_seeds == 1 and args.parallelism == 8 and args.min_results == 7
    for bad in (["--min-results", "9"], ["--parallelism", "1"], ["--timeout-factor", "0"],
                ["--methods", "optex_k3"], ["--jobs", "0"]):
        with pytest.raises(SystemExit):
            stragglers.parse_args(bad)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("stragglers")
    methods = [] if OPTEX_READY else ["--methods", *BASELINES]
    done = subprocess.run(
        [sys.executable, str(BENCH_PYTHON / "stragglers.py"), "--preset", "ci", "--quiet",
         "--json", str(out / "ci.json"), "--markdown", str(out / "ci.md"), *methods],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "ci.json").read_text(),
                     parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    return doc, (out / "ci.md").read_text()


def test_ci_document(ci_run) -> None:
    doc, md = ci_run
    ci = stragglers.PRESETS["ci"]
    assert doc["schema"] == "optex-stragglers/1" and doc["runner"] == "stragglers" and doc["preset"] == "ci"
    config = doc["config"]
    assert (config["parallelism"], config["min_results"]) == (8, 7)
    assert config["round_timeout"] == 1.5
    assert config["problems"] == ci["problems"] and config["scenarios"] == ci["scenarios"]
    assert config["scenario_definitions"]["one_slow"]["slow_workers"] == {"7": 4.0}
    methods = config["methods"]
    if OPTEX_READY:
        assert methods == stragglers.method_names(8, 7)
    expected = {(p, s, m, seed) for p in ci["problems"] for s in ci["scenarios"] for m in methods
                for seed in range(ci["seeds"]) if p == "noisy_sphere" or not m.startswith("data_parallel")}
    runs = doc["runs"]
    assert {(r["problem"], r["scenario"], r["method"], r["seed"]) for r in runs} == expected
    assert len(runs) == len(expected)
    for p in ci["problems"]:
        definition = config["problem_definitions"][p]
        assert definition["lr"] in ci["lr_grid"]
        assert len(definition["vanilla_final_losses"]) == ci["seeds"]
        assert definition["target"] == sorted(definition["vanilla_final_losses"])[ci["seeds"] // 2]
    for r in runs:
        assert r["rounds_run"] >= 1 and r["virtual_seconds_run"] > 0
        if r["reached"]:
            assert r["rounds"] <= r["rounds_run"] and 0 < r["virtual_seconds"] <= r["virtual_seconds_run"]
            assert r["evaluations"] >= r["rounds"]
        else:
            assert r["rounds"] is None and r["virtual_seconds"] is None
        expected_lr = config["problem_definitions"][r["problem"]]["lr"] * (8 if r["method"] == "vanilla_nlr" else 1)
        assert r["lr"] == pytest.approx(expected_lr)
    # vanilla reaches its own target at its last budget round on at least half of the seeds
    vanilla = [r for r in runs if r["method"] == "vanilla"]
    assert sum(r["reached"] for r in vanilla) >= len(vanilla) / 2
    assert {(e["problem"], e["scenario"], e["method"]) for e in doc["summary"]} == {k[:3] for k in expected}
    for e in doc["summary"]:
        q = e["virtual_seconds_to_target"]
        if q["median"] is not None:
            assert q["q1"] <= q["median"] <= (q["q3"] if q["q3"] is not None else math.inf)
    if OPTEX_READY:
        verdicts = {(c["problem"], c["method"]) for c in doc["comparisons"]}
        assert ("sphere", "optex_k7") in verdicts and ("noisy_sphere", "optex_timeout") in verdicts
        assert all(c.get("vs_wait_all", "win") in ("win", "loss", "no clear difference") for c in doc["comparisons"])
    assert "**one_slow**" in md and "| sphere |" in md and "`vanilla`" in md


def test_reproducible(ci_run) -> None:
    doc, _ = ci_run
    again = stragglers.main(["--preset", "ci", "--quiet", "--seeds", "2", "--problems", "noisy_sphere",
                             *([] if OPTEX_READY else ["--methods", *BASELINES])])
    ignore = {"real_seconds"}
    first = [{k: v for k, v in r.items() if k not in ignore} for r in doc["runs"] if r["problem"] == "noisy_sphere"]
    second = [{k: v for k, v in r.items() if k not in ignore} for r in again["runs"]]
    assert json.loads(json.dumps(first)) == json.loads(json.dumps(second, default=float))
