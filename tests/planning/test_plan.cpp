// The planner (plan.hpp) with fake timers: its candidates, where its
// recommendation flips, the T0 and noise rules, and its refusals; and the
// round-cost measurements (round_cost.hpp) on tiny shapes, for sanity only:
// nothing here depends on how fast the machine is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "optex/engine/adaptive_split.hpp"
#include "optex/planning/plan.hpp"
#include "optex/planning/round_cost.hpp"
#include "support/throws_with.hpp"

namespace {

using optex::Plan;
using optex::PlanRequest;
using optex::RoundShape;
using optex::test::ThrowsWith;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// o = a + b N T0 d, a plain step p; counts the calls.
struct FakeTimers {
  double a = 0.0;
  double b = 0.0;
  double p = 1e-4;
  int round_calls = 0;
  int step_calls = 0;

  optex::RoundTimer round() {
    return [this](const RoundShape& s) {
      ++round_calls;
      return a + b * s.parallelism * s.history * static_cast<double>(s.dim);
    };
  }
  optex::StepTimer step() {
    return [this](std::size_t) {
      ++step_calls;
      return p;
    };
  }
  double overhead(int n, int t0, std::size_t d) const {
    return a + b * n * t0 * static_cast<double>(d);
  }
};

PlanRequest request(double gradient_seconds, int n = 8, int t0 = 32) {
  PlanRequest r;
  r.dim = 100000;
  r.max_parallelism = n;
  r.history = t0;
  r.gradient_seconds = gradient_seconds;
  return r;
}

Plan run(const PlanRequest& r, FakeTimers& t) { return optex::plan(r, t.round(), t.step()); }

TEST(Plan, TwoCallsGiveTheSameReport) {
  FakeTimers t{.a = 1e-3, .b = 1e-10};
  const PlanRequest r = request(0.05);
  const std::string first = optex::format_plan(run(r, t));
  const std::string second = optex::format_plan(run(r, t));
  EXPECT_EQ(first, second);
  EXPECT_NE(first.find("Recommendation: "), std::string::npos) << first;
}

TEST(Plan, CandidatesAreWhatTheModelSays) {
  FakeTimers t{.a = 1e-3, .b = 1e-10, .p = 2e-4};
  PlanRequest r = request(0.05);
  r.efficiency = 0.25;
  const Plan plan = run(r, t);
  // P = 1 first, then T0 = 32, 16, 8, each with N = 2, 4, 8.
  struct Expected {
    int n, t0;
  };
  const std::vector<Expected> expected{{1, 32}, {2, 32}, {4, 32}, {8, 32}, {2, 16},
                                       {4, 16}, {8, 16}, {2, 8},  {4, 8},  {8, 8}};
  ASSERT_EQ(plan.candidates.size(), expected.size());
  // Each time measured R = 5 times (PlanRequest::repetitions).
  EXPECT_EQ(t.round_calls, 9 * 5);
  EXPECT_EQ(t.step_calls, 5);
  EXPECT_DOUBLE_EQ(plan.plain_step_seconds, 2e-4);
  EXPECT_DOUBLE_EQ(plan.plain_seconds_per_step, 0.05 + 2e-4);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const optex::PlanCandidate& c = plan.candidates[i];
    SCOPED_TRACE("candidate " + std::to_string(i));
    EXPECT_EQ(c.parallelism, expected[i].n);
    EXPECT_EQ(c.history, expected[i].t0);
    EXPECT_EQ(c.evaluations_per_point, 1);
    EXPECT_EQ(c.points, c.parallelism);
    const double s = 1.0 + 0.25 * (c.points - 1);
    EXPECT_DOUBLE_EQ(c.steps_per_round, s);
    if (c.points == 1) {
      EXPECT_DOUBLE_EQ(c.overhead_seconds, 2e-4);
      EXPECT_TRUE(std::isnan(c.break_even_gradient_seconds));
    } else {
      const double o = t.overhead(c.parallelism, c.history, r.dim);
      EXPECT_DOUBLE_EQ(c.overhead_seconds, o);
      EXPECT_DOUBLE_EQ(c.break_even_gradient_seconds, std::max(0.0, (o - s * 2e-4) / (s - 1.0)));
    }
    EXPECT_DOUBLE_EQ(c.round_seconds, 0.05 + c.overhead_seconds);
    EXPECT_DOUBLE_EQ(c.seconds_per_step, c.round_seconds / s);
  }
}

