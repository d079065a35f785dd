"""Stragglers benchmark: rounds that do not wait for the slowest worker, on a virtual clock.

    python bench/python/stragglers.py --json bench/results/stragglers-$(date +%F).json \\
        --markdown bench/results/stragglers-$(date +%F).md --jobs 2
    python bench/python/stragglers.py --quick            # 3 seeds
    python bench/python/stragglers.py --preset ci --json out.json   # seconds: the shape only

The question: with uneven workers, does OptEx that closes a round without its
stragglers (``optex.minimize(..., min_results=K)`` or ``round_timeout=``) reach a
target in less wall-clock than OptEx that waits for all N, and how does it compare
with the same-budget baselines under the same worker times?

Worker times. Every method runs its evaluations on an
``optex.executors.VirtualClockExecutor`` with N workers (N = 8): evaluation k of a
run (counting the run's submissions from 0) takes ``median * exp(sigma * z_k)``
virtual seconds, times its worker's slowness factor, ``z_k`` drawn from the run's
seed. Scenarios: ``even`` (sigma 0.3, every worker alike), ``one_slow`` (sigma 0.3,
worker N-1 4x slower), ``heavy_tail`` (sigma 1.0, every worker alike). The
executor's seed depends on the run seed and the scenario only, so every method and
problem of a (scenario, seed) sees the same evaluation times task by task. A queued
evaluation starts on the lowest-numbered free worker; an evaluation that a round
did not wait for keeps its worker busy into the next rounds. Virtual time counts
evaluations only: the optimizers' own computation is free.

Problems (the ``full`` preset, d = 20, from ``optex.problems``, each from its
``standard_start``; vanilla's budget in rounds): Rosenbrock (100), Sphere (50), rotated
Levy (50), Styblinski-Tang (50), Ackley (50), and Sphere with N(0, 1) gradient noise
(100; ``WithGradientNoise`` seeded by each evaluation's own seed, so N evaluations at
one point are N independent minibatches). Seeds change the worker times and the
noise, not the start.

Learning rate and target, per problem: vanilla Adam (one evaluation per round) runs
``budget`` rounds from each tuning seed at every ``--lr-grid`` value; the lr with the
lowest median loss at its last round is the lr of *every* method (N x it for
vanilla_nlr). Nothing is tuned for OptEx. The target is the upper median over the
reported seeds of the loss vanilla reaches at its last round at that lr. A run stops
at the first round whose loss reaches the target or after ``2 x budget`` rounds.

Round loss (what reaches the target): the exact loss at the point the round's step
starts from, measured by the round's own evaluations: OptEx's ``IterationInfo.loss``,
vanilla's and data parallel's loss at the iterate, the line search's best candidate.

Methods, N evaluations per round unless said:

==================== ===================================================================
optex_wait_all       ``optex.minimize(..., workers=executor)``: the round waits for all N.
optex_k{K}           ``min_results=K`` (K = N-1): closes at the K-th result.
optex_timeout        ``round_timeout=`` timeout_factor x the median evaluation time
                     (1.5 s), as ``optex.minimize`` defines it on the virtual clock.
vanilla              1 evaluation per round, Adam at lr; runs on worker 0 (factor 1).
vanilla_nlr          the same at N x lr (a same-budget baseline only by its name: 1
                     evaluation, so it never meets the slow worker).
data_parallel        (noisy problems only) N evaluations at the iterate with N seeds;
                     waits for all N; one step with the mean gradient.
data_parallel_k{K}   the same, closing at the K-th result: the mean of those arrived.
line_search          N step sizes lr * 2^(i - (N-1)/2) along Adam's update, waits for
                     all N, moves to the lowest loss (round 1: 1 evaluation).
line_search_k{K}     the same, best of the candidates arrived at the K-th result.
==================== ===================================================================

The baselines step with the library's Adam (methods.BaseOptimizer: optex.init_state /
optex.apply_step), so their steps are those of optex.OptEx with N = 1. A K-of-N
round takes every result arrived when the K-th arrives; its queued evaluations are
cancelled, its running ones finish on their workers unused (OptEx instead feeds them
to the engine's ``observe()``, as ``optex.minimize`` does). On noise-free problems the
data-parallel methods are not run: N evaluations at one point are N copies of one
gradient, so they would be vanilla with slower rounds.

Output: ``--json`` (schema "optex-stragglers/1": config, one row per run, the summary
with medians and quartiles over seeds, and the verdicts) and ``--markdown`` (the
tables). A win or a loss is called clear only when the interquartile ranges of the
virtual seconds to target do not overlap.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import multiprocessing
import os
import sys
import time
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from optex.executors import VirtualClockExecutor  # noqa: E402

import records  # noqa: E402

SCHEMA = "optex-stragglers/1"
TUNING_SEED_BASE = 1000

from straggler_runs import (  # noqa: E402, F401 (the tests reach the runs through this module)
    ProblemSpec,
    Scenario,
    method_names,
    baseline_names,
    runs_on,
    Objective,
    executor_seed,
    make_executor,
    Trace,
    run_baseline,
    minimize_supports_stragglers,
    run_optex,
    run_one,
    PROBLEMS,
    SCENARIOS,
    PRESETS,
    NOISE_FREE_SKIPS,
)

# ---------------------------------------------------------------------------
# Tuning and targets
# ---------------------------------------------------------------------------


def vanilla_final_loss(problem: str, lr: float, run_seed: int, rounds: int) -> float:
    """Vanilla's loss at round ``rounds`` (no early stop; worker times do not matter)."""
    spec = PROBLEMS[problem]
    objective = Objective(problem)
    trace = run_baseline("vanilla", objective, objective.base().standard_start(spec.dim), lr, 1, 1,
                         VirtualClockExecutor(1), run_seed, rounds, -math.inf)
    return trace.losses[-1]


