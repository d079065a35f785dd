// Will OptEx pay off for me? The planner: given the size of the problem and
// the time of one gradient evaluation, it measures a round's overhead on this
// machine for a few N and T0 (round_cost.hpp), each several times, and
// recommends the plain optimizer, averaging (N x minibatch) or OptEx with an N,
// D and T0, saying when the measured spread leaves it uncertain (DESIGN.md
// section 4, "The planner").
//
//   optex::PlanRequest r{.dim = 1'000'000, .max_parallelism = 8, .history = 32,
//                        .gradient_seconds = 0.05};
//   std::cout << optex::format_plan(optex::plan(r));
//
// The model. P = N / D points per round, e = efficiency, g = gradient_seconds,
// o(N, T0) = the round's overhead (ask() + tell()), p = one plain step:
// - D: with the gradient noise rho known, AdaptiveSplit::evaluations_for(N, rho):
//   the fewest divisors D of N with rho / D <= AdaptiveSplit::kNoiseTarget
//   (0.25), else N. Unknown noise: D = 1, and the reason says so and suggests
//   Options::adaptive(N), which measures it.
// - Candidate N: D times 1, 2, 4, ... while <= max_parallelism, and
//   max_parallelism itself when not listed (D divides it). Candidate T0: the
//   user's T0, T0 / 2 and T0 / 4, the halves only when >= 4. o(N, T0) is
//   measured for every candidate with P >= 2; P = 1 has the plain step as its
//   overhead (listed once, at the user's T0).
// - Every time is measured `repetitions` times, round-robin over the
//   candidates (a busy spell then widens every candidate's spread instead of
//   moving one), and summarised as a Spread: its median is the time the rules
//   below use, its quartiles the interval they are sure of.
// - A round advances s = 1 + e (P - 1) sequential steps (the assumption: each
//   proxy step is worth e of a true one, at every T0); it takes g + o;
//   seconds per step (g + o) / s. The plain optimizer: g + p per step.
//   break_even = max(0, (o - s p) / (s - 1)) (P >= 2): the gradient time above
//   which the round beats the plain optimizer. Its interval: from the low
//   quartile of o with the high one of p to the high quartile of o with the
//   low one of p.
// - T0 (on the medians): the user's, unless its overhead at the best N (lowest seconds per step
//   at the user's T0, ties: the smaller N) exceeds 10% of g; then the largest
//   candidate T0 whose overhead at that N is <= 10% of g, or the smallest if
//   none.
// - N: at that T0, the lowest seconds per step (ties: the smaller N). If it
//   does not beat g + p: Choice::sequential when D = 1, Choice::averaging with
//   N = D when D > 1. Otherwise Choice::optex with that N, D and T0.
// - How sure (Plan::uncertain): OptEx is recommended only when g lies above
//   the chosen candidate's whole break-even interval; when g lies inside it the
//   plan is the simpler choice (plain or averaging) and says "uncertain: within
//   the measured spread". Likewise when median decides the simpler choice but
//   g reaches into a candidate's break-even interval at that T0. Among OptEx
//   candidates at the chosen T0 that clear their break-even interval, the
//   smallest N whose seconds-per-step interval overlaps the best one's is
//   chosen (fewer workers for a difference the spread cannot tell). Each rule
//   is a function of the statistics alone (recommend_plan), so two runs whose
//   intervals agree give the same plan.
// Plan::break_even_gradient_seconds is the recommended candidate's break-even
// for Choice::optex; otherwise the gradient time at which these rules would
// first recommend OptEx (the smallest gradient time the rules let through;
// +infinity when no candidate ever pays off).
//
// The same budget: N workers could also run the plain optimizer with N x its
// learning rate ("N x lr", optex-bench's vanilla_nlr), with N x minibatch
// (data_parallel; averaging here) or a parallel line search (line_search). The
// planner measures only OptEx's overhead against one plain step; it cannot rank
// OptEx against those on the user's problem, and its report says so and points
// to docs/RESULTS.md.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/planning/round_cost.hpp"
#include "optex/planning/spread.hpp"

namespace optex {

// The range of PlanRequest::repetitions: three samples are the fewest with a
// median apart from the extremes; a hundred keeps a plan within minutes.
inline constexpr int kMinRepetitions = 3;
inline constexpr int kMaxRepetitions = 100;

// What the committed benchmarks measured of e: (vanilla's rounds to target /
// optex_default's - 1) / (N - 1) over the 49 (task, N >= 2) settings of
// docs/RESULTS.md (2026-11-24) with both reaching the target; median and
// quartiles, interpolated linearly. The report prints it next to the e it
// assumes.
struct BenchmarkEfficiency {
  double median;
  double low_quartile;
  double high_quartile;
  int settings;
};
inline constexpr BenchmarkEfficiency kBenchmarkEfficiency{0.5, 0.41, 0.67, 49};

struct PlanRequest {
  std::size_t dim = 0;
  int max_parallelism = 4;  // the most points per round the user can evaluate at once
  int history = 32;         // the T0 the user would run with
  Device device = Device::cpu();
  int threads = 0;  // Options::threads
  // One gradient evaluation, measured by the caller: > 0, finite.
  double gradient_seconds = 0;
  // e in (0, 1]: a round of P points advances like 1 + e (P - 1) sequential
  // steps. An assumption: measure it on the problem (sequential iterations to
  // a loss against OptEx rounds to it).
  double efficiency = 0.5;
  // rho = noise variance / squared gradient norm of one evaluation: finite
  // and >= 0, or NaN = unknown.
  double gradient_noise = std::numeric_limits<double>::quiet_NaN();
  // R: how many times every time is measured, in [kMinRepetitions,
  // kMaxRepetitions]; the median and quartiles of R samples are reported.
  int repetitions = 5;