TEST(Plan, CandidateParallelismAndHistoriesAtOddSizes) {
  FakeTimers t{.a = 1e-3};
  // N = 6: 1, 2, 4 and 6 itself; T0 = 8: 8 and 4 (2 is too small).
  Plan plan = run(request(0.05, 6, 8), t);
  std::vector<std::pair<int, int>> got;
  for (const auto& c : plan.candidates) got.emplace_back(c.parallelism, c.history);
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{
                     {1, 8}, {2, 8}, {4, 8}, {6, 8}, {2, 4}, {4, 4}, {6, 4}}));
  // T0 = 5: no half is >= 4; the user's T0 stays even below 4.
  plan = run(request(0.05, 2, 5), t);
  ASSERT_EQ(plan.candidates.size(), 2u);
  EXPECT_EQ(plan.candidates[1].history, 5);
  plan = run(request(0.05, 2, 2), t);
  ASSERT_EQ(plan.candidates.size(), 2u);
  EXPECT_EQ(plan.candidates[1].history, 2);
}

// The recommendation flips exactly at the reported break-even.
void expect_flip_at_break_even(FakeTimers t, double start) {
  const Plan slow = run(request(start), t);
  ASSERT_EQ(slow.choice, Plan::Choice::sequential) << optex::format_plan(slow);
  const double w = slow.break_even_gradient_seconds;
  ASSERT_TRUE(std::isfinite(w) && w > start) << w;
  EXPECT_NE(slow.reason.find("OptEx pays off above"), std::string::npos) << slow.reason;

  const Plan below = run(request(w * (1.0 - 1e-6)), t);
  EXPECT_EQ(below.choice, Plan::Choice::sequential) << optex::format_plan(below);
  EXPECT_DOUBLE_EQ(below.break_even_gradient_seconds, w);
  EXPECT_EQ(below.parallelism, 1);

  const Plan above = run(request(w * (1.0 + 1e-6)), t);
  ASSERT_EQ(above.choice, Plan::Choice::optex) << optex::format_plan(above);
  EXPECT_GE(above.parallelism, 2);
  EXPECT_LT(above.break_even_gradient_seconds, w * (1.0 + 1e-6));
  EXPECT_LT(above.expected_round_seconds / (1.0 + 0.5 * (above.parallelism - 1)),
            above.plain_seconds_per_step);
}

TEST(Plan, FlipsFromSequentialToOptexAtTheBreakEven) {
  // A fixed cost per round dominates: the largest N pays off first.
  expect_flip_at_break_even(FakeTimers{.a = 10e-3, .b = 1e-11, .p = 5e-4}, 1e-3);
  // A cost that grows with N T0 d: the T0 rule cuts the history near the flip.
  expect_flip_at_break_even(FakeTimers{.a = 1e-4, .b = 1e-9, .p = 5e-4}, 1e-3);
}

TEST(Plan, WithOverheadIndependentOfT0TheBreakEvenIsThatOfTheLargestN) {
  FakeTimers t{.a = 10e-3, .p = 5e-4};
  const Plan plan = run(request(1e-3), t);
  ASSERT_EQ(plan.choice, Plan::Choice::sequential);
  const optex::PlanCandidate& largest = plan.candidates[3];
  ASSERT_EQ(largest.parallelism, 8);
  ASSERT_EQ(largest.history, 32);
  EXPECT_DOUBLE_EQ(plan.break_even_gradient_seconds, largest.break_even_gradient_seconds);
}

