"""optex.plan: the planner with fake timers (deterministic, where it flips, the
noise rule), with an objective it times itself, and its refusals. Nothing here
depends on how fast the machine is."""

from __future__ import annotations

import math

import numpy as np
import pytest

import optex


class FakeTimers:
    """o = a + b N T0 d, a plain step p; counts the calls."""

    def __init__(self, a: float = 0.0, b: float = 0.0, p: float = 1e-4) -> None:
        self.a, self.b, self.p = a, b, p
        self.round_calls = 0
        self.step_calls = 0

    def round(self, dim: int, parallelism: int, history: int) -> float:
        self.round_calls += 1
        return self.a + self.b * parallelism * history * dim

    def step(self, dim: int) -> float:
        self.step_calls += 1
        return self.p

    def plan(self, gradient_seconds: float, **kwargs) -> optex.Plan:
        args = dict(dim=100_000, parallelism=8, history=32)
        args.update(kwargs)
        return optex.plan(args.pop("dim"), args.pop("parallelism"), args.pop("history"),
                          gradient_seconds=gradient_seconds, round_timer=self.round,
                          step_timer=self.step, **args)


def test_the_plan_is_deterministic_and_prints_its_recommendation() -> None:
    timers = FakeTimers(a=1e-3, b=1e-10)
    first, second = timers.plan(0.05), timers.plan(0.05)
    assert str(first) == str(second)
    assert "Recommendation: " in str(first)
    assert repr(first).startswith("Plan(choice='optex'")


def test_the_candidates_follow_the_model() -> None:
    timers = FakeTimers(a=1e-3, b=1e-10, p=2e-4)
    plan = timers.plan(0.05, efficiency=0.25)
    assert [(c.parallelism, c.history) for c in plan.candidates] == [
        (1, 32), (2, 32), (4, 32), (8, 32), (2, 16), (4, 16), (8, 16), (2, 8), (4, 8), (8, 8)]
    # Every time measured repetitions = 5 times.
    assert timers.round_calls == 9 * 5 and timers.step_calls == 5
    assert plan.plain_step_seconds == 2e-4
    assert plan.plain_seconds_per_step == pytest.approx(0.05 + 2e-4)
    for c in plan.candidates:
        s = 1 + 0.25 * (c.points - 1)
        assert c.steps_per_round == pytest.approx(s)
        assert c.seconds_per_step == pytest.approx((0.05 + c.overhead_seconds) / s)
        if c.points == 1:
            assert math.isnan(c.break_even_gradient_seconds)
        else:
            o = 1e-3 + 1e-10 * c.parallelism * c.history * 100_000
            assert c.overhead_seconds == pytest.approx(o)
            assert c.break_even_gradient_seconds == pytest.approx(max(0.0, (o - s * 2e-4) / (s - 1)))


@pytest.mark.parametrize("a, b", [(10e-3, 1e-11), (1e-4, 1e-9)])
def test_the_recommendation_flips_at_the_reported_break_even(a: float, b: float) -> None:
    timers = FakeTimers(a=a, b=b, p=5e-4)
    slow = timers.plan(1e-3)
    assert slow.choice == "sequential" and slow.parallelism == 1
    w = slow.break_even_gradient_seconds
    assert 1e-3 < w < math.inf
    assert "OptEx pays off above" in slow.reason
    assert timers.plan(w * (1 - 1e-6)).choice == "sequential"
    above = timers.plan(w * (1 + 1e-6))
    assert above.choice == "optex" and above.parallelism >= 2


def test_a_history_whose_overhead_exceeds_a_tenth_of_the_gradient_is_cut() -> None:
    timers = FakeTimers(b=1e-10)  # o(8, 32) = 2.56 ms, o(8, 16) = 1.28 ms
    assert timers.plan(0.1).history == 32
    plan = timers.plan(0.015)
    assert plan.choice == "optex" and plan.parallelism == 8 and plan.history == 16
    assert "T0 = 16 instead of 32" in plan.reason


def test_the_noise_rule_is_the_adaptive_strategy_s() -> None:
    timers = FakeTimers(a=1e-6)
    noisy = timers.plan(0.05, gradient_noise=100.0)
    assert (noisy.choice, noisy.parallelism, noisy.evaluations_per_point) == ("averaging", 8, 8)
    assert timers.round_calls == 0
    split = timers.plan(0.05, gradient_noise=0.5)
    assert (split.choice, split.parallelism, split.evaluations_per_point) == ("optex", 8, 2)
    unknown = timers.plan(0.05)
    assert unknown.evaluations_per_point == 1
    assert "unknown" in unknown.reason and "Options::adaptive(8)" in unknown.reason


