// The planner's recommendation and its explanation (plan_reasoning.hpp).
#include "planning/plan_reasoning.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "optex/engine/adaptive_split.hpp"
#include "planning/plan_text.hpp"

namespace optex::detail {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string noise_sentence(const PlanRequest& r, int evaluations) {
  if (std::isnan(r.gradient_noise)) {
    return " The gradient noise is unknown, so D = 1 assumes noise-free gradients: "
           "Options::adaptive(" +
           std::to_string(r.max_parallelism) +
           ") measures it and splits each round's evaluations by it.";
  }
  char text[256];
  if (evaluations < r.max_parallelism ||
      r.gradient_noise / evaluations <= AdaptiveSplit::kNoiseTarget) {
    std::snprintf(text, sizeof(text),
                  " Gradient noise rho = %.3g: D = %d evaluations per point bring rho / D to "
                  "%.3g (<= %.2f).",
                  r.gradient_noise, evaluations, r.gradient_noise / evaluations,
                  AdaptiveSplit::kNoiseTarget);
  } else {
    std::snprintf(text, sizeof(text),
                  " Gradient noise rho = %.3g: even D = N = %d leaves rho / D = %.3g above "
                  "%.2f, so every evaluation goes to one point.",
                  r.gradient_noise, evaluations, r.gradient_noise / evaluations,
                  AdaptiveSplit::kNoiseTarget);
  }
  return text;
}

// The sentence that explains a cut T0 (the T0 rule, plan.hpp), or "" when
// the user's T0 stands.
std::string history_sentence(const Table& table, const Decision& d, const Plan& out) {
  if (d.dropped_from < 0) return "";
  const PlanRequest& r = out.request;
  const double allowed = kHistoryOverheadShare * r.gradient_seconds;
  const PlanCandidate& cut = out.candidates[static_cast<std::size_t>(d.dropped_from)];
  const int kept = table.find(cut.parallelism, d.history);
  const double kept_overhead =
      kept >= 0 ? out.candidates[static_cast<std::size_t>(kept)].overhead_seconds : kNaN;
  // With OptEx the cut T0 is the recommendation; otherwise only the T0 the
  // OptEx candidates above were compared at.
  const std::string lead =
      out.choice == Plan::Choice::optex
          ? " T0 = " + std::to_string(d.history) + " instead of "
          : " The OptEx candidates are compared at T0 = " + std::to_string(d.history) + ", not ";
  char text[768];
  if (kept_overhead <= allowed) {
    std::snprintf(text, sizeof(text),
                  "%d: at N = %d the overhead at T0 = %d is %s, above 10%% of the gradient (%s); "
                  "at T0 = %d it is %s.",
                  r.history, cut.parallelism, r.history, duration(cut.overhead_seconds).c_str(),
                  duration(allowed).c_str(), d.history, duration(kept_overhead).c_str());
  } else {
    std::snprintf(text, sizeof(text),
                  "%d: at N = %d the overhead at T0 = %d is %s, above 10%% of the gradient (%s), "
                  "and no T0 tried keeps it within that (%s at T0 = %d, the smallest tried), so "
                  "the smallest is taken.",
                  r.history, cut.parallelism, r.history, duration(cut.overhead_seconds).c_str(),
                  duration(allowed).c_str(), duration(kept_overhead).c_str(), d.history);
  }
  std::string sentence = lead + text;
  sentence += " The planner assumes a shorter history advances as many steps per round as T0 = " +
              std::to_string(r.history) +
              "; its GP sees fewer pairs, so check that on your problem (docs/RESULTS.md has "
              "optex_default[history=8] against optex_default).";
  return sentence;
}

// The steps a round is assumed to advance, and what the benchmarks measured.
std::string assumption_sentence(const Plan& out, int evaluations) {
  const PlanRequest& r = out.request;
  const int points = out.choice == Plan::Choice::optex ? out.parallelism / evaluations
                                                       : r.max_parallelism / evaluations;
  const double e = r.efficiency;
  const BenchmarkEfficiency& b = kBenchmarkEfficiency;
  char text[1024];
  if (points < 2) {
    std::snprintf(text, sizeof(text),
                  "none about proxy steps: with %d point%s per round there are none (N = 1 is "
                  "the plain optimizer).",
                  points, points == 1 ? "" : "s");
    return text;
  }
  std::snprintf(
      text, sizeof(text),
      "a round of P points advances 1 + e (P - 1) sequential steps, e = %.3g "
      "(--efficiency), at every T0: at P = %d, %.3g steps (e = 1 would mean proxy steps as good "
      "as true ones, P steps per round). On the committed benchmarks (docs/RESULTS.md, "
      "optex_default against vanilla, rounds to target, %d settings with N >= 2) e was %.2g "
      "on median (IQR %.2g to %.2g): a round of %d points advanced %.3g steps. Measure it on "
      "your problem before trusting the recommendation.",
      e, points, 1.0 + e * (points - 1), b.settings, b.median, b.low_quartile, b.high_quartile,
      points, 1.0 + b.median * (points - 1));
  return text;
}

// The same-budget alternatives the planner does not measure.
std::string alternatives_sentence(const PlanRequest& r) {
  if (r.max_parallelism == 1) {
    return "One worker: N = 1 is the plain optimizer, and there is no same-budget alternative "
           "to weigh.";
  }
  const std::string n = std::to_string(r.max_parallelism);
  return "With N = " + n +
         " workers the same-budget alternatives to OptEx are the plain optimizer with N x "
         "learning rate (\"N x lr\", optex-bench's vanilla_nlr), with N x minibatch "
         "(data_parallel; averaging here) and a parallel line search (line_search). This "
         "planner measures only OptEx's overhead against one plain step on one worker; it "
         "cannot rank OptEx against them on your problem: see the benchmark results "
         "(docs/RESULTS.md) or run optex-bench on a problem like yours.";
}

}  // namespace