TEST(Plan, CutsTheHistoryWhenItsOverheadExceedsTenPercentOfTheGradient) {
  // o(N, T0) = 1e-5 N T0 s at d = 1e5: o(8, 32) = 2.56 ms, o(8, 16) = 1.28 ms.
  FakeTimers t{.b = 1e-10, .p = 1e-4};
  Plan plan = run(request(0.1), t);  // 10% = 10 ms: T0 = 32 stays
  ASSERT_EQ(plan.choice, Plan::Choice::optex);
  EXPECT_EQ(plan.parallelism, 8);
  EXPECT_EQ(plan.history, 32);
  EXPECT_EQ(plan.reason.find("instead of"), std::string::npos) << plan.reason;

  plan = run(request(0.015), t);  // 10% = 1.5 ms: T0 = 16 is the largest that fits
  ASSERT_EQ(plan.choice, Plan::Choice::optex);
  EXPECT_EQ(plan.parallelism, 8);
  EXPECT_EQ(plan.history, 16);
  EXPECT_NE(plan.reason.find("T0 = 16 instead of 32"), std::string::npos) << plan.reason;
  EXPECT_DOUBLE_EQ(plan.expected_round_seconds, 0.015 + t.overhead(8, 16, 100000));
  EXPECT_DOUBLE_EQ(plan.break_even_gradient_seconds,
                   plan.candidates[6].break_even_gradient_seconds);

  plan = run(request(0.005), t);  // 10% = 0.5 ms: none fits, the smallest T0
  ASSERT_EQ(plan.choice, Plan::Choice::optex);
  EXPECT_EQ(plan.history, 8);
  EXPECT_NE(plan.reason.find("T0 = 8 instead of 32"), std::string::npos) << plan.reason;
  // It does not pretend T0 = 8 fits, and names what the cut assumes.
  EXPECT_NE(plan.reason.find("no T0 tried keeps it within that"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("assumes a shorter history advances as many steps"), std::string::npos)
      << plan.reason;
}

TEST(Plan, HighNoiseRecommendsAveragingOverEveryEvaluation) {
  FakeTimers t{.a = 1e-6, .p = 1e-4};
  PlanRequest r = request(0.05);
  r.gradient_noise = 100.0;
  const Plan plan = run(r, t);
  EXPECT_EQ(plan.choice, Plan::Choice::averaging);
  EXPECT_EQ(plan.parallelism, 8);
  EXPECT_EQ(plan.evaluations_per_point, 8);
  EXPECT_EQ(t.round_calls, 0);  // P = 1 only: nothing to model
  ASSERT_EQ(plan.candidates.size(), 1u);
  EXPECT_EQ(plan.candidates[0].points, 1);
  EXPECT_EQ(plan.candidates[0].evaluations_per_point, 8);
  EXPECT_TRUE(std::isinf(plan.break_even_gradient_seconds));
  EXPECT_EQ(plan.reason.find("unknown"), std::string::npos) << plan.reason;
  EXPECT_STREQ(optex::choice_name(plan.choice), "averaging");
}

TEST(Plan, ModerateNoiseSplitsEachPointOverTwoEvaluations) {
  FakeTimers t{.a = 1e-6, .p = 1e-4};
  PlanRequest r = request(0.05);
  r.gradient_noise = 0.5;
  ASSERT_EQ(optex::AdaptiveSplit::evaluations_for(8, 0.5), 2);
  const Plan plan = run(r, t);
  ASSERT_EQ(plan.choice, Plan::Choice::optex) << optex::format_plan(plan);
  EXPECT_EQ(plan.evaluations_per_point, 2);
  EXPECT_EQ(plan.parallelism, 8);
  // N = 2, 4, 8: P = 1, 2, 4.
  std::vector<int> ns;
  for (const auto& c : plan.candidates) {
    if (c.history == 32) ns.push_back(c.parallelism);
    EXPECT_EQ(c.points, c.parallelism / 2);
  }
  EXPECT_EQ(ns, (std::vector<int>{2, 4, 8}));
}

TEST(Plan, NoiseTheModelCannotBeatFallsBackToAveragingWithNEqualD) {
  // rho = 0.5 asks D = 2; an overhead far above the gradient leaves OptEx out.
  FakeTimers t{.a = 1.0, .p = 1e-4};
  PlanRequest r = request(0.05);
  r.gradient_noise = 0.5;
  const Plan plan = run(r, t);
  EXPECT_EQ(plan.choice, Plan::Choice::averaging);
  EXPECT_EQ(plan.parallelism, 2);
  EXPECT_EQ(plan.evaluations_per_point, 2);
}

TEST(Plan, UnknownNoiseSaysSoAndSuggestsTheAdaptiveStrategy) {
  FakeTimers t{.a = 1e-3};
  const Plan plan = run(request(0.05), t);
  EXPECT_EQ(plan.evaluations_per_point, 1);
  EXPECT_NE(plan.reason.find("unknown"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("Options::adaptive(8)"), std::string::npos) << plan.reason;
}

TEST(Plan, OneWorkerIsSequential) {
  FakeTimers t{.a = 1e-9};
  const Plan plan = run(request(0.05, 1), t);
  EXPECT_EQ(plan.choice, Plan::Choice::sequential);
  EXPECT_EQ(plan.parallelism, 1);
  EXPECT_EQ(t.round_calls, 0);
  EXPECT_TRUE(std::isinf(plan.break_even_gradient_seconds));
  const std::string report = optex::format_plan(plan);
  EXPECT_NE(report.find("OptEx is recommended at no gradient time"), std::string::npos) << report;
  EXPECT_NE(report.find("the plain optimizer (N = 1)"), std::string::npos) << report;
  EXPECT_NE(plan.assumption.find("N = 1 is the plain optimizer"), std::string::npos)
      << plan.assumption;
  EXPECT_NE(plan.alternatives.find("N = 1 is the plain optimizer"), std::string::npos)
      << plan.alternatives;
  EXPECT_EQ(report.find("extra steps per round save"), std::string::npos) << report;
}

TEST(Plan, BadRequestsAreRefusedBeforeAnyTimerRuns) {
  struct Case {
    const char* field;
    void (*spoil)(PlanRequest&);
  };
  const std::vector<Case> cases{
      {"dim", [](PlanRequest& r) { r.dim = 0; }},
      {"max_parallelism", [](PlanRequest& r) { r.max_parallelism = 0; }},
      {"max_parallelism", [](PlanRequest& r) { r.max_parallelism = -3; }},
      {"max_parallelism", [](PlanRequest& r) { r.max_parallelism = 65537; }},
      {"history", [](PlanRequest& r) { r.history = 0; }},
      {"history", [](PlanRequest& r) { r.history = 4097; }},
      {"threads", [](PlanRequest& r) { r.threads = -1; }},
      {"gradient_seconds", [](PlanRequest& r) { r.gradient_seconds = 0.0; }},
      {"gradient_seconds", [](PlanRequest& r) { r.gradient_seconds = -1.0; }},
      {"gradient_seconds", [](PlanRequest& r) { r.gradient_seconds = kNaN; }},
      {"gradient_seconds", [](PlanRequest& r) { r.gradient_seconds = kInf; }},
      {"efficiency", [](PlanRequest& r) { r.efficiency = 0.0; }},
      {"efficiency", [](PlanRequest& r) { r.efficiency = 1.5; }},
      {"efficiency", [](PlanRequest& r) { r.efficiency = kNaN; }},
      {"gradient_noise", [](PlanRequest& r) { r.gradient_noise = -0.1; }},
      {"gradient_noise", [](PlanRequest& r) { r.gradient_noise = -kInf; }},
      {"gradient_noise", [](PlanRequest& r) { r.gradient_noise = kInf; }},
      {"repetitions", [](PlanRequest& r) { r.repetitions = 0; }},
      {"repetitions", [](PlanRequest& r) { r.repetitions = 2; }},
      {"repetitions", [](PlanRequest& r) { r.repetitions = -5; }},
      {"repetitions", [](PlanRequest& r) { r.repetitions = 101; }},
  };
  for (const Case& c : cases) {
    FakeTimers t{.a = 1e-3};
    PlanRequest r = request(0.05);
    c.spoil(r);
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { run(r, t); }, {c.field})) << c.field;
    EXPECT_EQ(t.round_calls, 0) << c.field;
    EXPECT_EQ(t.step_calls, 0) << c.field;
  }
}