def upper_median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def tune_and_target(problem: str, lr_grid: Sequence[float], tuning_seeds: Sequence[int], seeds: Sequence[int],
                    budget: int) -> dict[str, Any]:
    """vanilla's lr (lowest median last-round loss on the tuning seeds) and the target."""
    tuning = []
    for lr in lr_grid:
        finals = [vanilla_final_loss(problem, lr, s, budget) for s in tuning_seeds]
        tuning.append({"lr": lr, "median_final_loss": records.median(finals)})
    finite = [t for t in tuning if math.isfinite(t["median_final_loss"])]
    if not finite:
        raise RuntimeError(f"{problem}: vanilla diverged at every lr of the grid")
    lr = min(finite, key=lambda t: (t["median_final_loss"], t["lr"]))["lr"]
    finals = [vanilla_final_loss(problem, lr, s, budget) for s in seeds]
    return {"lr": lr, "target": upper_median(finals), "tuning": tuning, "vanilla_final_losses": finals}


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------


def run_problem(problem: str, config: dict[str, Any]) -> dict[str, Any]:
    """Everything for one problem: tuning, target, then every scenario x method x seed."""
    spec = PROBLEMS[problem]
    budget = max(2, round(spec.budget * config["budget_scale"]))
    chosen = tune_and_target(problem, config["lr_grid"], config["tuning_seeds"], config["seeds"], budget)
    n, k = config["parallelism"], config["k"]
    rows = []
    for scenario_name in config["scenarios"]:
        scenario = SCENARIOS[scenario_name]
        for method in config["methods"]:
            if not runs_on(method, spec):
                continue
            for seed in config["seeds"]:
                rows.append(run_one(method, problem, scenario, n, k, config["timeout_factor"], chosen["lr"],
                                    seed, 2 * budget, chosen["target"]))
    return {"problem": problem, "budget": budget, **chosen, "rows": rows}


