"""What the RL and supervised runners share: the run loop, learning-rate tuning, common flags.

A ``Task`` bundles a stochastic objective (evaluated in the worker pool), how a
run starts (its initial parameters from the run seed) and an ``Observer`` that
turns each round into the runner's metric (RL: the moving average of episode
returns; supervised: full-data losses and accuracy) and says when a run may stop.

``run_one`` runs one method from one seed and returns its records (round 0 = the
start, then one per round; ``gradient_evaluations`` and ``seconds`` are
cumulative; ``seconds`` times the method's rounds only, evaluations included,
not the observer's bookkeeping). ``run_benchmark`` chooses each method's
learning rate on the tuning seeds, then runs every method on the reported seeds.

Seeds: reported runs use seeds 0..S-1 (``--seeds S``), tuning runs use
``TUNING_SEED_BASE`` + 0..T-1 (``--tuning-seeds T``), so tuning never sees a
reported seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

import records as rec
from methods import (
    METHODS,
    OPTIMIZERS,
    BaseOptimizer,
    Evaluator,
    RoundResult,
    evaluations_per_round,
    line_search_factors,
    make_method,
)
from worker_pool import WorkerPool, default_workers

TUNING_SEED_BASE = 1000


class Observer(Protocol):
    """Per-run bookkeeping of a task's metric."""

    def start(self, x0: np.ndarray, run_seed: int, evaluate: Evaluator) -> dict[str, Any]:
        """The round-0 fields (the metric at the start and any extras)."""
        ...

    def after_round(self, iterate: np.ndarray, result: RoundResult) -> dict[str, Any]:
        """The fields of the round just run (metric and extras), given the new iterate."""
        ...

    @property
    def reached(self) -> bool:
        """Whether the run may stop now (the RL threshold is met)."""
        ...


@dataclasses.dataclass
class Task:
    """One benchmark problem."""

    name: str
    objective: Any  # a StochasticObjective
    initial_params: Callable[[int], np.ndarray]  # run seed -> x0 (float32)
    new_observer: Callable[[], Observer]
    metric: str  # "return" or "loss"
    goal: str  # "max" or "min"
    target: float | None = None  # known in advance (RL threshold); None: decided after the runs
    eligible: Callable[[dict[str, Any]], bool] | None = None  # may a record count as reaching?

    def tuning_score(self, runs: Sequence[Sequence[dict[str, Any]]]) -> tuple[float, float]:
        """Lower is better. With a target: (median rounds to it, the final metric as a tie-break,
        signed so lower is better); without: (0, the median final metric, signed)."""
        sign = -1.0 if self.goal == "max" else 1.0
        final = rec.median(sign * run[-1][self.metric] for run in runs)
        if self.target is None:
            return (0.0, final)
        rounds = []
        for run in runs:
            hit = rec.first_reaching(run, self.metric, self.target, self.goal, self.eligible)
            rounds.append(math.inf if hit is None else hit["round"])
        return (rec.median(rounds), final)


def run_one(task: Task, method: str, optimizer: BaseOptimizer, parallelism: int, run_seed: int,
            max_rounds: int, pool: WorkerPool) -> list[dict[str, Any]]:
    """One run: its records, round 0 to the last round run."""
    x0 = task.initial_params(run_seed)
    runner = make_method(method, x0, optimizer, parallelism, run_seed)
    observer = task.new_observer()

    def evaluate(jobs):
        return pool.evaluate(task.objective, jobs)

    base = {"task": task.name, "parallelism": parallelism, "method": method, "seed": run_seed}
    rows = [{**base, "round": 0, **observer.start(x0, run_seed, evaluate),
             "gradient_evaluations": 0, "seconds": 0.0}]
    evaluations, seconds = 0, 0.0
    for round_index in range(1, max_rounds + 1):
        started = time.perf_counter()
        result = runner.run_round(evaluate)
        seconds += time.perf_counter() - started
        evaluations += result.gradient_evaluations
        fields = observer.after_round(runner.iterate, result)
        rows.append({**base, "round": round_index, **fields,
                     "gradient_evaluations": evaluations, "seconds": seconds})
        if observer.reached:
            break
    return rows