TEST(Plan, InfiniteNoiseIsRefusedNamingTheRule) {
  FakeTimers t{.a = 1e-3};
  PlanRequest r = request(0.05);
  r.gradient_noise = kInf;
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { run(r, t); }, {"gradient_noise: must be finite and >= 0", "got inf"}));
}

// optex-plan's memory check, in the library: a dimension whose largest
// measurement cannot fit is refused before anything is allocated.
TEST(Plan, ADimensionThatCannotFitIsRefusedBeforeAnythingIsMeasured) {
  PlanRequest r = request(0.05, 4, 32);
  r.dim = 1'000'000'000'000'000;  // (2 T0 + 4 N + 16) d floats: 384 PB
  EXPECT_DOUBLE_EQ(optex::plan_memory_bytes(r), (2.0 * 32 + 4.0 * 4 + 16.0) * 1e15 * 4.0);
  const std::vector<std::string> needles = {
      "dim: 1000000000000000 is too large for this machine: a round at N = 4, T0 = 32 needs "
      "about 3.84e+08 GB, it has "};
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { optex::check_plan_memory(r); }, needles));
  // plan() measuring this machine (a timer left empty) refuses it the same way
  // instead of failing an allocation of that size.
  FakeTimers t{.a = 1e-3};
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { optex::plan(r, t.round(), {}); }, needles));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { optex::plan(r, {}, t.step()); }, needles));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { optex::plan(r); }, needles));
  EXPECT_EQ(t.round_calls + t.step_calls, 0);
  // With both timers given nothing of that size is allocated: the model alone.
  EXPECT_EQ(run(r, t).candidates.size(), 7u);  // P = 1, then N = 2, 4 at T0 = 32, 16, 8
  // A dimension that fits passes.
  r.dim = 1000;
  EXPECT_NO_THROW(optex::check_plan_memory(r));
}