def summarize(rows: Sequence[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Per (problem, scenario, method): quartiles over seeds; an unreached seed counts as +inf."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["problem"], row["scenario"], row["method"]), []).append(row)
    out = []
    for (problem, scenario, method), runs in groups.items():
        def q(field: str) -> dict[str, float | None]:
            return records.quartiles(math.inf if r[field] is None else r[field] for r in runs)

        entry = {
            "problem": problem, "scenario": scenario, "method": method, "lr": runs[0]["lr"],
            "seeds": len(runs), "reached": sum(r["reached"] for r in runs),
            "virtual_seconds_to_target": q("virtual_seconds"),
            "rounds_to_target": q("rounds"),
            "evaluations_to_target": q("evaluations"),
            "seconds_per_round": records.quartiles(
                r["virtual_seconds_run"] / r["rounds_run"] for r in runs if r["rounds_run"]),
        }
        if runs[0]["n_dropped"] is not None:
            entry["n_dropped"] = records.quartiles(r["n_dropped"] for r in runs)
        if runs[0]["n_observed"] is not None:
            entry["n_observed"] = records.quartiles(r["n_observed"] for r in runs)
        out.append(entry)
    return out


def _interval(entry: dict[str, Any]) -> tuple[float, float, float]:
    """(q1, median, q3) of virtual seconds to target, +inf where not reached."""
    q = entry["virtual_seconds_to_target"]
    return tuple(math.inf if q[name] is None else q[name] for name in ("q1", "median", "q3"))  # type: ignore


def verdict(own: dict[str, Any], other: dict[str, Any]) -> str:
    """"win", "loss" or "no clear difference" in virtual seconds to target."""
    return records.iqr_verdict(own["virtual_seconds_to_target"], other["virtual_seconds_to_target"])


def comparisons(summary: Sequence[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """For each (problem, scenario) and each straggler-tolerant OptEx: against waiting for all and
    against the best same-budget baseline (the lowest median virtual seconds to target)."""
    by_key = {(e["problem"], e["scenario"], e["method"]): e for e in summary}
    out = []
    for problem, scenario in dict.fromkeys((e["problem"], e["scenario"]) for e in summary):
        baselines = [by_key[(problem, scenario, b)] for b in baseline_names(k) if (problem, scenario, b) in by_key]
        best = min(baselines, key=lambda e: (_interval(e)[1], _interval(e)[2]), default=None)
        wait_all = by_key.get((problem, scenario, "optex_wait_all"))
        for method in (f"optex_k{k}", "optex_timeout", "optex_wait_all"):
            own = by_key.get((problem, scenario, method))
            if own is None:
                continue
            row = {"problem": problem, "scenario": scenario, "method": method}
            if wait_all is not None and method != "optex_wait_all":
                row["vs_wait_all"] = verdict(own, wait_all)
                row["median_ratio_vs_wait_all"] = _ratio(_interval(own)[1], _interval(wait_all)[1])
            if best is not None:
                row["best_baseline"] = best["method"]
                row["vs_best_baseline"] = verdict(own, best)
                row["median_ratio_vs_best_baseline"] = _ratio(_interval(own)[1], _interval(best)[1])
            out.append(row)
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else None


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def cell(entry: dict[str, Any] | None, field: str = "virtual_seconds_to_target") -> str:
    if entry is None:
        return "n/a"
    q = entry[field]
    if q["median"] is None:
        text = "not reached"
        if q["q1"] is not None:
            text += f" [{_fmt(q['q1'])}, —]"
    else:
        text = f"{_fmt(q['median'])} [{_fmt(q['q1'])}, {_fmt(q['q3']) if q['q3'] is not None else '—'}]"
    if entry["reached"] < entry["seeds"]:
        text += f" ({entry['reached']}/{entry['seeds']})"
    return text


def markdown(doc: dict[str, Any]) -> str:
    config = doc["config"]
    k, n = config["min_results"], config["parallelism"]
    methods = config["methods"]
    by_key = {(e["problem"], e["scenario"], e["method"]): e for e in doc["summary"]}
    lines = [f"Virtual seconds to target, median [IQR] over {len(config['seeds'])} seeds "
             f"(N = {n}, K = {k}, round_timeout = {config['round_timeout']:g} s; "
             "(r/s): only r of s seeds reached the target; n/a: not run).", ""]
    for scenario in config["scenarios"]:
        described = config["scenario_definitions"][scenario]
        slow = ", ".join(f"worker {w} x{f:g}" for w, f in described["slow_workers"].items()) or "none"
        lines += [f"**{scenario}** (log-normal, median {described['median_seconds']:g} s, "
                  f"sigma {described['sigma']:g}; slow: {slow})", ""]
        lines.append("| problem | target | lr | " + " | ".join(f"`{m}`" for m in methods) + " |")
        lines.append("|---|---|---|" + "---|" * len(methods))
        for problem in config["problems"]:
            p = config["problem_definitions"][problem]
            cells = [cell(by_key.get((problem, scenario, m))) for m in methods]
            lines.append(f"| {problem} | {_fmt(p['target'])} | {p['lr']:g} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Rounds to target, median [IQR]:", ""]
    for scenario in config["scenarios"]:
        lines.append(f"| {scenario} | " + " | ".join(f"`{m}`" for m in methods) + " |")
        lines.append("|---|" + "---|" * len(methods))
        for problem in config["problems"]:
            cells = [cell(by_key.get((problem, scenario, m)), "rounds_to_target") for m in methods]
            lines.append(f"| {problem} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Verdicts (clear only when the IQRs of virtual seconds to target do not overlap; ratio = "
              "median over median):", "",
              "| problem | scenario | method | vs optex_wait_all | vs best same-budget baseline |",
              "|---|---|---|---|---|"]
    for c in doc["comparisons"]:
        if c["method"] == "optex_wait_all" and "vs_best_baseline" not in c:
            continue
        wait = "—" if "vs_wait_all" not in c else f"{c['vs_wait_all']} ({_fmt(c['median_ratio_vs_wait_all'])}x)"
        best = "—" if "vs_best_baseline" not in c else (
            f"{c['vs_best_baseline']} vs `{c['best_baseline']}` ({_fmt(c['median_ratio_vs_best_baseline'])}x)")
        lines.append(f"| {c['problem']} | {c['scenario']} | `{c['method']}` | {wait} | {best} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full",
                        help="a named configuration; explicit flags override it (default: full)")
    parser.add_argument("--quick", action="store_true", help="3 seeds and 1 tuning seed")
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS))
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS))
    parser.add_argument("--methods", nargs="+", metavar="METHOD",
                        help="methods to run (default: all): " + ", ".join(method_names(8, 7)))
    parser.add_argument("--seeds", type=int, metavar="S", help="reported runs: seeds 0..S-1")
    parser.add_argument("--tuning-seeds", type=int, metavar="T",
                        help=f"vanilla's lr tuning: seeds {TUNING_SEED_BASE}..{TUNING_SEED_BASE}+T-1")
    parser.add_argument("--parallelism", "-N", type=int, metavar="N", help="workers and evaluations per round")
    parser.add_argument("--min-results", "-K", type=int, metavar="K", help="K of the K-of-N methods (N-1)")
    parser.add_argument("--timeout-factor", type=float, default=1.5,
                        help="optex_timeout's round_timeout in median evaluation times (1.5)")
    parser.add_argument("--lr-grid", type=float, nargs="+", metavar="LR", help="vanilla's learning rates")
    parser.add_argument("--budget-scale", type=float, help="multiplies every problem's vanilla budget")
    parser.add_argument("--jobs", type=int, default=1, help="problems run in this many processes (1)")
    parser.add_argument("--json", metavar="FILE", help="write the document here")
    parser.add_argument("--markdown", metavar="FILE", help="write the tables here")
    parser.add_argument("--quiet", action="store_true", help="print nothing on stderr")
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.quick:
        args.seeds, args.tuning_seeds = 3, 1
    if args.parallelism < 2:
        parser.error(f"--parallelism: must be >= 2, got {args.parallelism}")
    if args.min_results is None:
        args.min_results = args.parallelism - 1
    if not 1 <= args.min_results <= args.parallelism:
        parser.error(f"--min-results: must be in 1..N, got {args.min_results}")
    if args.seeds < 1 or args.tuning_seeds < 1:
        parser.error("--seeds, --tuning-seeds: must be >= 1")
    if not (args.timeout_factor > 0 and math.isfinite(args.timeout_factor)):
        parser.error(f"--timeout-factor: must be a positive number, got {args.timeout_factor}")
    if not (args.budget_scale > 0 and math.isfinite(args.budget_scale)):
        parser.error(f"--budget-scale: must be a positive number, got {args.budget_scale}")
    if args.jobs < 1:
        parser.error(f"--jobs: must be >= 1, got {args.jobs}")
    all_methods = method_names(args.parallelism, args.min_results)
    if args.methods is None:
        args.methods = all_methods
    unknown = [m for m in args.methods if m not in all_methods]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {all_methods}")
    args.methods = [m for m in all_methods if m in args.methods]
    if any(m.startswith("optex_") for m in args.methods) and not minimize_supports_stragglers():
        parser.error("the optex_* methods need optex.minimize(..., workers=<executor>, min_results=, "
                     "round_timeout=), which this optex does not have yet; run the baselines alone "
                     "with --methods")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    config = {
        "parallelism": args.parallelism, "k": args.min_results, "budget_scale": args.budget_scale,
        "lr_grid": list(args.lr_grid), "seeds": list(range(args.seeds)),
        "tuning_seeds": list(range(TUNING_SEED_BASE, TUNING_SEED_BASE + args.tuning_seeds)),
        "scenarios": list(args.scenarios), "methods": list(args.methods), "timeout_factor": args.timeout_factor,
    }
    problems = list(args.problems)
    if args.jobs > 1 and len(problems) > 1:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(args.jobs, len(problems)), mp_context=context) as pool:
            results = list(pool.map(run_problem, problems, [config] * len(problems)))
    else:
        results = []
        for problem in problems:
            if not args.quiet:
                print(f"stragglers: {problem} ...", file=sys.stderr, flush=True)
            results.append(run_problem(problem, config))
    rows = [row for result in results for row in result["rows"]]
    summary = summarize(rows, args.min_results)
    doc = {
        "schema": SCHEMA,
        "runner": "stragglers",
        "preset": args.preset + (" --quick" if args.quick else ""),
        "command": records.command_line(),
        "date": records.today(),
        "machine": records.machine_description(),
        "config": {
            "parallelism": args.parallelism,
            "min_results": args.min_results,
            "round_timeout": args.timeout_factor * SCENARIOS["even"].median,
            "round_timeout_rule": f"{args.timeout_factor:g} x the median evaluation time",
            "methods": list(args.methods),
            "baselines": [b for b in baseline_names(args.min_results) if b in args.methods],
            "problems": problems,
            "problem_definitions": {
                r["problem"]: {"description": PROBLEMS[r["problem"]].description, "dim": PROBLEMS[r["problem"]].dim,
                               "start": "standard_start", "noise_sigma": PROBLEMS[r["problem"]].noise,
                               "vanilla_budget_rounds": r["budget"], "max_rounds": 2 * r["budget"],
                               "lr": r["lr"], "target": r["target"], "lr_tuning": r["tuning"],
                               "vanilla_final_losses": r["vanilla_final_losses"]}
                for r in results},
            "scenarios": list(args.scenarios),
            "scenario_definitions": {s: SCENARIOS[s].describe(args.parallelism) for s in args.scenarios},
            "seeds": config["seeds"],
            "tuning_seeds": config["tuning_seeds"],
            "lr_grid": list(args.lr_grid),
            "lr_selection": "per problem, vanilla Adam's lr with the lowest median loss at its last budget "
                            "round on the tuning seeds; every method runs at it (vanilla_nlr at N x it)",
            "target_rule": "upper median over the reported seeds of vanilla's loss at its last budget round",
            "round_loss": "the exact loss at the point the round's step starts from, from the round's own "
                          "evaluations (OptEx: IterationInfo.loss; line search: the best candidate's)",
            "time_model": "VirtualClockExecutor: evaluation k takes median*exp(sigma*z_k) x its worker's "
                          "factor; FIFO queue, lowest-numbered free worker first; the executor seed depends "
                          "on (run seed, scenario) only; optimizer compute costs no virtual time",
            "skipped": "data_parallel methods on noise-free problems (N copies of one gradient)",
            "evaluations": "evaluations started by the time the target was reached (or the run ended)",
            "verdict_rule": "clear win or loss only when the IQRs of virtual seconds to target do not overlap; "
                            "a seed that never reaches the target counts as +inf",
        },
        "real_seconds": time.perf_counter() - started,
        "summary": summary,
        "comparisons": comparisons(summary, args.min_results),
        "runs": rows,
    }
    if args.json:
        records.write_json(args.json, doc, rows_key="runs")
    if args.markdown:
        directory = os.path.dirname(os.path.abspath(args.markdown))
        os.makedirs(directory, exist_ok=True)
        with open(args.markdown, "w") as out:
            out.write(markdown(doc))
    if not args.quiet:
        print(markdown(doc), file=sys.stderr)
    return doc


if __name__ == "__main__":
    main()
