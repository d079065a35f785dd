"""The stragglers benchmark's problems, worker-time scenarios and methods: one run of one
method on a virtual clock (bench/python/stragglers.py tunes, summarises and reports them;
its docstring describes the benchmark)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import optex  # noqa: E402
from optex.executors import VirtualClockExecutor  # noqa: E402

from methods import BaseOptimizer, evaluation_seed, line_search_factors  # noqa: E402


# ---------------------------------------------------------------------------
# Problems and scenarios
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProblemSpec:
    """One benchmark problem: an optex.problems problem, its dimension, vanilla's round budget."""

    name: str
    description: str
    build: Callable[[], Any]  # -> optex.problems.Problem (the noise-free base)
    dim: int
    budget: int  # vanilla's rounds: the target is where it gets in them
    noise: float = 0.0  # WithGradientNoise sigma; 0: noise-free


PROBLEMS: dict[str, ProblemSpec] = {
    spec.name: spec for spec in (
        ProblemSpec("rosenbrock", "Rosenbrock", lambda: optex.problems.Rosenbrock(), 20, 100),
        ProblemSpec("sphere", "Sphere", lambda: optex.problems.Sphere(), 20, 50),
        ProblemSpec("rotated_levy", "Levy under a random rotation (Rotated(Levy(), 20, seed=0))",
                    lambda: optex.problems.Rotated(optex.problems.Levy(), 20, 0), 20, 50),
        ProblemSpec("styblinski_tang", "Styblinski-Tang", lambda: optex.problems.StyblinskiTang(), 20, 50),
        ProblemSpec("ackley", "Ackley", lambda: optex.problems.Ackley(), 20, 50),
        ProblemSpec("noisy_sphere", "Sphere, WithGradientNoise sigma 1 seeded per evaluation",
                    lambda: optex.problems.Sphere(), 20, 100, noise=1.0),
    )
}


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Worker times: log-normal (median, sigma) per evaluation, times a per-worker factor."""

    name: str
    sigma: float
    slow_factor: float = 1.0  # worker N-1's factor; 1: no slow worker
    median: float = 1.0

    def slow(self, parallelism: int) -> dict[int, float]:
        return {} if self.slow_factor == 1.0 else {parallelism - 1: self.slow_factor}

    def describe(self, parallelism: int) -> dict[str, Any]:
        return {"median_seconds": self.median, "sigma": self.sigma,
                "slow_workers": {str(w): f for w, f in self.slow(parallelism).items()}}


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (
        Scenario("even", 0.3),
        Scenario("one_slow", 0.3, slow_factor=4.0),
        Scenario("heavy_tail", 1.0),
    )
}

PRESETS: dict[str, dict[str, Any]] = {
    "full": dict(problems=list(PROBLEMS), scenarios=list(SCENARIOS), seeds=10, tuning_seeds=2,
                 parallelism=8, lr_grid=[0.003, 0.01, 0.03, 0.1, 0.3], budget_scale=1.0),
    # Seconds: the shape of the output, not a measurement.
    "ci": dict(problems=["sphere", "noisy_sphere"], scenarios=["one_slow"], seeds=2, tuning_seeds=1,
               parallelism=8, lr_grid=[0.03, 0.1], budget_scale=0.2),
}

NOISE_FREE_SKIPS = ("data_parallel",)  # method families not run on noise-free problems


def method_names(parallelism: int, k: int) -> list[str]:
    """Every method, in the order of the tables."""
    return ["vanilla", "vanilla_nlr", "data_parallel", f"data_parallel_k{k}", "line_search",
            f"line_search_k{k}", "optex_wait_all", f"optex_k{k}", "optex_timeout"]


def baseline_names(k: int) -> list[str]:
    """The same-budget baselines (vanilla is the reference, not one of them)."""
    return ["vanilla_nlr", "data_parallel", f"data_parallel_k{k}", "line_search", f"line_search_k{k}"]


def runs_on(method: str, spec: ProblemSpec) -> bool:
    return spec.noise > 0 or not method.startswith(NOISE_FREE_SKIPS)


_PROBLEM_CACHE: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class Objective:
    """``objective(x, seed=None) -> (loss, grad)``: the problem's exact loss and its gradient,
    plus N(0, noise^2) per coordinate drawn from ``seed`` on noisy problems."""

    problem: str

    def base(self) -> Any:
        if self.problem not in _PROBLEM_CACHE:
            _PROBLEM_CACHE[self.problem] = PROBLEMS[self.problem].build()
        return _PROBLEM_CACHE[self.problem]

    def __call__(self, x: np.ndarray, seed: int | None = None) -> tuple[float, np.ndarray]:
        spec = PROBLEMS[self.problem]
        if spec.noise > 0:
            noisy = optex.problems.WithGradientNoise(self.base(), spec.noise, 0 if seed is None else int(seed))
            return noisy.value_and_grad(x)
        return self.base().value_and_grad(x)


def executor_seed(run_seed: int, scenario: str) -> int:
    """The virtual clock's seed of a run: the same for every method and problem."""
    index = list(SCENARIOS).index(scenario)
    return int(np.random.SeedSequence([run_seed, index, 0x57A6]).generate_state(1)[0] >> 1)