TEST(Plan, ATimerThatReturnsNonsenseIsRefused) {
  const PlanRequest r = request(0.05);
  const optex::StepTimer step = [](std::size_t) { return 1e-4; };
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] {
        optex::plan(
            r, [](const RoundShape&) { return kNaN; }, step);
      },
      {"round_seconds"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] {
        optex::plan(
            r, [](const RoundShape&) { return 1e-3; }, [](std::size_t) { return -1.0; });
      },
      {"step_seconds"}));
}

// The statistics every measured time is reported with, against hand-computed
// quartiles (linear interpolation at q (n - 1)).
TEST(Spread, MedianAndQuartilesOfAnOddCount) {
  const optex::Spread s = optex::spread_of({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.low_quartile, 2);
  EXPECT_DOUBLE_EQ(s.high_quartile, 4);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.interquartile_range(), 2);
  // An outlier moves neither the median nor the quartiles.
  const optex::Spread busy = optex::spread_of({1, 2, 3, 4, 100});
  EXPECT_DOUBLE_EQ(busy.median, 3);
  EXPECT_DOUBLE_EQ(busy.high_quartile, 4);
  EXPECT_DOUBLE_EQ(busy.max, 100);
}

TEST(Spread, MedianAndQuartilesOfAnEvenCountInterpolate) {
  // Positions 0.75, 1.5 and 2.25 of {1, 2, 3, 4}.
  const optex::Spread s = optex::spread_of({4, 3, 2, 1});
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.low_quartile, 1.75);
  EXPECT_DOUBLE_EQ(s.high_quartile, 3.25);
  const optex::Spread one = optex::spread_of({7});
  EXPECT_DOUBLE_EQ(one.low_quartile, 7);
  EXPECT_DOUBLE_EQ(one.high_quartile, 7);
  EXPECT_EQ(one.count, 1);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([] { optex::spread_of({}); }, {"samples"}));
}

// The decision rule on synthetic measurements (recommend_plan): no timing.
optex::Spread around(double median, double half_width) {
  return {.median = median,
          .low_quartile = median - half_width,
          .high_quartile = median + half_width,
          .min = median - 2 * half_width,
          .max = median + 2 * half_width,
          .count = 5};
}

// N <= 2, e = 0.5 (s = 1.5), a free plain step: break-even = o / 0.5 = 2 o.
Plan one_candidate(double gradient_seconds, const optex::Spread& overhead) {
  PlanRequest r = request(gradient_seconds, 2, 32);
  return optex::recommend_plan(r, {{.parallelism = 2, .history = 32, .overhead = overhead}},
                               optex::Spread::exactly(0.0));
}