def test_an_objective_is_timed_at_float32_points_of_its_dimension() -> None:
    calls = []

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        calls.append((x.dtype, x.shape, float(np.abs(x).max())))
        return float(x @ x), 2 * x

    timers = FakeTimers(a=1e-3)
    plan = optex.plan(500, 4, 8, objective=objective, round_timer=timers.round,
                      step_timer=timers.step)
    assert len(calls) == 6  # one untimed, five timed
    assert all(dtype == np.float32 and shape == (500,) and m <= 1.0 for dtype, shape, m in calls)
    assert plan.plain_seconds_per_step > plan.plain_step_seconds > 0
    assert math.isfinite(plan.expected_round_seconds)


def test_the_default_timers_measure_this_machine() -> None:
    plan = optex.plan(1000, 2, 4, gradient_seconds=1.0)
    assert plan.plain_step_seconds > 0
    assert all(c.overhead_seconds > 0 and math.isfinite(c.overhead_seconds) for c in plan.candidates)
    assert plan.choice == "optex"  # a 1 s gradient hides any overhead at d = 1000


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(), "exactly one"),
        (dict(gradient_seconds=1.0, objective=lambda x: (0.0, x)), "exactly one"),
        (dict(gradient_seconds=0.0), "gradient_seconds"),
        (dict(gradient_seconds=-1.0), "gradient_seconds"),
        (dict(gradient_seconds=math.nan), "gradient_seconds"),
        (dict(gradient_seconds=math.inf), "gradient_seconds"),
        (dict(gradient_seconds=1.0, efficiency=0.0), "efficiency"),
        (dict(gradient_seconds=1.0, efficiency=1.5), "efficiency"),
        (dict(gradient_seconds=1.0, gradient_noise=-0.5), "gradient_noise"),
        (dict(gradient_seconds=1.0, gradient_noise=math.inf), "gradient_noise: must be finite"),
        (dict(gradient_seconds=1.0, gradient_noise=-math.inf), "gradient_noise"),
        (dict(gradient_seconds=1.0, threads=-1), "threads"),
        (dict(gradient_seconds=1.0, device="tpu"), "device"),
        (dict(gradient_seconds=1.0, dim=0), "dim"),
        (dict(gradient_seconds=1.0, dim=-5), "dim"),
        (dict(gradient_seconds=1.0, parallelism=0), "^parallelism: must be in"),
        (dict(gradient_seconds=1.0, parallelism=70000), "^parallelism: must be in"),
        (dict(gradient_seconds=1.0, history=0), "history"),
        (dict(gradient_seconds=1.0, history=5000), "history"),
        (dict(gradient_seconds=1.0, repetitions=0), "^repetitions: must be in \\[3, 100\\]"),
        (dict(gradient_seconds=1.0, repetitions=2), "^repetitions: must be in \\[3, 100\\]"),
        (dict(gradient_seconds=1.0, repetitions=-1), "^repetitions: must be in \\[3, 100\\]"),
        (dict(gradient_seconds=1.0, repetitions=101), "^repetitions: must be in \\[3, 100\\]"),
        (dict(objective=None, repetitions=0), "^repetitions"),  # before the objective runs
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(kwargs: dict, field: str) -> None:
    timers = FakeTimers(a=1e-3)
    called = []
    args = dict(dim=100, parallelism=4, history=8)
    args.update(kwargs)
    if "objective" in args:
        args["objective"] = lambda x: called.append(x) or (0.0, x)
    with pytest.raises(ValueError, match=field):
        optex.plan(args.pop("dim"), args.pop("parallelism"), args.pop("history"),
                   round_timer=timers.round, step_timer=timers.step, **args)
    assert timers.round_calls == timers.step_calls == 0 and not called


def test_an_objective_with_a_bad_dimension_or_a_bad_argument_is_refused() -> None:
    timers = FakeTimers(a=1e-3)
    called = []

    def objective(x):
        called.append(x)
        return 0.0, x

    with pytest.raises(ValueError, match="efficiency"):
        optex.plan(10, 2, 4, objective=objective, efficiency=2.0)
    assert not called
    with pytest.raises(ValueError, match=r"objective: the gradient it returned has shape \(5,\)"):
        optex.plan(10, 2, 4, objective=lambda x: (0.0, x[:5]), round_timer=timers.round,
                   step_timer=timers.step)
    with pytest.raises(ValueError, match="objective: must return"):
        optex.plan(10, 2, 4, objective=lambda x: 0.0, round_timer=timers.round,
                   step_timer=timers.step)
    with pytest.raises(ZeroDivisionError):
        optex.plan(10, 2, 4, objective=lambda x: 1 / 0)
    assert timers.round_calls == 0


