"""RL benchmark runner: REINFORCE on Gymnasium environments, OptEx against the baselines.

    python bench/python/rl.py --preset ci --json out.json
    python bench/python/rl.py --env cartpole-linear --seeds 10 --json bench/results/rl-cartpole-$(date +%F).json

Tasks (``--env``): ``cartpole-linear`` (CartPole-v1, linear softmax policy),
``cartpole-mlp`` (CartPole-v1, 4-32-2 tanh MLP policy), ``acrobot-linear``
(Acrobot-v1, linear softmax policy). One gradient evaluation = K episodes
(``--episodes-per-gradient``) with their own seeds (reinforce.py); a round's N
evaluations run in parallel in the worker pool. The methods are those of
methods.py, all with the same budget of N evaluations per round (vanilla,
vanilla_nlr and ablation_last_point: 1; line_search's first round: 1).

Metric ("return", goal "max"): the 100-episode moving average of the return,
over the last 100 *training* episodes the method ran, in the order (round,
point of the round, episode of the evaluation); fewer than 100 episodes
average what there is. Round 0 is the start: the mean return of K episodes of
the initial policy (seeded by the run seed, the same for every method; not
training episodes, not counted). A run reaches the target, the environment's
registered ``reward_threshold`` (CartPole-v1: 475, Acrobot-v1: -100), at the
first round where at least 100 training episodes have run and the moving
average is >= the threshold; it stops there or after ``--max-rounds``. The
summary reports rounds and seconds to the threshold: median and interquartile
range over the seeds, unreached seeds counting as +infinity.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import deque
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import records  # noqa: E402
from methods import Evaluator, RoundResult, evaluation_seed  # noqa: E402
from policies import LinearSoftmaxPolicy, MlpSoftmaxPolicy  # noqa: E402
from reinforce import ReinforceObjective  # noqa: E402
from worker_pool import WorkerPool  # noqa: E402

ENVIRONMENTS: dict[str, tuple[str, LinearSoftmaxPolicy | MlpSoftmaxPolicy]] = {
    "cartpole-linear": ("CartPole-v1", LinearSoftmaxPolicy(obs_dim=4, n_actions=2)),
    "cartpole-mlp": ("CartPole-v1", MlpSoftmaxPolicy(obs_dim=4, hidden=32, n_actions=2)),
    "acrobot-linear": ("Acrobot-v1", LinearSoftmaxPolicy(obs_dim=6, n_actions=3)),
}

MOVING_AVERAGE_WINDOW = 100
MOVING_AVERAGE_DEFINITION = (
    "mean return of the last 100 training episodes the method ran, in the order (round, point of "
    "the round, episode of the evaluation); fewer than 100 episodes: their mean. The threshold counts "
    "as reached only once 100 training episodes have run. Round 0: mean return of K episodes of the "
    "initial policy (seed derived from the run seed; not training episodes)")

PRESETS: dict[str, dict[str, Any]] = {
    # Seconds: the shape of the output, not a measurement.
    "ci": dict(env=["cartpole-linear"], parallelism=[2], episodes_per_gradient=2, seeds=2,
               tuning_seeds=0, max_rounds=3, lr=0.05, lr_grid=["none"], workers=2),
    # The measurement: every task, 10 seeds, lr chosen on 2 tuning seeds.
    "full": dict(env=list(ENVIRONMENTS), parallelism=[4], episodes_per_gradient=10, seeds=10,
                 tuning_seeds=2, max_rounds=300, lr=0.1, lr_grid=["0.03", "0.1", "0.3"]),
}

NOTES = {
    "vanilla_nlr": "lr = N x vanilla's chosen lr",
    "line_search": "first round: 1 evaluation (the gradient at the start)",
    "target": "upper bound: N sequential evaluations per round",
    "ablation_last_point": "1 evaluation per round (the last point)",
}


def environment_threshold(env_id: str) -> float:
    """The environment's registered ``reward_threshold``."""
    import gymnasium

    threshold = gymnasium.spec(env_id).reward_threshold
    if threshold is None:
        raise ValueError(f"--env: {env_id} registers no reward_threshold")
    return float(threshold)