TEST(PlanDecision, AGradientInsideTheBreakEvenIntervalIsUncertainAndKeepsThePlainOptimizer) {
  // o = 10 ms, IQR [8, 12] ms: break-even 20 ms, interval [16, 24] ms.
  const optex::Spread o = around(10e-3, 2e-3);
  for (double g : {22e-3, 18e-3}) {  // above and below the median break-even
    SCOPED_TRACE(g);
    const Plan plan = one_candidate(g, o);
    EXPECT_EQ(plan.choice, Plan::Choice::sequential) << optex::format_plan(plan);
    EXPECT_TRUE(plan.uncertain);
    EXPECT_EQ(plan.parallelism, 1);
    const optex::PlanCandidate& c = plan.candidates[1];
    EXPECT_NEAR(c.break_even_gradient_seconds, 20e-3, 1e-12);
    EXPECT_NEAR(c.break_even_low, 16e-3, 1e-12);
    EXPECT_NEAR(c.break_even_high, 24e-3, 1e-12);
    // OptEx is recommended only above the whole interval.
    EXPECT_NEAR(plan.break_even_gradient_seconds, 24e-3, 1e-12);
    const std::string report = optex::format_plan(plan);
    EXPECT_NE(report.find("(uncertain: within the measured spread)"), std::string::npos) << report;
  }
}

TEST(PlanDecision, AGradientOutsideTheIntervalIsAConfidentChoice) {
  const optex::Spread o = around(10e-3, 2e-3);
  Plan plan = one_candidate(30e-3, o);
  EXPECT_EQ(plan.choice, Plan::Choice::optex);
  EXPECT_FALSE(plan.uncertain);
  EXPECT_NEAR(plan.break_even_low, 16e-3, 1e-12);
  EXPECT_NEAR(plan.break_even_high, 24e-3, 1e-12);
  EXPECT_EQ(optex::format_plan(plan).find("uncertain"), std::string::npos);
  plan = one_candidate(10e-3, o);
  EXPECT_EQ(plan.choice, Plan::Choice::sequential);
  EXPECT_FALSE(plan.uncertain);
  EXPECT_EQ(optex::format_plan(plan).find("uncertain"), std::string::npos);
}

TEST(PlanDecision, TwoRunsWhoseMediansStraddleTheGradientButWhoseIntervalsOverlapAgree) {
  // Run A's median break-even (20 ms) is below the gradient, run B's (22 ms)
  // above: on medians alone they would flip. Their intervals overlap.
  const double g = 21e-3;
  const Plan a = one_candidate(g, around(10e-3, 2e-3));
  const Plan b = one_candidate(g, around(11e-3, 2e-3));
  ASSERT_LT(a.candidates[1].break_even_gradient_seconds, g);
  ASSERT_GT(b.candidates[1].break_even_gradient_seconds, g);
  EXPECT_EQ(a.choice, Plan::Choice::sequential);
  EXPECT_EQ(b.choice, Plan::Choice::sequential);
  EXPECT_TRUE(a.uncertain && b.uncertain);
}

// N <= 4, e = 1 (s = 2 and 4), a free plain step, g = 100 ms.
Plan two_candidates(const optex::Spread& overhead_n2, const optex::Spread& overhead_n4) {
  PlanRequest r = request(0.1, 4, 32);
  r.efficiency = 1.0;
  return optex::recommend_plan(r,
                               {{.parallelism = 2, .history = 32, .overhead = overhead_n2},
                                {.parallelism = 4, .history = 32, .overhead = overhead_n4}},
                               optex::Spread::exactly(0.0));
}

TEST(PlanDecision, OverlappingTimesPerStepTakeTheFewerWorkers) {
  // N = 2: (100 + [9, 11]) / 2 = [54.5, 55.5] ms per step; N = 4: (100 +
  // [90, 130]) / 4 = [47.5, 57.5] ms, faster at the medians (52.5 ms).
  Plan plan = two_candidates(around(10e-3, 1e-3), around(110e-3, 20e-3));
  ASSERT_EQ(plan.choice, Plan::Choice::optex) << optex::format_plan(plan);
  EXPECT_EQ(plan.parallelism, 2);
  EXPECT_TRUE(plan.uncertain);
  EXPECT_NE(plan.reason.find("takes the fewer workers"), std::string::npos) << plan.reason;
  EXPECT_NEAR(plan.candidates[2].seconds_per_step_low, 47.5e-3, 1e-12);
  EXPECT_NEAR(plan.candidates[2].seconds_per_step_high, 57.5e-3, 1e-12);
  // Separated: N = 4 at (100 + [58, 62]) / 4 = [39.5, 40.5] ms is surely faster.
  plan = two_candidates(around(10e-3, 1e-3), around(60e-3, 2e-3));
  ASSERT_EQ(plan.choice, Plan::Choice::optex);
  EXPECT_EQ(plan.parallelism, 4);
  EXPECT_FALSE(plan.uncertain);
}