def test_a_timer_that_returns_nonsense_is_refused() -> None:
    with pytest.raises(ValueError, match="round_seconds"):
        optex.plan(10, 2, 4, gradient_seconds=1.0, round_timer=lambda d, n, t: math.nan,
                   step_timer=lambda d: 1e-4)
    with pytest.raises(RuntimeError, match="boom"):
        def fails(d, n, t):
            raise RuntimeError("boom")
        optex.plan(10, 2, 4, gradient_seconds=1.0, round_timer=fails, step_timer=lambda d: 1e-4)
    # Something that is no number of seconds: a TypeError naming the timer, not pybind11's
    # "Unable to cast".
    for returned in ("1e-3", None, True, np.zeros(2), [1e-3]):
        with pytest.raises(TypeError, match=r"^round_timer: must return a number of seconds, got"):
            optex.plan(10, 2, 4, gradient_seconds=1.0, round_timer=lambda d, n, t, r=returned: r,
                       step_timer=lambda d: 1e-4)
        with pytest.raises(TypeError, match=r"^step_timer: must return a number of seconds, got"):
            optex.plan(10, 2, 4, gradient_seconds=1.0, round_timer=lambda d, n, t: 1e-3,
                       step_timer=lambda d, r=returned: r)
    # numpy's scalars are numbers.
    assert optex.plan(10, 2, 4, gradient_seconds=1.0, round_timer=lambda d, n, t: np.float32(1e-3),
                      step_timer=lambda d: np.float64(1e-4)).choice in ("optex", "sequential", "averaging")


# ------------------------------------------------------------ optex-plan's checks, shared

HUGE = 10**15  # (2 T0 + 4 N + 16) d floats: hundreds of petabytes


def test_a_dimension_that_cannot_fit_is_refused_as_optex_plan_refuses_it() -> None:
    called = []

    def objective(x):
        called.append(x)
        return 0.0, x

    message = (r"^dim: 1000000000000000 is too large for this machine: a round at N = 4, T0 = 32 "
               r"needs about 3\.84e\+08 GB, it has [0-9.e+]+ GB$")
    with pytest.raises(ValueError, match=message):
        optex.plan(HUGE, 4, 32, gradient_seconds=1.0)
    with pytest.raises(ValueError, match=message):  # before the objective is called
        optex.plan(HUGE, 4, 32, objective=objective)
    assert not called
    timers = FakeTimers(a=1e-3)
    with pytest.raises(ValueError, match=message):  # the plain step is still measured
        optex.plan(HUGE, 4, 32, gradient_seconds=1.0, round_timer=timers.round)
    assert timers.round_calls == 0
    # With both timers given nothing of that size is allocated: the model alone plans.
    plan = optex.plan(HUGE, 4, 32, gradient_seconds=1.0, round_timer=timers.round,
                      step_timer=timers.step)
    assert plan.choice == "optex"


@pytest.mark.parametrize(
    "result, message",
    [
        (lambda x: (0.0, np.full(x.size, np.nan, np.float32)), r"gradient it returned .* holds nan at element 0"),
        (lambda x: (0.0, np.where(np.arange(x.size) == 3, np.inf, x)), r"holds inf at element 3 \(1 non-finite"),
        (lambda x: (0.0, np.ones(x.size, np.int64)), r"the gradient it returned: dtype int64 is not supported"),
        (lambda x: (0.0, np.ones(x.size, np.int32)), r"dtype int32"),
        (lambda x: (0.0, np.ones(x.size, np.float16)), r"dtype float16"),
        (lambda x: (0.0, np.ones(x.size, bool)), r"dtype bool"),
        (lambda x: (0.0, x.reshape(2, -1)), r"the gradient it returned has shape \(2, 5\), expected \(10,\)"),
        (lambda x: (0.0, ["a"] * x.size), r"the gradient it returned must hold real numbers, got 'a' \(str\)"),
        (lambda x: (math.nan, x), r"the loss it returned at a point in \[-1, 1\] is nan"),
        (lambda x: (math.inf, x), r"the loss it returned .* is inf"),
        (lambda x: (object(), x), r"the loss it returned must be a real number, got <object object"),
    ],
)
def test_an_objective_whose_result_is_not_a_finite_float_gradient_is_refused(result, message) -> None:
    timers = FakeTimers(a=1e-3)
    calls = []

    def objective(x):
        calls.append(x)
        return result(x)

    with pytest.raises(ValueError, match=message) as refused:
        optex.plan(10, 2, 4, objective=objective, round_timer=timers.round, step_timer=timers.step)
    assert str(refused.value).startswith("objective: ")
    assert len(calls) == 1  # refused after the first, untimed call; nothing timed or measured
    assert timers.round_calls == timers.step_calls == 0


