"""Supervised benchmark runner: minibatch training on scikit-learn's digits, OptEx against the baselines.

    python bench/python/supervised.py --preset ci --json out.json
    python bench/python/supervised.py --model softmax mlp --json bench/results/supervised-digits-$(date +%F).json

Tasks (``--model``): ``softmax`` (softmax regression, task "digits-softmax") and
``mlp`` (64-32-10 tanh MLP, task "digits-mlp") on the bundled digits data
(digits.py: no download, a fixed 75/25 stratified split). One gradient
evaluation = the loss and gradient on one minibatch of ``--batch-size``
training examples drawn by the evaluation's seed; a round's N evaluations run in
parallel in the worker pool. Every run lasts ``--max-rounds`` rounds.

Records: ``loss`` is the mean cross-entropy on the *full training set* at the
method's iterate after the round (not a minibatch loss), ``test_loss`` and
``test_accuracy`` on the test set; round 0 is the start. These are computed in
the parent process outside the timed part of a round.

Target (metric "loss", goal "min"): ``--target`` if given; by default, per task,
the upper median over the seeds of the full training loss vanilla reaches at its
last round (the larger middle value for an even number of seeds, so at least
half of vanilla's seeds reach it). Rounds to target = the first round whose
``loss`` is <= the target.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import records  # noqa: E402
from digits import MinibatchObjective, Mlp, SoftmaxRegression, load_split, loss_and_accuracy  # noqa: E402
from methods import Evaluator, RoundResult  # noqa: E402
from worker_pool import WorkerPool  # noqa: E402

MODELS: dict[str, SoftmaxRegression | Mlp] = {
    "softmax": SoftmaxRegression(),
    "mlp": Mlp(hidden=32),
}

PRESETS: dict[str, dict[str, Any]] = {
    # Seconds: the shape of the output, not a measurement.
    "ci": dict(model=["softmax", "mlp"], parallelism=[2], batch_size=16, seeds=2, tuning_seeds=0,
               max_rounds=3, lr=0.05, lr_grid=["none"], workers=2),
    # The measurement: both models, 10 seeds, lr chosen on 2 tuning seeds.
    "full": dict(model=["softmax", "mlp"], parallelism=[4], batch_size=32, seeds=10, tuning_seeds=2,
                 max_rounds=200, lr=0.01, lr_grid=["0.003", "0.01", "0.03", "0.1"]),
}

NOTES = {
    "vanilla_nlr": "lr = N x vanilla's chosen lr",
    "line_search": "first round: 1 evaluation (the gradient at the start)",
    "target": "upper bound: N sequential evaluations per round",
    "ablation_last_point": "1 evaluation per round (the last point)",
}


class FullDataObserver:
    """Full training loss, test loss and test accuracy at the iterate; never stops a run early."""

    reached = False

    def __init__(self, model: SoftmaxRegression | Mlp):
        self.model = model

    def _fields(self, params: np.ndarray) -> dict[str, Any]:
        x_train, y_train, x_test, y_test = load_split()
        train_loss, _ = loss_and_accuracy(self.model, params, x_train, y_train)
        test_loss, test_accuracy = loss_and_accuracy(self.model, params, x_test, y_test)
        return {"loss": train_loss, "test_loss": test_loss, "test_accuracy": test_accuracy}

    def start(self, x0: np.ndarray, run_seed: int, evaluate: Evaluator) -> dict[str, Any]:
        return self._fields(x0)

    def after_round(self, iterate: np.ndarray, result: RoundResult) -> dict[str, Any]:
        return self._fields(iterate)


def make_task(name: str, batch_size: int) -> harness.Task:
    model = MODELS[name]

    def initial_params(run_seed: int) -> np.ndarray:
        return model.initial_params(np.random.default_rng([run_seed, 0xD161]))

    return harness.Task(
        name="digits-" + name,
        objective=MinibatchObjective(model, batch_size),
        initial_params=initial_params,
        new_observer=lambda: FullDataObserver(model),
        metric="loss",
        goal="min",
    )


def upper_median(values: list[float]) -> float:
    """The middle value; for an even count, the larger of the two middle values."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def default_targets(all_records: list[dict[str, Any]], task_names: list[str]) -> dict[str, float]:
    """Per task: the upper median of vanilla's final full training loss (first parallelism run)."""
    runs = records.group_runs(all_records)
    targets = {}
    for task in task_names:
        vanilla = [run for (t, _n, m, _s), run in runs.items() if t == task and m == "vanilla"]
        first_n = min(run[0]["parallelism"] for run in vanilla)
        targets[task] = upper_median([run[-1]["loss"] for run in vanilla if run[0]["parallelism"] == first_n])
    return targets


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", choices=list(MODELS), help="models to train")
    parser.add_argument("--batch-size", type=int, metavar="B", help="examples per minibatch gradient")
    parser.add_argument("--target", type=float,
                        help="full training loss to reach (default: from vanilla's runs, see above)")
    harness.add_common_arguments(parser, PRESETS)
    args = harness.resolve(parser.parse_args(argv), PRESETS)
    if args.batch_size < 1:
        parser.error(f"--batch-size: must be >= 1, got {args.batch_size}")
    if args.target is None and "vanilla" not in args.methods:
        parser.error("--target: needed when vanilla is not among --methods (the default target comes from it)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark; returns the document (also written to --json when given)."""
    args = parse_args(argv)
    tasks = [make_task(name, args.batch_size) for name in args.model]
    plan = harness.plan_from(args)
    with WorkerPool(args.workers, [t.objective for t in tasks]) as pool:
        outcome = harness.run_benchmark(tasks, plan, pool, args.quiet)
    task_names = [t.name for t in tasks]
    if args.target is None:
        targets = default_targets(outcome.records, task_names)
    else:
        targets = {name: args.target for name in task_names}
    summary = records.summarize(outcome.records, "loss", "min", targets, outcome.lrs,
                                extra_finals=("test_loss", "test_accuracy"), notes=NOTES)
    x_train, _, x_test, _ = load_split()
    config = {
        "model": {t.name: {"model": repr(MODELS[name]), "parameters": MODELS[name].size}
                  for t, name in zip(tasks, args.model)},
        "data": f"sklearn.datasets.load_digits, pixels / 16, stratified split seed 0: "
                f"{len(x_train)} train, {len(x_test)} test",
        "batch_size": args.batch_size,
        "loss": "records' loss: mean cross-entropy on the full training set at the iterate after the "
                "round (round 0: at the start); test_loss, test_accuracy: on the test set",
        "target": {name: targets[name] for name in task_names},
        "target_definition": ("--target" if args.target is not None else
                              "upper median over seeds of vanilla's full training loss at its last round"),
        "line_search_selection": "the candidate with the lowest minibatch loss",
        **harness.common_config(args, plan, outcome),
    }
    doc = records.document("supervised", args.preset, "loss", "min", config, outcome.records, summary)
    if args.json:
        records.write_json(args.json, doc)
    if not args.quiet:
        print_summary(summary)
    return doc


def print_summary(summary: list[dict[str, Any]]) -> None:
    """A short table on stderr."""
    def fmt(q: dict[str, Any], digits: int) -> str:
        return "-" if q["median"] is None else f"{q['median']:.{digits}f}"

    print(f"{'task':15} {'N':>2} {'method':24} {'lr':>7} {'reached':>7} {'rounds':>7} {'seconds':>8} "
          f"{'final loss':>10} {'test acc':>8} {'x vanilla':>9}", file=sys.stderr)
    for row in summary:
        speedup = row["speedup_vs_vanilla"]
        print(f"{row['task']:15} {row['parallelism']:>2} {row['method']:24} {row['lr']:>7.3g} "
              f"{row['reached']:>3}/{row['seeds']:<3} {fmt(row['rounds_to_target'], 0):>7} "
              f"{fmt(row['seconds_to_target'], 2):>8} {fmt(row['final'], 4):>10} "
              f"{fmt(row['final_test_accuracy'], 3):>8} "
              f"{'-' if speedup is None else f'{speedup:.2f}':>9}", file=sys.stderr)


if __name__ == "__main__":
    harness.exit_cleanly_on_sigterm()
    main()