TEST(PlanDecision, BadMeasurementsAreRefusedNamingThem) {
  const PlanRequest r = request(0.05, 4, 32);
  const optex::Spread p = optex::Spread::exactly(1e-4);
  const auto refuses = [&](const optex::MeasuredRound& m, const optex::Spread& step,
                           const char* needle) {
    return ThrowsWith<std::invalid_argument>([&] { optex::recommend_plan(r, {m}, step); },
                                             {needle});
  };
  const optex::Spread o = around(1e-3, 1e-4);
  EXPECT_TRUE(refuses({.parallelism = 1, .history = 32, .overhead = o}, p, "rounds"));  // P = 1
  EXPECT_TRUE(refuses({.parallelism = 8, .history = 32, .overhead = o}, p, "rounds"));
  EXPECT_TRUE(refuses({.parallelism = 2, .history = 64, .overhead = o}, p, "rounds"));
  optex::Spread bad = o;
  bad.median = kNaN;
  EXPECT_TRUE(refuses({.parallelism = 2, .history = 32, .overhead = bad}, p, "round_seconds"));
  bad = o;
  bad.low_quartile = 2e-3;  // above the median
  EXPECT_TRUE(refuses({.parallelism = 2, .history = 32, .overhead = bad}, p, "round_seconds"));
  EXPECT_TRUE(refuses({.parallelism = 2, .history = 32, .overhead = o},
                      optex::Spread::exactly(-1.0), "plain_step"));
}

// plan() measures every time R times, round-robin: each repetition times the
// plain step, then every candidate once.
TEST(PlanDecision, PlanMeasuresRoundRobinAndSummarisesEachCandidate) {
  PlanRequest r = request(0.05, 4, 8);  // N = 2, 4 at T0 = 8, 4
  r.repetitions = 5;
  std::vector<std::string> log;
  int repetition = -1;
  const double samples[] = {3e-3, 1e-3, 2e-3, 5e-3, 4e-3};  // one per repetition
  const Plan plan = optex::plan(
      r,
      [&](const RoundShape& s) {
        log.push_back(std::to_string(s.parallelism) + "/" + std::to_string(s.history));
        return samples[repetition] * s.parallelism;
      },
      [&](std::size_t) {
        log.push_back("step");
        ++repetition;
        return samples[repetition] / 10;
      });
  std::vector<std::string> expected;
  for (int i = 0; i < 5; ++i) expected.insert(expected.end(), {"step", "2/8", "4/8", "2/4", "4/4"});
  EXPECT_EQ(log, expected);
  ASSERT_EQ(plan.candidates.size(), 5u);
  const optex::PlanCandidate& c = plan.candidates[2];  // N = 4, T0 = 8
  EXPECT_EQ(c.overhead.count, 5);
  EXPECT_DOUBLE_EQ(c.overhead_seconds, 12e-3);
  EXPECT_DOUBLE_EQ(c.overhead.low_quartile, 8e-3);
  EXPECT_DOUBLE_EQ(c.overhead.high_quartile, 16e-3);
  EXPECT_DOUBLE_EQ(c.overhead.min, 4e-3);
  EXPECT_DOUBLE_EQ(c.overhead.max, 20e-3);
  EXPECT_DOUBLE_EQ(plan.plain_step_seconds, 3e-4);
  EXPECT_DOUBLE_EQ(plan.plain_step.low_quartile, 2e-4);
  EXPECT_DOUBLE_EQ(plan.plain_step.high_quartile, 4e-4);
  const std::string report = optex::format_plan(plan);
  EXPECT_NE(report.find("every time measured 5 times"), std::string::npos) << report;
  EXPECT_NE(report.find("[8, 16] ms"), std::string::npos) << report;
}

