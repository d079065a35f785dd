"""The optimization methods the benchmark runners compare, over a stochastic objective.

A *stochastic objective* is a picklable callable ``objective(params, seed) ->
Evaluation``: the loss and a gradient estimate at ``params`` (float32 (d,)),
from the minibatch or the episodes that ``seed`` determines. The runners
evaluate objectives in batches of jobs ``(params, seed)`` through a worker pool
(worker_pool.py); every method here sees the pool only as an *evaluator*
``evaluate(jobs) -> evaluations`` (one evaluation per job, in job order), so
every method goes through the same code path and wall-clock comparisons are fair.

One call of ``Method.run_round(evaluate)`` is one *round*: the unit of
sequential time. With parallelism N, every method spends at most N gradient
evaluations per round:

==========================  ==========================================================
``vanilla``                 1 evaluation at the iterate, one base-optimizer step.
``vanilla_nlr``             the same with N x the learning rate (the runner passes it).
``data_parallel``           N evaluations at the iterate with N seeds (N x minibatch,
                            N x episodes); one step with their mean.
``line_search``             N step sizes lr * 2^(i - (N-1)/2) along the base optimizer's
                            update direction; the candidate with the lowest loss (RL: the
                            best mean return of its episodes) becomes the iterate and its
                            gradient drives the next round. Round 1 only evaluates the
                            gradient at the start (1 evaluation).
``target``                  N true sequential base-optimizer steps (N evaluations one
                            after another): the upper bound OptEx approximates.
``optex_reference``         optex.OptEx with ``optex.Options.reference(N)``.
``optex_default``           optex.OptEx with the library's default options, parallelism N.
``optex_adaptive``          optex.OptEx with ``optex.Options.adaptive(N)``: each round splits
                            its N evaluations into points from the gradient noise it measured
                            (one evaluation per point when noise-free, all N at one point when
                            noise dominates), commits from the point with the lowest loss,
                            and bounds each lengthscale change; N evaluations per round.
``ablation_last_gradient``  optex defaults with ``proxy="last_gradient"``.
``ablation_last_point``     optex defaults, but only the last of the N points is evaluated
                            (the others are told as NaN with ``drop_nonfinite=True``):
                            1 evaluation per round.
==========================  ==========================================================

Seeds: the baselines seed the evaluation of point i in round r (1-based) of a
run with ``evaluation_seed(run_seed, r, i)``; the OptEx methods use the engine's
per-point seeds (``OptEx.seeds``, derived from ``Options.seed = run_seed``). A
run is therefore reproducible from its run seed alone.

The baselines step with the library's own base optimizers (``BaseOptimizer``
wraps ``optex.init_state`` / ``optex.apply_step``): their steps are the steps an
``optex.OptEx`` with N = 1 takes, bit for bit. The line search takes its N
candidate steps with N learning rates from the same state.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import math
from typing import Callable, Protocol, Sequence

import numpy as np

import optex

from method_names import METHODS

BASELINES: tuple[str, ...] = ("vanilla_nlr", "data_parallel", "line_search")
"""The baselines at the same budget; ``speedup_vs_best_baseline`` compares with the best."""

OPTIMIZERS: tuple[str, ...] = (
    *(cls.__name__.lower() for cls in optex.optimizer_classes()),
    "sgd-momentum",
)
"""Base optimizers: each optex optimizer class with its defaults but the learning rate
("adam", "sgd", "rmsprop", ...), and SGD with momentum 0.9."""


@dataclasses.dataclass
class Evaluation:
    """One gradient evaluation: the loss, the gradient estimate and, for RL, the episode returns."""

    loss: float
    grad: np.ndarray
    episode_returns: np.ndarray | None = None


class StochasticObjective(Protocol):
    """``objective(params, seed) -> Evaluation``; picklable, it runs in worker processes."""

    def __call__(self, params: np.ndarray, seed: int) -> Evaluation: ...


Job = tuple[np.ndarray, int]
"""(params float32 (d,), seed): one evaluation to run."""

Evaluator = Callable[[Sequence[Job]], list[Evaluation]]
"""Runs a batch of jobs (in parallel) and returns their evaluations in order."""


def evaluation_seed(run_seed: int, round_index: int, point_index: int) -> int:
    """The seed of point ``point_index`` in round ``round_index`` of run ``run_seed`` (a uint64)."""
    sequence = np.random.SeedSequence([run_seed, round_index, point_index])
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def evaluations_per_round(method: str, parallelism: int) -> dict[str, int]:
    """Gradient evaluations a method spends in its first round and in every later round."""
    single = method in ("vanilla", "vanilla_nlr", "ablation_last_point")
    later = 1 if single else parallelism
    first = 1 if method == "line_search" else later
    return {"first": first, "later": later}


def line_search_factors(parallelism: int) -> np.ndarray:
    """The step-size multipliers of the line search: a factor-2 geometric grid centred on 1."""
    return 2.0 ** (np.arange(parallelism) - (parallelism - 1) / 2.0)


# ---------------------------------------------------------------------------
# Base optimizers (the library's, through optex.apply_step)
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BaseOptimizer:
    """A base optimizer with a learning rate: ``kind`` is one of ``OPTIMIZERS``."""

    kind: str
    lr: float

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"optimizer: must be one of {OPTIMIZERS}, got {self.kind!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr: must be a positive finite number, got {self.lr!r}")

    def with_lr(self, lr: float) -> BaseOptimizer:
        return dataclasses.replace(self, lr=lr)

    def to_optex(self):
        """The library's optimizer with these hyperparameters (also for the OptEx methods)."""
        if self.kind == "sgd-momentum":
            return optex.Sgd(lr=self.lr, momentum=0.9)
        classes = {cls.__name__.lower(): cls for cls in optex.optimizer_classes()}
        return classes[self.kind](lr=self.lr)

    def init(self, dim: int) -> optex.OptimizerState:
        return optex.init_state(self.to_optex(), dim)

    def step(self, x: np.ndarray, state: optex.OptimizerState,
             grad: np.ndarray) -> tuple[np.ndarray, optex.OptimizerState]:
        """One step from ``x`` with ``grad``: the new point (float32) and state (copies)."""
        stepped = np.array(x, dtype=np.float32)
        next_state = copy.copy(state)
        optex.apply_step(self.to_optex(), stepped, next_state, np.asarray(grad, dtype=np.float32))
        return stepped, next_state