void recommend(const Table& table, int evaluations, Plan& out) {
  const PlanRequest& r = out.request;
  const double g = r.gradient_seconds;
  const double p = out.plain_step_seconds;
  const int n_max = r.max_parallelism;
  const Decision d = table.decide(g);
  out.choice = d.choice;
  out.history = r.history;
  out.uncertain = d.uncertain();
  const auto at = [&out](int i) -> const PlanCandidate* {
    return i >= 0 ? &out.candidates[static_cast<std::size_t>(i)] : nullptr;
  };
  const PlanCandidate* chosen = at(d.candidate);
  const PlanCandidate* fastest = at(d.fastest);
  const PlanCandidate* contested = at(d.contested);

  char text[1024];
  std::string reason;
  if (d.choice == Plan::Choice::optex) {
    out.parallelism = chosen->parallelism;
    out.evaluations_per_point = evaluations;
    out.history = chosen->history;
    out.break_even_gradient_seconds = chosen->break_even_gradient_seconds;
    out.break_even_low = chosen->break_even_low;
    out.break_even_high = chosen->break_even_high;
    out.expected_round_seconds = chosen->round_seconds;
    std::snprintf(text, sizeof(text),
                  "OptEx with N = %d: a round (gradient %s + overhead %s, IQR %s) is assumed to "
                  "advance %.3g steps, %s per step against %s for the plain optimizer on one "
                  "worker (%.2fx); it pays off above a gradient of %s, %s within the measured "
                  "spread, and the gradient lies above that.",
                  chosen->parallelism, duration(g).c_str(),
                  duration(chosen->overhead_seconds).c_str(),
                  interval(chosen->overhead.low_quartile, chosen->overhead.high_quartile).c_str(),
                  chosen->steps_per_round, duration(chosen->seconds_per_step).c_str(),
                  duration(g + p).c_str(), (g + p) / chosen->seconds_per_step,
                  duration(chosen->break_even_gradient_seconds).c_str(),
                  interval(chosen->break_even_low, chosen->break_even_high).c_str());
    reason = text;
    if (chosen != fastest) {
      std::snprintf(
          text, sizeof(text),
          " Uncertain: within the measured spread: N = %d per step %s overlaps N = %d's "
          "%s (the faster at the medians), so the plan takes the fewer workers.",
          chosen->parallelism,
          interval(chosen->seconds_per_step_low, chosen->seconds_per_step_high).c_str(),
          fastest->parallelism,
          interval(fastest->seconds_per_step_low, fastest->seconds_per_step_high).c_str());
      reason += text;
    }
  } else {
    out.parallelism = d.choice == Plan::Choice::averaging ? evaluations : 1;
    out.evaluations_per_point = out.parallelism;
    out.break_even_gradient_seconds = table.first_payoff_above(g);
    out.break_even_low = out.break_even_gradient_seconds;
    out.break_even_high = out.break_even_gradient_seconds;
    out.expected_round_seconds = g + p;
    if (d.choice == Plan::Choice::averaging) {
      std::snprintf(text, sizeof(text),
                    "Averaging (N x minibatch): all N = %d evaluations at one point, one step per "
                    "round with the noise divided by %d.",
                    evaluations, evaluations);
      reason = text;
    } else {
      reason = "The plain optimizer: N = 1, one evaluation per step (OptEx needs N >= 2).";
    }
    if (contested != nullptr && contested == fastest) {
      std::snprintf(text, sizeof(text),
                    " Uncertain: within the measured spread: OptEx with N = %d, T0 = %d beats it "
                    "at the medians (%s against %s per step), but the gradient %s lies inside its "
                    "break-even interval %s, so the plan keeps the simpler choice. The rules "
                    "recommend OptEx above %s; rerun on a quiet machine or with more "
                    "--repetitions to narrow the interval.",
                    contested->parallelism, contested->history,
                    duration(contested->seconds_per_step).c_str(), duration(g + p).c_str(),
                    duration(g).c_str(),
                    interval(contested->break_even_low, contested->break_even_high).c_str(),
                    duration(out.break_even_gradient_seconds).c_str());
      reason += text;
    } else if (fastest != nullptr) {
      std::snprintf(text, sizeof(text),
                    " The overhead %s (N = %d, T0 = %d) exceeds what %.3g extra steps per round "
                    "save at gradient %s; OptEx pays off above %s.",
                    duration(fastest->overhead_seconds).c_str(), fastest->parallelism,
                    fastest->history, fastest->steps_per_round - 1.0, duration(g).c_str(),
                    duration(out.break_even_gradient_seconds).c_str());
      reason += text;
      if (contested != nullptr) {
        std::snprintf(text, sizeof(text),
                      " Uncertain: within the measured spread: the gradient lies inside the "
                      "break-even interval %s of N = %d, T0 = %d.",
                      interval(contested->break_even_low, contested->break_even_high).c_str(),
                      contested->parallelism, contested->history);
        reason += text;
      }
    } else if (n_max == 1) {
      reason +=
          " With one worker there is nothing to run in parallel, so no OptEx round was "
          "measured.";
    } else {
      reason += " No N up to the maximum gives two or more points.";
    }
  }
  reason += history_sentence(table, d, out);
  reason += noise_sentence(r, evaluations);
  out.reason = std::move(reason);
  out.assumption = assumption_sentence(out, evaluations);
  out.alternatives = alternatives_sentence(r);
}

}  // namespace optex::detail