  // Throws std::invalid_argument naming the first bad field and its value.
  void validate() const;
};

// The bytes the planner's largest measurement holds: a round at N =
// max_parallelism and T0 = history, (2 T0 + 4 N + 16) d floats (the history's
// points and gradients, the batch's rows, the iterate, the state and their
// copies), in double so that no d wraps it.
double plan_memory_bytes(const PlanRequest& request);

// Throws std::invalid_argument ("dim: 1000000000 is too large for this
// machine: a round at N = 4, T0 = 32 needs about 384 GB, it has 67.4 GB")
// when plan_memory_bytes exceeds 80% of the machine's physical memory, before
// anything of that size is allocated; where the physical memory is unknown it
// passes. plan() calls it before it measures anything itself (a timer left
// empty); optex-plan and optex.plan call it before they time a gradient.
void check_plan_memory(const PlanRequest& request);

struct PlanCandidate {
  int parallelism = 0;            // N
  int points = 0;                 // P = N / D
  int evaluations_per_point = 0;  // D
  int history = 0;                // T0
  double overhead_seconds = 0;    // o, the median: ask() + tell(), or the plain step when P = 1
  Spread overhead;                // o's R samples
  double round_seconds = 0;       // gradient_seconds + o
  double steps_per_round = 0;     // s = 1 + e (P - 1)
  double seconds_per_step = 0;    // round_seconds / s
  // (g + o) / s at o's low and high quartile.
  double seconds_per_step_low = 0;
  double seconds_per_step_high = 0;
  // max(0, (o - s p) / (s - 1)) at the medians; NaN when P = 1.
  double break_even_gradient_seconds = 0;
  // Its interval: at o's low quartile and p's high one, and at o's high
  // quartile and p's low one; NaN when P = 1.
  double break_even_low = 0;
  double break_even_high = 0;
};

// One candidate's measured overhead: the input of recommend_plan.
struct MeasuredRound {
  int parallelism = 0;  // N: a multiple of D with N / D >= 2
  int history = 0;      // T0
  Spread overhead;
};

struct Plan {
  enum class Choice { sequential, averaging, optex };

  std::vector<PlanCandidate> candidates;  // P = 1 first, then by T0 (the user's first), N
  double plain_step_seconds = 0;          // p, the median
  Spread plain_step;                      // p's R samples
  double plain_seconds_per_step = 0;      // the sequential baseline: gradient + p
  Choice choice = Choice::sequential;
  // The recommendation: N = 1 for sequential, N = D for averaging.
  int parallelism = 1;
  int evaluations_per_point = 1;
  int history = 0;
  double break_even_gradient_seconds = 0;  // see the model above
  // For Choice::optex, the recommended candidate's break-even interval;
  // otherwise both equal break_even_gradient_seconds.
  double break_even_low = 0;
  double break_even_high = 0;
  double expected_round_seconds = 0;
  // The gradient time lies within the measured spread of the decision (see
  // the model above): the plan took the simpler choice, and says so.
  bool uncertain = false;
  std::string reason;        // the numbers that decided it
  std::string assumption;    // the steps a round is assumed to advance, and the benchmarks' value
  std::string alternatives;  // the same-budget alternatives the planner does not measure
  PlanRequest request;
};

// "sequential", "averaging" or "optex".
const char* choice_name(Plan::Choice choice);

// Seconds of a round's overhead (ask() + tell()), and of a plain step.
using RoundTimer = std::function<double(const RoundShape&)>;
using StepTimer = std::function<double(std::size_t dim)>;

// The plan for `request`. The timers default to measure_round_cost(shape,
// 3).seconds and measure_plain_step(dim) on this machine; each is called
// request.repetitions times per candidate (the step timer R times),
// round-robin: the plain step and every candidate once, then again. Throws
// std::invalid_argument naming the field for a bad request before calling any timer (validate(),
// and check_plan_memory() where a timer is left to measure this machine), and for a timer that
// returns a negative or non-finite time.
Plan plan(const PlanRequest& request, const RoundTimer& round_seconds = {},
          const StepTimer& step_seconds = {});

// The recommendation from measured statistics alone, no timing: what plan()
// returns for the same measurements. `rounds` lists the P >= 2 candidates (in
// plan()'s order: by T0, the user's first, then N). Throws
// std::invalid_argument for a bad request (validate()), a round whose N is not
// a multiple of D with N / D >= 2 or whose T0 exceeds the request's, or a
// negative or non-finite statistic.
Plan recommend_plan(const PlanRequest& request, const std::vector<MeasuredRound>& rounds,
                    const Spread& plain_step);

// The candidates as a table (medians and interquartile ranges), then the
// recommendation, its reason, its assumption and the same-budget alternatives.
std::string format_plan(const Plan& plan);

}  // namespace optex