# ---------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class RoundResult:
    """What one round did: its evaluations in the order they ran, and how many there were."""

    evaluations: list[Evaluation]

    @property
    def gradient_evaluations(self) -> int:
        return len(self.evaluations)


class Method(abc.ABC):
    """A method's state over one run; ``run_round`` advances it by one round."""

    def __init__(self, x0: np.ndarray, optimizer: BaseOptimizer, parallelism: int, run_seed: int):
        self.optimizer = optimizer
        self.parallelism = parallelism
        self.run_seed = run_seed
        self.round = 0  # rounds completed
        self._x = np.array(x0, dtype=np.float32)

    @property
    def iterate(self) -> np.ndarray:
        """The current iterate (float32 (d,)): what the method would return now."""
        return self._x

    def run_round(self, evaluate: Evaluator) -> RoundResult:
        self.round += 1
        return self._round(evaluate)

    def _seed(self, point: int) -> int:
        return evaluation_seed(self.run_seed, self.round, point)

    @abc.abstractmethod
    def _round(self, evaluate: Evaluator) -> RoundResult: ...


class Vanilla(Method):
    """One evaluation and one base-optimizer step per round (also vanilla_nlr, with N x lr)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self._state = self.optimizer.init(self._x.size)

    def _round(self, evaluate: Evaluator) -> RoundResult:
        (evaluation,) = evaluate([(self._x, self._seed(0))])
        self._x, self._state = self.optimizer.step(self._x, self._state, evaluation.grad)
        return RoundResult([evaluation])


class DataParallel(Vanilla):
    """N evaluations at the iterate with N seeds; one step with the mean gradient."""

    def _round(self, evaluate: Evaluator) -> RoundResult:
        evaluations = evaluate([(self._x, self._seed(i)) for i in range(self.parallelism)])
        mean_grad = np.mean([e.grad for e in evaluations], axis=0)
        self._x, self._state = self.optimizer.step(self._x, self._state, mean_grad)
        return RoundResult(evaluations)


class Target(Vanilla):
    """N true sequential steps per round: the trajectory OptEx would follow with exact predictions."""

    def _round(self, evaluate: Evaluator) -> RoundResult:
        evaluations = []
        for i in range(self.parallelism):
            (evaluation,) = evaluate([(self._x, self._seed(i))])
            self._x, self._state = self.optimizer.step(self._x, self._state, evaluation.grad)
            evaluations.append(evaluation)
        return RoundResult(evaluations)


class LineSearch(Vanilla):
    """N step sizes from the same state, evaluated in parallel; the best loss wins. The
    learning rates are lr * factor; every candidate's moments are the same (they do not
    depend on the learning rate), so the state after the round is the winner's."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self._grad: np.ndarray | None = None  # the gradient at the iterate, from the last round
        self.factors = line_search_factors(self.parallelism)

    def _round(self, evaluate: Evaluator) -> RoundResult:
        if self._grad is None:
            # Nothing to search along yet: evaluate the gradient at the start.
            (evaluation,) = evaluate([(self._x, self._seed(0))])
            self._grad = evaluation.grad
            return RoundResult([evaluation])
        steps = [self.optimizer.with_lr(self.optimizer.lr * factor).step(self._x, self._state, self._grad)
                 for factor in self.factors]
        evaluations = evaluate([(x, self._seed(i)) for i, (x, _) in enumerate(steps)])
        best = int(np.argmin([e.loss for e in evaluations]))
        (self._x, self._state), self._grad = steps[best], evaluations[best].grad
        return RoundResult(evaluations)


