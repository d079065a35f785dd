"""The supervised benchmark runner (bench/python/supervised.py) on its ci preset, and its pieces.

The ci preset trains softmax regression and the MLP on scikit-learn's digits with
every method for 3 rounds from 2 seeds on 2 worker processes (seconds). Checked:
the document's shape, every method present, each method's gradient-evaluation
budget per round, finite losses and accuracies, records covering every round,
the default target, and reproducibility (all but ``seconds``). Also: the models'
gradients against finite differences, the benchmark's numpy base optimizers
against the library's (optex.OptEx with N = 1), and the summary statistics.
No timing is asserted.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the supervised runner needs scikit-learn (pip install .[bench])")

import optex  # noqa: E402

from bench_runners import BENCH_PYTHON, run_ci_preset, runs_of  # noqa: E402

sys.path.insert(0, str(BENCH_PYTHON))

import digits  # noqa: E402
import methods  # noqa: E402
import records  # noqa: E402
import supervised  # noqa: E402

CI = supervised.PRESETS["ci"]
TASKS = ("digits-softmax", "digits-mlp")


@pytest.fixture(scope="module")
def ci_document(tmp_path_factory) -> dict:
    """The ci preset through the command line, as its JSON file."""
    return run_ci_preset("supervised.py", tmp_path_factory.mktemp("supervised") / "supervised-ci.json")


def test_document_shape(ci_document: dict) -> None:
    doc = ci_document
    assert doc["schema"] == "optex-bench/1"
    assert (doc["runner"], doc["preset"], doc["metric"], doc["goal"]) == ("supervised", "ci", "loss", "min")
    config = doc["config"]
    assert config["batch_size"] == CI["batch_size"]
    assert set(config["model"]) == set(TASKS)
    assert "full training set" in config["loss"]
    assert config["seeds"] == [0, 1] and config["tuning_seeds"] == []


def test_every_method_covers_every_round(ci_document: dict) -> None:
    runs = runs_of(ci_document)
    assert set(runs) == {(t, 2, m, s) for t in TASKS for m in methods.METHODS for s in (0, 1)}
    for key, run in runs.items():
        assert [r["round"] for r in run] == list(range(CI["max_rounds"] + 1)), key
        for r in run:
            assert math.isfinite(r["loss"]) and r["loss"] > 0, key
            assert math.isfinite(r["test_loss"]) and r["test_loss"] > 0, key
            assert 0.0 <= r["test_accuracy"] <= 1.0, key
        # Every method starts from the same point for a given seed.
        assert run[0]["loss"] == runs[(key[0], 2, "vanilla", key[3])][0]["loss"]
    # Softmax regression starts at zero: the uniform prediction, loss log(10).
    assert runs[("digits-softmax", 2, "vanilla", 0)][0]["loss"] == pytest.approx(math.log(10))


def test_gradient_evaluations_follow_each_method_budget(ci_document: dict) -> None:
    for (_, n, method, _), run in runs_of(ci_document).items():
        budget = methods.evaluations_per_round(method, n)
        counts = [r["gradient_evaluations"] for r in run]
        assert counts == [0] + [budget["first"] + budget["later"] * (i - 1) for i in range(1, len(run))]


def test_summary_and_default_target(ci_document: dict) -> None:
    summary = ci_document["summary"]
    runs = runs_of(ci_document)
    assert len(summary) == len(TASKS) * len(methods.METHODS)
    for task in TASKS:
        finals = sorted(runs[(task, 2, "vanilla", s)][-1]["loss"] for s in (0, 1))
        assert ci_document["config"]["target"][task] == finals[1]  # the upper median of 2
        rows = [row for row in summary if row["task"] == task]
        assert [row["method"] for row in rows] == list(methods.METHODS)
        vanilla = rows[0]
        # At least half of vanilla's seeds reach the upper median, so its median is finite.
        assert vanilla["reached"] >= 1 and vanilla["speedup_vs_vanilla"] == 1.0
        for row in rows:
            assert row["target"] == finals[1]
            assert 0.0 <= row["final_test_accuracy"]["median"] <= 1.0


def test_same_seeds_same_records(ci_document: dict) -> None:
    again = supervised.main(["--preset", "ci", "--quiet"])
    strip = lambda records: [{k: v for k, v in r.items() if k != "seconds"} for r in records]
    assert strip(again["records"]) == strip(ci_document["records"])


@pytest.mark.parametrize("model", [digits.SoftmaxRegression(), digits.Mlp(hidden=8)], ids=repr)
def test_model_gradient_matches_finite_differences(model) -> None:
    x_train, y_train, _, _ = digits.load_split()
    x, y = x_train[:20], y_train[:20]
    params = np.random.default_rng(1).normal(0.0, 0.3, size=model.size)
    loss, grad = model.loss_and_grad(params, x, y)
    assert loss == pytest.approx(digits.loss_and_accuracy(model, params, x, y)[0])
    h = 1e-6
    numeric = np.array([(model.loss_and_grad(params + h * e, x, y)[0]
                         - model.loss_and_grad(params - h * e, x, y)[0]) / (2 * h)
                        for e in np.eye(model.size)])
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


def test_minibatch_objective_is_seeded() -> None:
    objective = digits.MinibatchObjective(digits.SoftmaxRegression(), batch_size=8)
    params = np.zeros(objective.model.size, np.float32)
    a, b, c = objective(params, 5), objective(params, 5), objective(params, 6)
    assert a.loss == b.loss and np.array_equal(a.grad, b.grad)
    assert not np.array_equal(a.grad, c.grad)


@pytest.mark.parametrize("kind", methods.OPTIMIZERS)
def test_base_optimizer_steps_are_the_engines_with_one_point(kind: str) -> None:
    """The baselines step with the library's optimizers: an optex.OptEx with N = 1 takes the
    same steps, bit for bit, whatever the gradients."""
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=16).astype(np.float32)
    optimizer = methods.BaseOptimizer(kind, 0.05)
    engine = optex.OptEx(x0, optimizer.to_optex(), parallelism=1)
    x, state = x0.copy(), optimizer.init(16)
    for grad in rng.normal(size=(30, 16)).astype(np.float32):
        engine.ask()
        engine.tell(grad[None, :], [0.0])
        before = x.copy()
        x, state = optimizer.step(x, state, grad)
        assert not np.array_equal(x, before)
        np.testing.assert_array_equal(x, engine.x)
    assert state.step == 30


def test_base_optimizer_step_leaves_its_inputs_alone() -> None:
    optimizer = methods.BaseOptimizer("adam", 0.1)
    x, state = np.ones(4, np.float32), optimizer.init(4)
    x_after, state_after = optimizer.step(x, state, np.ones(4, np.float32))
    np.testing.assert_array_equal(x, np.ones(4, np.float32))
    assert state.step == 0 and state_after.step == 1
    assert not np.array_equal(x_after, x)


def test_line_search_candidates_are_steps_with_scaled_learning_rates() -> None:
    """Adam's step is linear in lr, so each candidate lies on one line through the iterate."""
    np.testing.assert_allclose(methods.line_search_factors(4), [2**-1.5, 2**-0.5, 2**0.5, 2**1.5])
    base = methods.BaseOptimizer("adam", 0.1)
    state = base.init(4)
    grad = np.array([1.0, -2.0, 0.5, 0.0], np.float32)
    x = np.ones(4, np.float32)
    unit, _ = base.with_lr(1.0).step(x, state, grad)
    for factor in methods.line_search_factors(4):
        stepped, next_state = base.with_lr(0.1 * factor).step(x, state, grad)
        np.testing.assert_allclose(x - stepped, 0.1 * factor * (x - unit), rtol=1e-6)
        assert next_state.step == 1