def make_executor(scenario: Scenario, parallelism: int, run_seed: int) -> VirtualClockExecutor:
    return VirtualClockExecutor(parallelism, sigma=scenario.sigma, median=scenario.median,
                                slow=scenario.slow(parallelism), seed=executor_seed(run_seed, scenario.name))


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Trace:
    """One run: per round, the virtual time at which it closed and its loss."""

    times: list[float] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)
    dropped: int | None = None  # OptEx: rows committed as dropped (OptimizeResult.n_dropped)
    observed: int | None = None  # OptEx: late results fed to observe() (n_observed)

    def add(self, seconds: float, loss: float) -> bool:
        self.times.append(seconds)
        self.losses.append(float(loss))
        return False


def _collect(executor: VirtualClockExecutor, futures: Sequence[Future], k: int) -> list[int]:
    """Waits until at least ``k`` of ``futures`` are done; the indices of those done, in order.
    Queued futures that were not waited for are cancelled (running ones cannot be)."""
    if k >= len(futures):
        executor.wait_virtual(futures, return_when=ALL_COMPLETED)
    else:
        pending = set(futures)
        while len(futures) - len(pending) < k:
            _, pending = executor.wait_virtual(pending, return_when=FIRST_COMPLETED)
        for future in futures:
            future.cancel()
    arrived = [i for i, f in enumerate(futures) if f.done() and not f.cancelled()]
    for i in arrived:
        futures[i].result()  # an evaluation that raised fails the run
    return arrived


def run_baseline(method: str, objective: Objective, x0: np.ndarray, lr: float, parallelism: int, k: int,
                 executor: VirtualClockExecutor, run_seed: int, max_rounds: int, target: float) -> Trace:
    """One run of vanilla, vanilla_nlr, data_parallel[_k] or line_search[_k] on the executor."""
    family = method.split("_k")[0] if method.startswith(("data_parallel_k", "line_search_k")) else method
    wait_for = k if method != family else parallelism
    noisy = PROBLEMS[objective.problem].noise > 0
    optimizer = BaseOptimizer("adam", parallelism * lr if family == "vanilla_nlr" else lr)
    x = np.array(x0, dtype=np.float32)
    state = optimizer.init(x.size)
    factors = line_search_factors(parallelism)
    grad: np.ndarray | None = None  # the line search's gradient at the iterate
    trace = Trace()

    def submit(points: Sequence[np.ndarray], round_index: int) -> list[Future]:
        return [executor.submit(objective, p, evaluation_seed(run_seed, round_index, i) if noisy else None)
                for i, p in enumerate(points)]

    for r in range(1, max_rounds + 1):
        if family in ("vanilla", "vanilla_nlr") or (family == "line_search" and grad is None):
            (future,) = submit([x], r)
            _collect(executor, [future], 1)
            loss, g = future.result()
            if family == "line_search":
                grad = np.asarray(g, dtype=np.float32)
            else:
                x, state = optimizer.step(x, state, g)
        elif family == "data_parallel":
            futures = submit([x] * parallelism, r)
            arrived = _collect(executor, futures, wait_for)
            results = [futures[i].result() for i in arrived]
            loss = results[0][0]
            x, state = optimizer.step(x, state, np.mean([np.asarray(g, dtype=np.float64) for _, g in results],
                                                        axis=0))
        elif family == "line_search":
            steps = [optimizer.with_lr(lr * f).step(x, state, grad) for f in factors]
            futures = submit([p for p, _ in steps], r)
            arrived = _collect(executor, futures, wait_for)
            best = min(arrived, key=lambda i: (futures[i].result()[0], i))
            loss, g = futures[best].result()
            (x, state), grad = steps[best], np.asarray(g, dtype=np.float32)
        else:
            raise ValueError(f"method: {method!r} is not a baseline")
        trace.add(executor.virtual_time(), loss)
        if loss <= target:
            break
    return trace