class MovingAverageObserver:
    """Tracks the training episodes' returns; see the module docstring for the definition."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.window: deque[float] = deque(maxlen=MOVING_AVERAGE_WINDOW)
        self.episodes = 0

    def start(self, x0: np.ndarray, run_seed: int, evaluate: Evaluator) -> dict[str, Any]:
        (evaluation,) = evaluate([(x0, evaluation_seed(run_seed, 0, 0))])
        return {"return": float(np.mean(evaluation.episode_returns)), "episodes": 0}

    def after_round(self, iterate: np.ndarray, result: RoundResult) -> dict[str, Any]:
        for evaluation in result.evaluations:
            self.window.extend(float(r) for r in evaluation.episode_returns)
            self.episodes += len(evaluation.episode_returns)
        return {"return": float(np.mean(self.window)), "episodes": self.episodes}

    @property
    def reached(self) -> bool:
        full = self.episodes >= MOVING_AVERAGE_WINDOW
        return full and float(np.mean(self.window)) >= self.threshold


def full_window(record: dict[str, Any]) -> bool:
    """Whether a record's moving average covers a full window (may count as reaching)."""
    return record.get("episodes", 0) >= MOVING_AVERAGE_WINDOW


def make_task(name: str, episodes: int) -> harness.Task:
    env_id, policy = ENVIRONMENTS[name]
    threshold = environment_threshold(env_id)

    def initial_params(run_seed: int) -> np.ndarray:
        return policy.initial_params(np.random.default_rng([run_seed, 0x1417]))

    return harness.Task(
        name=name,
        objective=ReinforceObjective(env_id, policy, episodes),
        initial_params=initial_params,
        new_observer=lambda: MovingAverageObserver(threshold),
        metric="return",
        goal="max",
        target=threshold,
        eligible=full_window,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", nargs="+", choices=list(ENVIRONMENTS), help="tasks to run")
    parser.add_argument("--episodes-per-gradient", "-K", type=int, metavar="K",
                        help="episodes per gradient evaluation")
    harness.add_common_arguments(parser, PRESETS)
    args = harness.resolve(parser.parse_args(argv), PRESETS)
    if args.episodes_per_gradient < 1:
        parser.error(f"--episodes-per-gradient: must be >= 1, got {args.episodes_per_gradient}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark; returns the document (also written to --json when given)."""
    args = parse_args(argv)
    tasks = [make_task(name, args.episodes_per_gradient) for name in args.env]
    plan = harness.plan_from(args)
    with WorkerPool(args.workers, [t.objective for t in tasks]) as pool:
        outcome = harness.run_benchmark(tasks, plan, pool, args.quiet)
    targets = {t.name: t.target for t in tasks}
    summary = records.summarize(outcome.records, "return", "max", targets, outcome.lrs,
                                eligible=full_window, notes=NOTES)
    config = {
        "env": {name: {"env_id": ENVIRONMENTS[name][0], "policy": repr(ENVIRONMENTS[name][1]),
                       "parameters": ENVIRONMENTS[name][1].size, "threshold": targets[name]}
                for name in args.env},
        "episodes_per_gradient": args.episodes_per_gradient,
        "gradient_estimator": "REINFORCE: -(1/T) sum_t A_t grad log pi(a_t|s_t) over the K episodes' "
                              "T steps; A_t = discounted return-to-go (gamma 0.99) standardized over "
                              "the T steps. loss = -mean undiscounted return of the K episodes",
        "moving_average": MOVING_AVERAGE_DEFINITION,
        "target": "the environment's registered reward_threshold",
        "line_search_selection": "the candidate with the best mean return of its K episodes",
        **harness.common_config(args, plan, outcome),
    }
    doc = records.document("rl", args.preset, "return", "max", config, outcome.records, summary)
    if args.json:
        records.write_json(args.json, doc)
    if not args.quiet:
        print_summary(summary)
    return doc


def print_summary(summary: list[dict[str, Any]]) -> None:
    """A short table on stderr."""
    def fmt(q: dict[str, Any], digits: int = 0) -> str:
        if q["median"] is None:
            return "-"
        low = "-" if q["q1"] is None else f"{q['q1']:.{digits}f}"
        high = "-" if q["q3"] is None else f"{q['q3']:.{digits}f}"
        return f"{q['median']:.{digits}f} [{low}, {high}]"

    print(f"{'task':16} {'N':>2} {'method':24} {'lr':>7} {'reached':>7} {'rounds':>18} "
          f"{'seconds':>20} {'x vanilla':>9}", file=sys.stderr)
    for row in summary:
        speedup = row["speedup_vs_vanilla"]
        print(f"{row['task']:16} {row['parallelism']:>2} {row['method']:24} {row['lr']:>7.3g} "
              f"{row['reached']:>3}/{row['seeds']:<3} {fmt(row['rounds_to_target']):>18} "
              f"{fmt(row['seconds_to_target'], 1):>20} "
              f"{'-' if speedup is None else f'{speedup:.2f}':>9}", file=sys.stderr)


if __name__ == "__main__":
    harness.exit_cleanly_on_sigterm()
    main()