def test_an_objective_may_return_float64_arrays_lists_and_numpy_losses() -> None:
    timers = FakeTimers(a=1e-3)
    for result in (lambda x: (np.float32(1.0), x.astype(np.float64)),
                   lambda x: (1, [float(v) for v in x]),
                   lambda x: (np.array(2.0), tuple(float(v) for v in x))):
        plan = optex.plan(10, 2, 4, objective=result, round_timer=timers.round, step_timer=timers.step)
        assert math.isfinite(plan.expected_round_seconds)


@pytest.mark.parametrize("repetitions", [math.nan, 4.5, "five", 10**30])
def test_repetitions_that_are_not_an_int_are_refused(repetitions) -> None:
    timers = FakeTimers(a=1e-3)
    with pytest.raises(TypeError):
        optex.plan(100, 4, 8, gradient_seconds=1.0, repetitions=repetitions,
                   round_timer=timers.round, step_timer=timers.step)
    assert timers.round_calls == timers.step_calls == 0


class NoisyTimers(FakeTimers):
    """Each repetition scales the times by the next of `factors`."""

    def __init__(self, factors: list[float], **kwargs) -> None:
        super().__init__(**kwargs)
        self.factors = factors
        self.repetition = -1

    def step(self, dim: int) -> float:
        self.repetition += 1  # plan() times the plain step first in each repetition
        return super().step(dim) * self.factors[self.repetition]

    def round(self, dim: int, parallelism: int, history: int) -> float:
        return super().round(dim, parallelism, history) * self.factors[self.repetition]


def test_every_time_is_reported_with_its_median_and_quartiles() -> None:
    timers = NoisyTimers([3, 1, 2, 5, 4], a=1e-3, p=1e-4)
    plan = timers.plan(1.0, parallelism=2, history=8, repetitions=5)
    assert plan.plain_step_spread == pytest.approx(dict(
        median=3e-4, low_quartile=2e-4, high_quartile=4e-4, min=1e-4, max=5e-4, count=5))
    c = plan.candidates[1]
    assert c.overhead_spread == pytest.approx(dict(
        median=3e-3, low_quartile=2e-3, high_quartile=4e-3, min=1e-3, max=5e-3, count=5))
    assert c.overhead_seconds == pytest.approx(3e-3)
    assert c.break_even_low <= c.break_even_gradient_seconds <= c.break_even_high
    assert c.seconds_per_step_low <= c.seconds_per_step <= c.seconds_per_step_high
    assert "every time measured 5 times" in str(plan)


def test_a_gradient_within_the_break_even_spread_is_uncertain_and_keeps_the_plain_optimizer() -> None:
    # N = 2, e = 0.5, a free plain step: break-even 2 o; o in 8, 10, 12 ms has IQR [9, 11] ms.
    timers = NoisyTimers([1.0, 0.8, 1.2], a=10e-3, p=0.0)
    plan = timers.plan(22e-3, parallelism=2, history=32, repetitions=3)
    c = plan.candidates[1]
    assert c.break_even_gradient_seconds == pytest.approx(20e-3)
    assert (c.break_even_low, c.break_even_high) == pytest.approx((18e-3, 22e-3))
    # 22 ms is at the interval's top: not above it.
    assert plan.choice == "sequential" and plan.uncertain
    assert "(uncertain: within the measured spread)" in str(plan)
    timers = NoisyTimers([1.0, 0.8, 1.2], a=10e-3, p=0.0)
    plan = timers.plan(30e-3, parallelism=2, history=32, repetitions=3)
    assert plan.choice == "optex" and not plan.uncertain
    assert (plan.break_even_low, plan.break_even_high) == pytest.approx((18e-3, 22e-3))


def test_the_report_names_the_same_budget_alternatives_and_its_assumption() -> None:
    plan = FakeTimers(a=1e-3).plan(0.05)
    for needle in ("N x lr", "N x minibatch", "parallel line search", "cannot rank OptEx"):
        assert needle in plan.alternatives and needle in str(plan)
    assert "e = 0.5" in plan.assumption and "e was 0.5 on median" in plan.assumption
    one = FakeTimers(a=1e-3).plan(0.05, parallelism=1)
    assert one.choice == "sequential" and "N = 1 is the plain optimizer" in one.alternatives