def minimize_supports_stragglers() -> bool:
    """Whether optex.minimize takes an executor and min_results / round_timeout, and the engine
    has observe() for the late results."""
    parameters = inspect.signature(optex.minimize).parameters
    return "min_results" in parameters and "round_timeout" in parameters and hasattr(optex.OptEx, "observe")


def run_optex(method: str, objective: Objective, x0: np.ndarray, lr: float, parallelism: int, k: int,
              round_timeout: float, executor: VirtualClockExecutor, run_seed: int, max_rounds: int,
              target: float) -> Trace:
    """One run of optex.minimize on the executor; the callback records each round's virtual time."""
    noisy = PROBLEMS[objective.problem].noise > 0
    extra: dict[str, Any] = {}
    if method == f"optex_k{k}":
        extra["min_results"] = k
    elif method == "optex_timeout":
        extra["round_timeout"] = round_timeout
    elif method != "optex_wait_all":
        raise ValueError(f"method: {method!r} is not an OptEx method")
    trace = Trace()
    result = optex.minimize(
        objective, x0, optimizer=BaseOptimizer("adam", lr).to_optex(), parallelism=parallelism,
        seed=run_seed, workers=executor, max_iters=max_rounds, target_loss=target, pass_seed=noisy,
        callback=lambda info: trace.add(executor.virtual_time(), info.loss), progress=False, **extra)
    trace.dropped = getattr(result, "n_dropped", None)
    trace.observed = getattr(result, "n_observed", None)
    return trace


def run_one(method: str, problem: str, scenario: Scenario, parallelism: int, k: int, timeout_factor: float,
            lr: float, run_seed: int, max_rounds: int, target: float) -> dict[str, Any]:
    """One run; its row (virtual seconds, rounds and evaluations to the target, or None)."""
    spec = PROBLEMS[problem]
    objective = Objective(problem)
    x0 = objective.base().standard_start(spec.dim)
    executor = make_executor(scenario, parallelism, run_seed)
    started = time.perf_counter()
    if method.startswith("optex_"):
        trace = run_optex(method, objective, x0, lr, parallelism, k, timeout_factor * scenario.median,
                          executor, run_seed, max_rounds, target)
    else:
        trace = run_baseline(method, objective, x0, lr, parallelism, k, executor, run_seed, max_rounds, target)
    real = time.perf_counter() - started
    hit = next((i for i, loss in enumerate(trace.losses) if loss <= target), None)
    log = executor.log
    end = trace.times[-1] if trace.times else 0.0
    hit_time = None if hit is None else trace.times[hit]
    return {
        "problem": problem,
        "scenario": scenario.name,
        "method": method,
        "seed": run_seed,
        "lr": parallelism * lr if method == "vanilla_nlr" else lr,
        "reached": hit is not None,
        "virtual_seconds": hit_time,
        "rounds": None if hit is None else hit + 1,
        # Evaluations that had started by the time the target was reached (or the run ended).
        "evaluations": sum(1 for t in log if t.start is not None and t.start <= (end if hit is None else hit_time)),
        "rounds_run": len(trace.losses),
        "virtual_seconds_run": end,
        "final_loss": trace.losses[-1] if trace.losses else None,
        "n_dropped": trace.dropped,
        "n_observed": trace.observed,
        "real_seconds": real,
    }