@dataclasses.dataclass
class Plan:
    """Everything ``run_benchmark`` needs besides the tasks."""

    parallelisms: list[int]
    methods: list[str]
    optimizer: str
    lr: float
    lr_grid: list[float] | None  # None: every method runs with ``lr``
    seeds: list[int]
    tuning_seeds: list[int]
    max_rounds: int


@dataclasses.dataclass
class Outcome:
    records: list[dict[str, Any]]
    lrs: dict[tuple[str, int, str], float]  # the lr each (task, N, method) ran with
    tuning: list[dict[str, Any]]  # every (task, N, method, lr) tried and its score


def run_benchmark(tasks: Sequence[Task], plan: Plan, pool: WorkerPool, quiet: bool) -> Outcome:
    """Tunes each method's lr (unless ``plan.lr_grid`` is None), then runs the reported seeds."""
    tuned = [m for m in plan.methods if m != "vanilla_nlr"]
    if "vanilla_nlr" in plan.methods and "vanilla" not in tuned:
        tuned.insert(0, "vanilla")  # vanilla_nlr needs vanilla's lr
    grid_size = len(plan.lr_grid) if plan.lr_grid else 0
    total = len(tasks) * len(plan.parallelisms) * (
        len(tuned) * grid_size * len(plan.tuning_seeds) + len(plan.methods) * len(plan.seeds))
    bar = _progress_bar(total, quiet)
    outcome = Outcome([], {}, [])
    try:
        for task in tasks:
            for n in plan.parallelisms:
                chosen: dict[str, float] = {}
                for method in tuned:
                    if not plan.lr_grid:
                        chosen[method] = plan.lr
                        continue
                    scores = []
                    for lr in plan.lr_grid:
                        _describe(bar, f"tune {task.name} N={n} {method} lr={lr:g}")
                        runs = []
                        for seed in plan.tuning_seeds:
                            runs.append(run_one(task, method, BaseOptimizer(plan.optimizer, lr), n, seed,
                                                plan.max_rounds, pool))
                            _advance(bar)
                        score = task.tuning_score(runs)
                        scores.append((score, lr))
                        outcome.tuning.append({"task": task.name, "parallelism": n, "method": method,
                                               "lr": lr, "score": list(score)})
                    chosen[method] = min(scores)[1]
                if "vanilla_nlr" in plan.methods:
                    chosen["vanilla_nlr"] = n * chosen["vanilla"]
                for method in plan.methods:
                    lr = chosen[method]
                    outcome.lrs[(task.name, n, method)] = lr
                    _describe(bar, f"{task.name} N={n} {method} lr={lr:g}")
                    for seed in plan.seeds:
                        outcome.records += run_one(task, method, BaseOptimizer(plan.optimizer, lr), n, seed,
                                                   plan.max_rounds, pool)
                        _advance(bar)
    finally:
        if bar is not None:
            bar.close()
    return outcome


def _progress_bar(total: int, quiet: bool) -> Any:
    if quiet:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)


def _describe(bar: Any, text: str) -> None:
    if bar is not None:
        bar.set_description(text, refresh=False)