def optex_options(method: str, parallelism: int, run_seed: int) -> optex.Options:
    """The optex.Options of an OptEx method."""
    if method == "optex_reference":
        options = optex.Options.reference(parallelism)
    elif method == "ablation_last_gradient":
        options = optex.Options(parallelism=parallelism, proxy="last_gradient")
    elif method in ("optex_default", "ablation_last_point"):
        options = optex.Options(parallelism=parallelism)
    elif method == "optex_adaptive":
        options = optex.Options.adaptive(parallelism)
    else:
        raise ValueError(f"method: {method!r} is not an OptEx method")
    options.seed = run_seed
    return options


class OptExMethod(Method):
    """optex.OptEx through ask/tell; each point is evaluated with the engine's seed for it."""

    def __init__(self, x0: np.ndarray, optimizer: BaseOptimizer, parallelism: int, run_seed: int,
                 options: optex.Options, last_point_only: bool = False):
        super().__init__(x0, optimizer, parallelism, run_seed)
        self.engine = optex.OptEx(self._x, optimizer.to_optex(), options)
        self.last_point_only = last_point_only

    @property
    def iterate(self) -> np.ndarray:
        return self.engine.x

    def _round(self, evaluate: Evaluator) -> RoundResult:
        points = np.array(self.engine.ask())  # a copy: the view changes at tell()
        seeds = [int(s) for s in self.engine.seeds]
        n = len(points)
        evaluated = [n - 1] if self.last_point_only else list(range(n))
        evaluations = evaluate([(points[i], seeds[i]) for i in evaluated])
        grads = np.full(points.shape, np.nan, dtype=np.float32)
        losses = np.full(n, np.nan)
        for i, evaluation in zip(evaluated, evaluations):
            grads[i], losses[i] = evaluation.grad, evaluation.loss
        # Only the last-point ablation has NaN rows on purpose; elsewhere a NaN is an error.
        self.engine.tell(grads, losses, drop_nonfinite=self.last_point_only)
        return RoundResult(evaluations)


def make_method(name: str, x0: np.ndarray, optimizer: BaseOptimizer, parallelism: int,
                run_seed: int) -> Method:
    """A fresh run of method ``name``. vanilla_nlr expects the caller to pass N x lr already."""
    args = (x0, optimizer, parallelism, run_seed)
    if name in ("vanilla", "vanilla_nlr"):
        return Vanilla(*args)
    if name == "data_parallel":
        return DataParallel(*args)
    if name == "line_search":
        return LineSearch(*args)
    if name == "target":
        return Target(*args)
    if name in ("optex_reference", "optex_default", "optex_adaptive", "ablation_last_gradient",
                "ablation_last_point"):
        options = optex_options(name, parallelism, run_seed)
        return OptExMethod(*args, options=options, last_point_only=name == "ablation_last_point")
    raise ValueError(f"method: must be one of {METHODS}, got {name!r}")
