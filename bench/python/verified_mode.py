"""Verified mode: the base optimizer's own trajectory in fewer rounds, and what it costs.

    python bench/python/verified_mode.py --json bench/results/verified-mode-$(date +%F).json \\
        --markdown bench/results/verified-mode-$(date +%F).md
    python bench/python/verified_mode.py --quick            # 3 seeds, half the budget
    python bench/python/verified_mode.py --preset ci --json out.json   # seconds: the shape only

``optex.Options.verified(8, tolerance)`` commits per round the longest prefix of Adam steps
whose guessed iterates agreed within ``tolerance``. Measured: steps per round (the speedup
in sequential rounds, ceiling 8), drift from the sequential trajectory, rounds to a target.

Problems (d = 20, from ``standard_start``; vanilla's budget in rounds): Sphere (50),
Rosenbrock (100), ``Rotated(Levy(), 20, 0)`` (50), Styblinski-Tang (50), Ackley (50),
optex-bench's ellipsoid_1e4 (1/2 sum_i lambda_i (Q x)_i^2, lambda log-spaced in [1e-4, 1],
Q of ``Rotated(Sphere(), 20, 7)``, start all ones; 100), and ``WithGradientNoise(Sphere(),
1, seed)`` with a seed per evaluation (the noise is a function of the seed and the point's
bytes; 100). Seed s: deterministic problems start at x0 + 0.01 * N(0, I) from
``numpy.random.default_rng(s)``; the noisy one starts at x0 and s seeds its noise.

As in stragglers.py, vanilla Adam (N = 1) runs ``budget`` rounds per tuning seed at every
lr of the grid; the lowest median last-round loss picks every method's lr (N x it for
vanilla_nlr); nothing is tuned for OptEx. Target: the upper median over the seeds of
vanilla's last-round loss; a run stops on reaching it or after 2 x budget rounds. Round
loss: the exact loss where the round's step starts (``optex_default``:
``IterationInfo.loss``; line search: its best candidate); a verified round's k committed
steps start from its first k points: the lowest of their losses.

Methods: methods.py's ``vanilla``, ``vanilla_nlr`` (N x lr), ``line_search``,
``data_parallel`` (noisy problem only); ``optex_default`` (``Options(parallelism=8)``);
``target`` (N sequential true-gradient steps a round: the upper bound, the verified
mode's ceiling, not a baseline); ``verified_<tol>``, tol in 0, 1e-6, 1e-4, 1e-2. Per verified run: committed steps per
round, total steps, largest accepted disagreement, and ||x - x_seq|| / ||x_seq|| at the
end, x_seq an ``OptEx(x0, Adam(lr), Options(parallelism=1))`` stepped as often, step i
with the noise seed of the run's i-th committed step: exactly 0 at tolerance 0. Above it,
on the noisy problem, a step's gradient was drawn at the guess, so the noise differs.

Output: ``--json`` (schema "optex-verified-mode/1") and ``--markdown`` (a table and a
summary line per problem). A win or a loss is clear only when the IQRs of rounds to
target do not overlap (an unreached seed counts as +inf).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import optex  # noqa: E402
from optex import problems  # noqa: E402

import records  # noqa: E402
from methods import (BASELINES, BaseOptimizer, Evaluation, OptExMethod, RoundResult,  # noqa: E402
                     make_method, optex_options)
from stragglers import TUNING_SEED_BASE, upper_median  # noqa: E402

SCHEMA = "optex-verified-mode/1"
N = 8
TOLERANCES = (0.0, 1e-6, 1e-4, 1e-2)


class RotatedEllipsoid:
    """f(x) = 1/2 sum_i lambda_i (Q x)_i^2, lambda_i = kappa^((i - d + 1) / (d - 1)) (optex-bench's)."""

    def __init__(self, kappa: float, d: int, rotation_seed: int = 7):
        self.q = problems.Rotated(problems.Sphere(), d, rotation_seed).rotation.astype(np.float64)
        self.lam = kappa ** ((np.arange(d) - (d - 1)) / (d - 1))

    def value_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        y = self.q @ np.asarray(x, dtype=np.float64)
        return float(0.5 * np.sum(self.lam * y * y)), (self.q.T @ (self.lam * y)).astype(np.float32)

    def standard_start(self, d: int) -> np.ndarray:
        return np.ones(d, dtype=np.float32)


# A problem: its name, how to build it (noise-free), vanilla's budget in rounds, gradient noise sigma.
Spec = collections.namedtuple("Spec", "name description build budget noise dim", defaults=(0.0, 20))


PROBLEMS: dict[str, Spec] = {s.name: s for s in (
    Spec("sphere", "Sphere", problems.Sphere, 50),
    Spec("rosenbrock", "Rosenbrock", problems.Rosenbrock, 100),
    Spec("rotated_levy", "Rotated(Levy(), 20, seed=0)", lambda: problems.Rotated(problems.Levy(), 20, 0), 50),
    Spec("styblinski_tang", "Styblinski-Tang", problems.StyblinskiTang, 50),
    Spec("ackley", "Ackley", problems.Ackley, 50),
    Spec("ellipsoid_1e4", "rotated ellipsoid, condition number 1e4", lambda: RotatedEllipsoid(1e4, 20), 100),
    Spec("noisy_sphere", "Sphere, WithGradientNoise sigma 1 seeded per evaluation", problems.Sphere, 100, 1.0),
)}

PRESETS: dict[str, dict[str, Any]] = {
    "full": dict(problems=list(PROBLEMS), seeds=20, tuning_seeds=3, lr_grid=[0.003, 0.01, 0.03, 0.1, 0.3],
                 budget_scale=1.0),
    # Seconds: the shape of the output, not a measurement.
    "ci": dict(problems=list(PROBLEMS), seeds=2, tuning_seeds=1, lr_grid=[0.03, 0.1], budget_scale=0.2),
}


def verified_name(tolerance: float) -> str:
    return f"verified_{tolerance:g}"


def method_names(spec: Spec) -> list[str]:
    """Every method run on a problem, in the order of the tables."""
    return (["vanilla", "vanilla_nlr", "line_search"] + (["data_parallel"] if spec.noise > 0 else [])
            + ["optex_default", "target"] + [verified_name(t) for t in TOLERANCES])


class Objective:
    """``objective(x, seed) -> Evaluation``: the exact loss and the (noisy) gradient."""

    def __init__(self, spec: Spec):
        self.spec, self.base = spec, spec.build()

    def __call__(self, x: np.ndarray, seed: int | None = None) -> Evaluation:
        problem = self.base
        if self.spec.noise > 0:
            problem = problems.WithGradientNoise(self.base, self.spec.noise, 0 if seed is None else int(seed))
        loss, grad = problem.value_and_grad(x)
        return Evaluation(float(loss), np.asarray(grad, dtype=np.float32))

    def evaluate(self, jobs: Sequence[tuple[np.ndarray, int]]) -> list[Evaluation]:
        return [self(x, s) for x, s in jobs]

    def start(self, seed: int) -> np.ndarray:
        x0 = np.asarray(self.base.standard_start(self.spec.dim), dtype=np.float32)
        shift = 0.0 if self.spec.noise > 0 else 0.01 * np.random.default_rng(seed).standard_normal(x0.size)
        return (x0 + shift).astype(np.float32)


class RecordedOptEx(OptExMethod):
    """OptExMethod that keeps each round's IterationInfo and the noise seeds of committed steps."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.infos: list[Any] = []
        self.step_seeds: list[int] = []  # the noise seed of each committed step's gradient
        self.committed_loss: list[float] = []  # per round: the lowest loss among its committed steps' points

    def _round(self, evaluate) -> RoundResult:
        points = np.array(self.engine.ask())
        seeds = [int(s) for s in self.engine.seeds]
        evaluations = evaluate(list(zip(points, seeds)))
        info = self.engine.tell(np.stack([e.grad for e in evaluations]), np.array([e.loss for e in evaluations]))
        self.infos.append(info)
        steps = info.committed_steps if self.engine.options.mode == "verified" else 1
        self.step_seeds += seeds[:steps]
        self.committed_loss.append(min(e.loss for e in evaluations[:steps]))
        return RoundResult(evaluations)


def sequential_iterate(objective: Objective, x0: np.ndarray, lr: float, seeds: Sequence[int]) -> np.ndarray:
    """An N = 1 OptEx (the base optimizer) after len(seeds) steps, step i's noise from seeds[i]."""
    engine = optex.OptEx(x0, optimizer=optex.Adam(lr=lr), options=optex.Options(parallelism=1))
    for seed in seeds:
        e = objective(np.array(engine.ask())[0], seed)
        engine.tell(e.grad[None, :], np.array([e.loss]))
    return np.array(engine.x)


def run_one(objective: Objective, method: str, lr: float, seed: int, max_rounds: int, target: float) -> dict[str, Any]:
    """One run; its row (rounds to the target or None, and the verified mode's measures)."""
    x0 = objective.start(seed)
    started = time.perf_counter()
    verified = method.startswith("verified_")
    if verified or method == "optex_default":
        options = optex.Options.verified(N, float(method[9:])) if verified else optex_options(method, N, seed)
        options.seed = seed
        runner = RecordedOptEx(x0, BaseOptimizer("adam", lr), N, seed, options=options)
    else:
        runner = make_method(method, x0, BaseOptimizer("adam", N * lr if method == "vanilla_nlr" else lr), N, seed)
    losses: list[float] = []
    for _ in range(max_rounds):
        result = runner.run_round(objective.evaluate)
        loss = (runner.committed_loss[-1] if verified else runner.infos[-1].loss if method == "optex_default"
                else min(e.loss for e in result.evaluations))  # data_parallel: N copies of one loss
        loss = loss if math.isfinite(loss) else math.inf
        losses.append(loss)
        if loss <= target:
            break
    hit = next((i + 1 for i, loss in enumerate(losses) if loss <= target), None)
    row: dict[str, Any] = {"problem": objective.spec.name, "method": method, "seed": seed,
                           "lr": N * lr if method == "vanilla_nlr" else lr, "reached": hit is not None,
                           "rounds": hit, "rounds_run": len(losses), "final_loss": losses[-1]}
    if verified:
        steps = [info.committed_steps for info in runner.infos]
        x = np.asarray(runner.iterate, dtype=np.float64)
        x_seq = sequential_iterate(objective, x0, lr, runner.step_seeds).astype(np.float64)
        row.update(steps_median=float(np.median(steps)), steps_min=min(steps), steps_max=max(steps),
                   steps_mean=sum(steps) / len(steps), total_steps=sum(steps),
                   max_disagreement=max(info.disagreement for info in runner.infos),
                   distance=float(np.linalg.norm(x - x_seq) / np.linalg.norm(x_seq)))
    row["real_seconds"] = time.perf_counter() - started
    return row


def tune_and_target(objective: Objective, config: dict[str, Any], budget: int) -> dict[str, Any]:
    """vanilla's lr (lowest median last-round loss on the tuning seeds) and the target."""
    def final(lr: float, seed: int) -> float:
        return run_one(objective, "vanilla", lr, seed, budget, -math.inf)["final_loss"]

    tuning = [{"lr": lr, "median_final_loss": records.median(final(lr, s) for s in config["tuning_seeds"])}
              for lr in config["lr_grid"]]
    finite = [t for t in tuning if math.isfinite(t["median_final_loss"])]
    if not finite:
        raise RuntimeError(f"{objective.spec.name}: vanilla diverged at every lr of the grid")
    lr = min(finite, key=lambda t: (t["median_final_loss"], t["lr"]))["lr"]
    finals = [final(lr, s) for s in config["seeds"]]
    return {"lr": lr, "target": upper_median(finals), "tuning": tuning, "vanilla_final_losses": finals}


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (problem, method): quartiles over seeds; an unreached seed counts as +inf rounds."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["problem"], row["method"]), []).append(row)
    out = []
    for (problem, method), runs in groups.items():
        entry = {"problem": problem, "method": method, "lr": runs[0]["lr"], "seeds": len(runs),
                 "reached": sum(r["reached"] for r in runs),
                 "rounds_to_target": records.quartiles(math.inf if r["rounds"] is None else r["rounds"] for r in runs)}
        if method.startswith("verified_"):
            for field in ("steps_median", "steps_mean", "total_steps", "distance", "max_disagreement"):
                entry[field] = records.quartiles(r[field] for r in runs)
            entry["distance_max"] = max(r["distance"] for r in runs)
        out.append(entry)
    return out


def _interval(entry: dict[str, Any]) -> tuple[float, float, float]:
    q = entry["rounds_to_target"]
    return tuple(math.inf if q[k] is None else q[k] for k in ("q1", "median", "q3"))  # type: ignore


def verdict(own: dict[str, Any], other: dict[str, Any]) -> str:
    """"win", "loss" or "no clear difference" in rounds to target."""
    return records.iqr_verdict(own["rounds_to_target"], other["rounds_to_target"])


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "—" if value is None else format(value, spec)


def summary_line(problem: str, by_key: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Where the verified mode pays on this problem, in words, from the numbers."""
    rounds = lambda e: _fmt(e["rounds_to_target"]["median"])  # noqa: E731
    key = lambda e: _interval(e)[1:]  # noqa: E731
    vanilla, default = by_key[(problem, "vanilla")], by_key[(problem, "optex_default")]
    best = min((by_key[(problem, b)] for b in BASELINES if (problem, b) in by_key), key=key)
    rival = min((default, best), key=key)
    exact = by_key[(problem, verified_name(0.0))]
    fastest = min((by_key[(problem, verified_name(t))] for t in TOLERANCES), key=key)
    speed = exact["steps_mean"]["median"] or 0.0
    text = (f"**{problem}**: at tolerance 0 the verified mode commits {speed:.2f} of {N} steps per round and "
            f"reaches the target in {rounds(exact)} rounds vs vanilla {rounds(vanilla)}, `optex_default` "
            f"{rounds(default)}, best baseline `{best['method']}` {rounds(best)}. ")
    vs_vanilla, vs_rival = verdict(exact, vanilla), verdict(exact, rival)
    if vs_vanilla == "win" and vs_rival == "win":
        text += "It pays: the sequential trajectory, bit for bit, in fewer rounds than every other method. "
    elif vs_vanilla == "win":
        text += ("It pays against the sequential optimizer (same trajectory, fewer rounds), but "
                 + (f"`{rival['method']}` is clearly faster" if vs_rival == "loss"
                    else f"it does not clearly beat `{rival['method']}`") + " on another trajectory. ")
    else:
        text += (f"It does not pay ({vs_vanilla} vs vanilla): too few guesses agree exactly, so it is about "
                 f"the sequential optimizer at {N}x the evaluations. ")
    if PROBLEMS[problem].noise > 0:
        text += (f"Noisy gradients: no guess foresees the noise, so guesses {'almost never' if speed < 1.5 else 'less'}"
                 " agree; a loose tolerance commits more steps, each with a gradient drawn at its guess, so the run "
                 "leaves the sequential one (its distance is that of differently noised runs). ")
    if fastest is not exact:
        text += (f"Fastest tolerance: `{fastest['method']}` ({rounds(fastest)} rounds, "
                 f"{_fmt(fastest['steps_mean']['median'], '.2f')} steps per round, distance "
                 f"{_fmt(fastest['distance']['median'], '.2g')}): {verdict(fastest, vanilla)} vs vanilla, "
                 f"{verdict(fastest, rival)} vs `{rival['method']}`.")
    return text.rstrip()


def markdown(doc: dict[str, Any]) -> str:
    config = doc["config"]
    by_key = {(e["problem"], e["method"]): e for e in doc["summary"]}
    lines = [f"Verified mode, N = {N}, Adam at vanilla's tuned lr, {len(config['seeds'])} seeds. Rounds to target: "
             "median [IQR] (seeds that reached it); vs vanilla: vanilla's median rounds over the method's (the "
             "verdict: clear only when the IQRs do not overlap); steps/round: committed steps per round, median over "
             "seeds of the per-run median and mean (the mean is the speedup in sequential rounds, ceiling 8); "
             "distance: ||x - x_seq|| / ||x_seq|| at the run's end, median [max].", ""]
    for problem in config["problems"]:
        p = config["problem_definitions"][problem]
        vanilla = by_key[(problem, "vanilla")]
        lines += [f"### {problem}: {p['description']} (d {p['dim']}, budget {p['vanilla_budget_rounds']} rounds, "
                  f"lr {p['lr']:g}, target {p['target']:.4g})", "",
                  "| method | rounds to target | vs vanilla | steps/round median | mean (of 8) | total steps "
                  "| distance |",
                  "|---|---|---|---|---|---|---|"]
        for method in p["methods"]:
            e = by_key[(problem, method)]
            q = e["rounds_to_target"]
            cell = "not reached" if q["median"] is None else f"{_fmt(q['median'])} [{_fmt(q['q1'])}, {_fmt(q['q3'])}]"
            a, b = _interval(vanilla)[1], _interval(e)[1]
            ratio = f"{a / b:.2g}x ({verdict(e, vanilla)})" if method != "vanilla" and math.isfinite(a + b) else "—"
            extra = ["", "", "", ""] if not method.startswith("verified_") else [
                _fmt(e["steps_median"]["median"], ".2f"), _fmt(e["steps_mean"]["median"], ".2f"),
                _fmt(e["total_steps"]["median"], ".0f"),
                f"{_fmt(e['distance']['median'], '.2g')} [{_fmt(e['distance_max'], '.2g')}]"]
            lines.append(f"| `{method}` | {cell} ({e['reached']}/{e['seeds']}) | {ratio} | " + " | ".join(extra) + " |")
        lines += ["", summary_line(problem, by_key), ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full", help="default: full")
    parser.add_argument("--quick", action="store_true", help="3 seeds, 1 tuning seed, half the budget")
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS))
    parser.add_argument("--seeds", type=int, metavar="S", help="reported runs: seeds 0..S-1")
    parser.add_argument("--json", metavar="FILE", help="write the document here")
    parser.add_argument("--markdown", metavar="FILE", help="write the tables here")
    parser.add_argument("--quiet", action="store_true", help="print nothing on stderr")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (3 if args.quick else None)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.quick:
        args.tuning_seeds, args.budget_scale = 1, args.budget_scale / 2
    if args.seeds < 1:
        parser.error(f"--seeds: must be >= 1, got {args.seeds}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    config = {"seeds": list(range(args.seeds)), "lr_grid": list(args.lr_grid),
              "tuning_seeds": list(range(TUNING_SEED_BASE, TUNING_SEED_BASE + args.tuning_seeds))}
    rows, definitions = [], {}
    for problem in args.problems:
        spec = PROBLEMS[problem]
        if not args.quiet:
            print(f"verified_mode: {problem} ...", file=sys.stderr, flush=True)
        objective = Objective(spec)
        budget = max(2, round(spec.budget * args.budget_scale))
        chosen = tune_and_target(objective, config, budget)
        for method in method_names(spec):
            rows += [run_one(objective, method, chosen["lr"], s, 2 * budget, chosen["target"]) for s in config["seeds"]]
        definitions[problem] = {"description": spec.description, "dim": spec.dim, "noise_sigma": spec.noise,
                                "vanilla_budget_rounds": budget, "max_rounds": 2 * budget,
                                "methods": method_names(spec), "lr_tuning": chosen.pop("tuning"), **chosen}
    doc = {"schema": SCHEMA, "runner": "verified_mode", "preset": args.preset + (" --quick" if args.quick else ""),
           "command": records.command_line(), "date": records.today(), "machine": records.machine_description(),
           "config": {"parallelism": N, "tolerances": list(TOLERANCES), "optimizer": "adam", **config,
                      "problems": list(args.problems), "problem_definitions": definitions,
                      "budget_scale": args.budget_scale, "baselines": list(BASELINES),
                      "round_loss": "the exact loss at the point the round's step starts from; verified: the "
                                    "lowest among the points its committed steps start from",
                      "distance": "||x - x_seq|| / ||x_seq|| at the run's end, x_seq the N = 1 engine after as "
                                  "many steps, step i with the noise seed of the run's i-th committed step"},
           "real_seconds": time.perf_counter() - started, "summary": summarize(rows), "runs": rows}
    if args.json:
        records.write_json(args.json, doc, rows_key="runs")
    text = markdown(doc)
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as out:
            out.write(text)
    if not args.quiet:
        print(text, file=sys.stderr)
    return doc


if __name__ == "__main__":
    main()