TEST(PlanReport, NamesTheSameBudgetAlternativesAndTheStepsAssumption) {
  FakeTimers t{.a = 1e-3, .b = 1e-10};
  const Plan plan = run(request(0.05), t);
  const std::string report = optex::format_plan(plan);
  for (const char* needle :
       {"Same budget: ", "N x lr", "N x minibatch", "parallel line search", "vanilla_nlr",
        "data_parallel", "line_search", "cannot rank OptEx against them", "docs/RESULTS.md",
        "Assumption: a round of P points advances 1 + e (P - 1) sequential steps, e = 0.5",
        "e was 0.5 on median (IQR 0.41 to 0.67)", "on one worker"}) {
    EXPECT_NE(report.find(needle), std::string::npos) << needle << "\n" << report;
  }
}

TEST(RoundCost, RoundBytesFollowTheDocumentedModel) {
  // d = 1000, N = 4, T0 = 8, k = 2:
  // ask  2 + 3 (16 + 4 + 4) + (4 + 2)                 = 80 rows of d
  // tell 4 + (3 + 4) + 2 * 3 + 2 + 16 + 2 * 12          = 59 rows of d
  const RoundShape shape{.dim = 1000, .parallelism = 4, .history = 8};
  EXPECT_DOUBLE_EQ(optex::round_bytes(shape), (80.0 + 59.0) * 1000.0 * 4.0);
  // N = 1: ask 2; tell 1 + (3 + 4) + 4 (no checks in ask, no step norm pass,
  // no Gram rows until a reader needs them) = 14 rows of d, twice a plain
  // Adam step's 7.
  EXPECT_DOUBLE_EQ(optex::round_bytes({.dim = 1000, .parallelism = 1, .history = 8}),
                   14.0 * 1000.0 * 4.0);
}

TEST(RoundCost, MeasuresATinyRound) {
  const RoundShape shape{.dim = 1000, .parallelism = 2, .history = 4};
  const optex::RoundCost cost = optex::measure_round_cost(shape, 2);
  EXPECT_EQ(cost.rounds, 2);
  for (double s : {cost.seconds, cost.ask_seconds, cost.tell_seconds}) {
    EXPECT_TRUE(std::isfinite(s) && s > 0.0) << s;
  }
  const double plain = optex::measure_plain_step(1000, 3);
  EXPECT_TRUE(std::isfinite(plain) && plain > 0.0) << plain;
  for (int threads : {0, 1, 2}) {
    const double bandwidth = optex::triad_bandwidth(1 << 16, threads, 3);
    EXPECT_TRUE(std::isfinite(bandwidth) && bandwidth > 0.0) << bandwidth;
  }
}

TEST(RoundCost, BadShapesAreRefusedNamingTheField) {
  const auto refuses = [](RoundShape shape, int rounds, const char* field) {
    return ThrowsWith<std::invalid_argument>([&] { optex::measure_round_cost(shape, rounds); },
                                             {field});
  };
  EXPECT_TRUE(refuses({.dim = 0}, 1, "dim"));
  EXPECT_TRUE(refuses({.dim = 10, .parallelism = 0}, 1, "parallelism"));
  EXPECT_TRUE(refuses({.dim = 10, .parallelism = 65537}, 1, "parallelism"));
  EXPECT_TRUE(refuses({.dim = 10, .history = 0}, 1, "history"));
  EXPECT_TRUE(refuses({.dim = 10, .history = 4097}, 1, "history"));
  EXPECT_TRUE(refuses({.dim = 10, .threads = -1}, 1, "threads"));
  EXPECT_TRUE(refuses({.dim = 10}, 0, "rounds"));
  // Refused before anything of that size is allocated.
  EXPECT_TRUE(refuses({.dim = std::numeric_limits<std::size_t>::max()}, 1, "dim"));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([] { optex::round_bytes({.dim = 0}); }, {"dim"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([] { optex::measure_plain_step(0); }, {"dim"}));
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([] { optex::measure_plain_step(10, 0); }, {"repeats"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([] { optex::triad_bandwidth(0); }, {"n"}));
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([] { optex::triad_bandwidth(10, -1); }, {"threads"}));
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([] { optex::triad_bandwidth(10, 1, 0); }, {"repeats"}));
}

}  // namespace