@pytest.mark.parametrize(
    ("method", "expected"),
    [("optex_default", lambda n: optex.Options(parallelism=n)),
     ("optex_adaptive", optex.Options.adaptive),
     ("optex_reference", optex.Options.reference)],
)
def test_the_optex_methods_run_their_options_with_the_run_seed(method: str, expected) -> None:
    x0 = np.zeros(5, np.float32)
    run = methods.make_method(method, x0, methods.BaseOptimizer("adam", 0.1), 4, 7)
    options = expected(4)
    options.seed = 7
    assert run.engine.options == options
    assert methods.optex_options(method, 4, 7) == options
    assert method in methods.METHODS
    assert methods.evaluations_per_round(method, 4) == {"first": 4, "later": 4}


def test_every_library_optimizer_is_a_base_optimizer_of_the_runners() -> None:
    for cls in optex.optimizer_classes():
        assert type(methods.BaseOptimizer(cls.__name__.lower(), 0.01).to_optex()) is cls
    with pytest.raises(ValueError, match="optimizer"):
        methods.BaseOptimizer("adagrad", 0.01)


def test_quartiles_count_unreached_as_infinite() -> None:
    assert records.quartiles([1.0, 2.0, 3.0]) == {"median": 2.0, "q1": 1.5, "q3": 2.5}
    assert records.quartiles([1.0, 2.0, math.inf]) == {"median": 2.0, "q1": 1.5, "q3": None}
    assert records.quartiles([1.0, math.inf]) == {"median": None, "q1": None, "q3": None}
    assert records.quartiles([]) == {"median": None, "q1": None, "q3": None}
    assert records.json_safe({"a": [math.nan, 1.0, (math.inf,)]}) == {"a": [None, 1.0, [None]]}