def _advance(bar: Any) -> None:
    if bar is not None:
        bar.update(1)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def exit_cleanly_on_sigterm() -> None:
    """Makes SIGTERM raise SystemExit(143) in the runner's main thread.

    Python's default SIGTERM kills the process at once, so ``with WorkerPool``
    never terminates its workers and their semaphores leak (the resource
    tracker warns). As an exception, the stop unwinds through the pool.
    """
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def add_common_arguments(parser: argparse.ArgumentParser, presets: dict[str, dict[str, Any]]) -> None:
    """The flags both runners take. Defaults are None: ``resolve`` fills them from the preset."""
    parser.add_argument("--preset", choices=sorted(presets), default="full",
                        help="a named configuration; explicit flags override its values (default: full)")
    parser.add_argument("--parallelism", "-N", type=int, nargs="+", metavar="N",
                        help="gradient evaluations per round (one or more values)")
    parser.add_argument("--seeds", type=int, metavar="S", help="reported runs: seeds 0..S-1")
    parser.add_argument("--tuning-seeds", type=int, metavar="T",
                        help=f"lr tuning runs: seeds {TUNING_SEED_BASE}..{TUNING_SEED_BASE}+T-1 (never reported)")
    parser.add_argument("--max-rounds", type=int, metavar="R", help="stop a run after R rounds")
    parser.add_argument("--methods", nargs="+", choices=METHODS, metavar="METHOD",
                        help="methods to run (default: all): " + ", ".join(METHODS))
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help="base optimizer (default: adam)")
    parser.add_argument("--lr", type=float, help="the learning rate when --lr-grid is none")
    parser.add_argument("--lr-grid", nargs="+", metavar="LR",
                        help="learning rates to choose from on the tuning seeds, or 'none'")
    parser.add_argument("--workers", type=int,
                        help="worker processes (default: min(max N, CPU count); 0: in this process)")
    parser.add_argument("--json", metavar="FILE", help="write the optex-bench/1 document here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def resolve(args: argparse.Namespace, presets: dict[str, dict[str, Any]]) -> argparse.Namespace:
    """Fills unset flags from the preset and checks the values; returns ``args``."""
    for key, value in presets[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.methods is None:
        args.methods = list(METHODS)
    if args.optimizer is None:
        args.optimizer = "adam"
    if isinstance(args.lr_grid, list) and [str(v).lower() for v in args.lr_grid] == ["none"]:
        args.lr_grid = None
    if args.lr_grid is not None:
        try:
            args.lr_grid = [float(v) for v in args.lr_grid]
        except ValueError:
            raise SystemExit(f"--lr-grid: expected numbers or 'none', got {args.lr_grid}") from None
    for name in ("seeds", "max_rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.lr_grid and args.tuning_seeds < 1:
        raise SystemExit("--tuning-seeds: must be >= 1 with an lr grid")
    if any(n < 1 for n in args.parallelism):
        raise SystemExit(f"--parallelism: must be >= 1, got {args.parallelism}")
    if args.workers is None:
        args.workers = default_workers(max(args.parallelism))
    return args


def plan_from(args: argparse.Namespace) -> Plan:
    tuning = list(range(TUNING_SEED_BASE, TUNING_SEED_BASE + args.tuning_seeds)) if args.lr_grid else []
    return Plan(parallelisms=list(args.parallelism), methods=list(args.methods), optimizer=args.optimizer,
                lr=args.lr, lr_grid=args.lr_grid, seeds=list(range(args.seeds)), tuning_seeds=tuning,
                max_rounds=args.max_rounds)


def common_config(args: argparse.Namespace, plan: Plan, outcome: Outcome) -> dict[str, Any]:
    """The config fields both runners write."""
    return {
        "parallelism": plan.parallelisms,
        "methods": plan.methods,
        "optimizer": plan.optimizer,
        "lr": plan.lr if plan.lr_grid is None else None,
        "lr_grid": plan.lr_grid,
        "lr_selection": (
            "none: every method uses lr" if plan.lr_grid is None else
            "per (task, N, method): the grid value with the best tuning score on tuning_seeds; "
            "vanilla_nlr is not tuned: N x vanilla's chosen lr"),
        "chosen_lr": [{"task": t, "parallelism": n, "method": m, "lr": lr}
                      for (t, n, m), lr in outcome.lrs.items()],
        "tuning": outcome.tuning,
        "seeds": plan.seeds,
        "tuning_seeds": plan.tuning_seeds,
        "max_rounds": plan.max_rounds,
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "evaluations_per_round": {
            str(n): {m: evaluations_per_round(m, n) for m in plan.methods} for n in plan.parallelisms},
        "line_search_factors": {str(n): line_search_factors(n).tolist() for n in plan.parallelisms},
        "seconds": "cumulative wall-clock of the method's rounds (evaluations in the worker pool and "
                   "the optimizer's work); round-0 and per-round metric bookkeeping excluded",
    }
