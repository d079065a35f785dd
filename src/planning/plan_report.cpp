// The planner's report as text (format_plan, plan.hpp): the request, every
// candidate's medians and spreads, the recommendation and its reasons.
#include <cmath>
#include <cstdio>
#include <string>

#include "optex/planning/plan.hpp"
#include "planning/plan_text.hpp"

namespace optex {

using detail::duration;
using detail::interval;
using detail::number;

std::string format_plan(const Plan& plan) {
  const PlanRequest& r = plan.request;
  std::string out;
  char line[768];
  std::snprintf(line, sizeof(line),
                "optex plan: d = %zu, N <= %d, T0 = %d, %s, threads %s, gradient %s, e = %.3g, "
                "noise %s\n",
                r.dim, r.max_parallelism, r.history, r.device.name().c_str(),
                r.threads == 0 ? "all" : std::to_string(r.threads).c_str(),
                duration(r.gradient_seconds).c_str(), r.efficiency,
                std::isnan(r.gradient_noise) ? "unknown" : number(r.gradient_noise).c_str());
  out += line;
  std::snprintf(line, sizeof(line),
                "every time measured %d times, round-robin over the candidates: median and "
                "[interquartile range]\n",
                plan.plain_step.count);
  out += line;
  std::snprintf(line, sizeof(line),
                "plain optimizer: step %s %s, %s per step with the gradient\n\n",
                duration(plan.plain_step_seconds).c_str(),
                interval(plan.plain_step.low_quartile, plan.plain_step.high_quartile).c_str(),
                duration(plan.plain_seconds_per_step).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "%6s %6s %4s %5s %10s %20s %10s %6s %10s %10s %20s\n", "N",
                "points", "D", "T0", "overhead", "[IQR]", "round", "steps", "per step",
                "break-even", "[IQR]");
  out += line;
  for (const PlanCandidate& c : plan.candidates) {
    std::snprintf(
        line, sizeof(line), "%6d %6d %4d %5s %10s %20s %10s %6.3g %10s %10s %20s\n", c.parallelism,
        c.points, c.evaluations_per_point, c.points < 2 ? "-" : std::to_string(c.history).c_str(),
        duration(c.overhead_seconds).c_str(),
        interval(c.overhead.low_quartile, c.overhead.high_quartile).c_str(),
        duration(c.round_seconds).c_str(), c.steps_per_round, duration(c.seconds_per_step).c_str(),
        duration(c.break_even_gradient_seconds).c_str(),
        interval(c.break_even_low, c.break_even_high).c_str());
    out += line;
  }
  out += "\nRecommendation: ";
  switch (plan.choice) {
    case Plan::Choice::optex:
      std::snprintf(line, sizeof(line), "OptEx, N = %d (%d points x %d evaluation%s), T0 = %d",
                    plan.parallelism, plan.parallelism / plan.evaluations_per_point,
                    plan.evaluations_per_point, plan.evaluations_per_point == 1 ? "" : "s",
                    plan.history);
      break;
    case Plan::Choice::averaging:
      std::snprintf(line, sizeof(line),
                    "averaging (N x minibatch), N = %d evaluations at one point", plan.parallelism);
      break;
    case Plan::Choice::sequential:
      std::snprintf(line, sizeof(line), "the plain optimizer (N = 1), one evaluation per step");
      break;
  }
  out += line;
  out += plan.uncertain ? " (uncertain: within the measured spread)\n" : "\n";
  if (plan.choice == Plan::Choice::optex) {
    std::snprintf(line, sizeof(line), "expected round %s; break-even gradient %s %s\n",
                  duration(plan.expected_round_seconds).c_str(),
                  duration(plan.break_even_gradient_seconds).c_str(),
                  interval(plan.break_even_low, plan.break_even_high).c_str());
  } else {
    std::snprintf(line, sizeof(line), "expected round %s; %s%s\n",
                  duration(plan.expected_round_seconds).c_str(),
                  std::isinf(plan.break_even_gradient_seconds)
                      ? "OptEx is recommended at no gradient time"
                      : "OptEx recommended above a gradient of ",
                  std::isinf(plan.break_even_gradient_seconds)
                      ? ""
                      : duration(plan.break_even_gradient_seconds).c_str());
  }
  out += line;
  out += "Reason: " + plan.reason + "\n";
  out += "Assumption: " + plan.assumption + "\n";
  out += "Same budget: " + plan.alternatives + "\n";
  return out;
}

}  // namespace optex
