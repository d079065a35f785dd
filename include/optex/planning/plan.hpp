// Will OptEx pay off for me? The planner: given the size of the problem and
// the time of one gradient evaluation, it measures a round's overhead on this
// machine for a few N and T0 (round_cost.hpp) and recommends the plain
// optimizer, averaging (N x minibatch) or OptEx with an N, D and T0
// (DESIGN.md section 4, "The planner").
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
// - A round advances s = 1 + e (P - 1) sequential steps; it takes g + o;
//   seconds per step (g + o) / s. The plain optimizer: g + p per step.
//   break_even = max(0, (o - s p) / (s - 1)) (P >= 2): the gradient time above
//   which the round beats the plain optimizer.
// - T0: the user's, unless its overhead at the best N (lowest seconds per step
//   at the user's T0, ties: the smaller N) exceeds 10% of g; then the largest
//   candidate T0 whose overhead at that N is <= 10% of g, or the smallest if
//   none.
// - N: at that T0, the lowest seconds per step (ties: the smaller N). If it
//   does not beat g + p: Choice::sequential when D = 1, Choice::averaging with
//   N = D when D > 1. Otherwise Choice::optex with that N, D and T0.
// Plan::break_even_gradient_seconds is the recommended candidate's break-even
// for Choice::optex; otherwise the gradient time at which these rules would
// first recommend OptEx (the smallest break-even the T0 rule lets through;
// +infinity when no candidate ever pays off).
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/planning/round_cost.hpp"

namespace optex {

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
  double overhead_seconds = 0;    // o: ask() + tell(), or the plain step when P = 1
  double round_seconds = 0;       // gradient_seconds + o
  double steps_per_round = 0;     // s = 1 + e (P - 1)
  double seconds_per_step = 0;    // round_seconds / s
  // max(0, (o - s p) / (s - 1)); NaN when P = 1.
  double break_even_gradient_seconds = 0;
};

struct Plan {
  enum class Choice { sequential, averaging, optex };

  std::vector<PlanCandidate> candidates;  // P = 1 first, then by T0 (the user's first), N
  double plain_step_seconds = 0;          // p
  double plain_seconds_per_step = 0;      // the sequential baseline: gradient + p
  Choice choice = Choice::sequential;
  // The recommendation: N = 1 for sequential, N = D for averaging.
  int parallelism = 1;
  int evaluations_per_point = 1;
  int history = 0;
  double break_even_gradient_seconds = 0;  // see the model above
  double expected_round_seconds = 0;
  std::string reason;  // the numbers that decided it
  PlanRequest request;
};

// "sequential", "averaging" or "optex".
const char* choice_name(Plan::Choice choice);

// Seconds of a round's overhead (ask() + tell()), and of a plain step.
using RoundTimer = std::function<double(const RoundShape&)>;
using StepTimer = std::function<double(std::size_t dim)>;

// The plan for `request`. The timers default to measure_round_cost(shape).seconds
// and measure_plain_step(dim) on this machine; each is called once per
// candidate (the step timer once). Throws std::invalid_argument naming the
// field for a bad request before calling any timer (validate(), and
// check_plan_memory() where a timer is left to measure this machine), and for
// a timer that returns a negative or non-finite time.
Plan plan(const PlanRequest& request, const RoundTimer& round_seconds = {},
          const StepTimer& step_seconds = {});

// The candidates as a table, then the recommendation and its reason.
std::string format_plan(const Plan& plan);

}  // namespace optex
