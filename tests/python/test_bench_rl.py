"""The RL benchmark runner (bench/python/rl.py) on its ci preset, and its pieces.

The ci preset runs every method on CartPole with a linear policy for 3 rounds
from 2 seeds on 2 worker processes (seconds). Checked: the document's shape,
every method present, each method's gradient-evaluation budget per round,
episode counts, finite values, records covering every round, and that a second
run from the same seeds gives the same records (all but ``seconds``). Also: the
policies' log-probability gradients against finite differences, and the
REINFORCE objective's seeding. No timing is asserted.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("gymnasium", reason="the RL runner needs gymnasium (pip install .[bench])")

from bench_runners import BENCH_PYTHON, run_ci_preset, runs_of  # noqa: E402

sys.path.insert(0, str(BENCH_PYTHON))

import methods  # noqa: E402
import policies  # noqa: E402
import rl  # noqa: E402
from reinforce import ReinforceObjective  # noqa: E402

CI = rl.PRESETS["ci"]


@pytest.fixture(scope="module")
def ci_document(tmp_path_factory) -> dict:
    """The ci preset through the command line, as its JSON file."""
    return run_ci_preset("rl.py", tmp_path_factory.mktemp("rl") / "rl-ci.json")


def test_document_shape(ci_document: dict) -> None:
    doc = ci_document
    assert doc["schema"] == "optex-bench/1"
    assert (doc["runner"], doc["preset"], doc["metric"], doc["goal"]) == ("rl", "ci", "return", "max")
    assert len(doc["date"]) == 10 and doc["machine"] and "rl.py" in doc["command"]
    config = doc["config"]
    assert config["env"]["cartpole-linear"]["threshold"] == 475.0
    assert config["episodes_per_gradient"] == CI["episodes_per_gradient"]
    assert "last 100 training episodes" in config["moving_average"]
    assert config["seeds"] == [0, 1] and config["workers"] == 2
    assert {c["method"] for c in config["chosen_lr"]} == set(methods.METHODS)


def test_every_method_and_seed_covers_every_round(ci_document: dict) -> None:
    runs = runs_of(ci_document)
    expected = {("cartpole-linear", 2, m, s) for m in methods.METHODS for s in (0, 1)}
    assert set(runs) == expected
    for key, run in runs.items():
        # 3 rounds cannot fill a 100-episode window: no run stops early.
        assert [r["round"] for r in run] == list(range(CI["max_rounds"] + 1)), key
        assert all(math.isfinite(r["return"]) for r in run), key
        assert all(0.0 <= r["return"] <= 500.0 for r in run), key
        seconds = [r["seconds"] for r in run]
        assert seconds[0] == 0.0 and seconds == sorted(seconds), key


def test_gradient_evaluations_follow_each_method_budget(ci_document: dict) -> None:
    k = CI["episodes_per_gradient"]
    for (_, n, method, _), run in runs_of(ci_document).items():
        budget = methods.evaluations_per_round(method, n)
        counts = [r["gradient_evaluations"] for r in run]
        expected = [0] + [budget["first"] + budget["later"] * (i - 1) for i in range(1, len(run))]
        assert counts == expected, method
        # Every evaluation runs K training episodes.
        assert [r["episodes"] for r in run] == [k * c for c in counts], method
    assert methods.evaluations_per_round("optex_default", 4) == {"first": 4, "later": 4}
    assert methods.evaluations_per_round("optex_adaptive", 4) == {"first": 4, "later": 4}
    assert methods.evaluations_per_round("ablation_last_point", 4) == {"first": 1, "later": 1}
    assert methods.evaluations_per_round("line_search", 4) == {"first": 1, "later": 4}


def test_summary_rows(ci_document: dict) -> None:
    summary = ci_document["summary"]
    assert [row["method"] for row in summary] == list(methods.METHODS)
    by_method = {row["method"]: row for row in summary}
    for row in summary:
        assert row["target"] == 475.0 and row["seeds"] == 2
        assert row["reached"] == 0 and row["rounds_to_target"]["median"] is None
        assert row["final"]["median"] is not None and math.isfinite(row["final"]["median"])
        assert row["lr"] == pytest.approx(CI["lr"] * (2 if row["method"] == "vanilla_nlr" else 1))
    assert "note" in by_method["target"]


def test_same_seeds_same_records(ci_document: dict) -> None:
    """In-process this time; the worker processes differ, the records must not."""
    again = rl.main(["--preset", "ci", "--quiet"])
    strip = lambda records: [{k: v for k, v in r.items() if k != "seconds"} for r in records]
    assert strip(again["records"]) == strip(ci_document["records"])


@pytest.mark.parametrize(
    "policy",
    [policies.LinearSoftmaxPolicy(obs_dim=4, n_actions=2),
     policies.LinearSoftmaxPolicy(obs_dim=6, n_actions=3),
     policies.MlpSoftmaxPolicy(obs_dim=4, hidden=32, n_actions=2)],
    ids=repr,
)
def test_log_prob_gradient_matches_finite_differences(policy) -> None:
    rng = np.random.default_rng(3)
    params = rng.normal(0.0, 0.5, size=policy.size)
    observations = rng.normal(size=(7, policy.obs_dim))
    actions = rng.integers(0, policy.n_actions, size=7)
    weights = rng.normal(size=7)

    def objective(p: np.ndarray) -> float:
        return float(weights @ policies.log_probabilities(policy, p, observations, actions))

    analytic = policy.weighted_log_prob_gradient(params, observations, actions, weights)
    h = 1e-6
    numeric = np.array([(objective(params + h * e) - objective(params - h * e)) / (2 * h)
                        for e in np.eye(policy.size)])
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


def test_act_samples_the_softmax() -> None:
    """act() draws action a with probability softmax(logits)[a] (inverse CDF of the uniform)."""
    policy = policies.LinearSoftmaxPolicy(obs_dim=2, n_actions=3)
    params = np.array([1.0, 0.0, 0.0, 1.0, -1.0, 0.5, 0.1, 0.2, 0.3])
    obs = np.array([0.3, -0.7])
    logits = policy.logits(params, obs[None, :])[0]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    uniforms = (np.arange(10000) + 0.5) / 10000
    counts = np.bincount([policy.act(policy.prepare(params), obs, u) for u in uniforms], minlength=3)
    np.testing.assert_allclose(counts / len(uniforms), p, atol=2e-4)


def test_reinforce_objective_is_seeded() -> None:
    env_id, policy = rl.ENVIRONMENTS["cartpole-linear"]
    objective = ReinforceObjective(env_id, policy, episodes=3)
    params = np.random.default_rng(0).normal(0, 0.3, size=policy.size).astype(np.float32)
    a, b, c = objective(params, 11), objective(params, 11), objective(params, 12)
    assert a.loss == b.loss and np.array_equal(a.grad, b.grad)
    assert np.array_equal(a.episode_returns, b.episode_returns)
    assert a.loss == -np.mean(a.episode_returns) and len(a.episode_returns) == 3
    assert not np.array_equal(a.grad, c.grad)
    assert a.grad.dtype == np.float32 and a.grad.shape == (policy.size,)
    assert np.all(np.isfinite(a.grad))


def test_sigterm_stops_the_runner_and_its_workers_cleanly(tmp_path) -> None:
    """SIGTERM mid-run: exit status 143, no JSON written, the worker pool's semaphores freed."""
    import signal
    import time

    stderr_path, out = tmp_path / "stderr.txt", tmp_path / "never.json"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(BENCH_PYTHON / "rl.py"), "--preset", "ci", "--methods", "vanilla",
             "--seeds", "1", "--max-rounds", "1000000", "--json", str(out)],
            stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            # The progress bar appears once the pool's workers are up.
            while "run" not in stderr_path.read_text() and time.monotonic() < deadline:
                assert process.poll() is None, stderr_path.read_text()
                time.sleep(0.2)
            assert "run" in stderr_path.read_text(), "the runner did not start within 120 s"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            if process.poll() is None:
                process.kill()
    text = stderr_path.read_text()
    assert "leaked" not in text, text
    assert not out.exists()
