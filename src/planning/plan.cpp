// The planner (plan.hpp): the request's checks, the candidates and their
// measured overheads; the rules are in plan_table.hpp, the reasons in
// plan_reasoning.cpp, the report in plan_report.cpp.
#include "optex/planning/plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/adaptive_split.hpp"
#include "optex/engine/options.hpp"
#include "planning/plan_reasoning.hpp"
#include "planning/plan_table.hpp"
#include "planning/plan_text.hpp"

namespace optex {
namespace {

using detail::number;
using detail::Table;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Halves of the user's T0 below this are not tried: the model needs a few pairs.
constexpr int kSmallestHistory = 4;
// Rounds timed for one sample of a candidate's overhead: their median damps a
// single hiccup; the repetitions give the spread.
constexpr int kRoundsPerSample = 3;

[[noreturn]] void reject(const char* name, const std::string& value, const char* requirement) {
  throw std::invalid_argument(std::string(name) + ": must be " + requirement + ", got " + value);
}

double checked_time(const char* timer, double seconds) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds)) {
    reject(timer, number(seconds), "a finite time >= 0 in seconds");
  }
  return seconds;
}

// A measured statistic must be a time: finite, >= 0, its quartiles around its median.
void check_spread(const char* timer, const Spread& s) {
  for (double v : {s.median, s.low_quartile, s.high_quartile, s.min, s.max})
    (void)checked_time(timer, v);
  if (!(s.min <= s.low_quartile && s.low_quartile <= s.median && s.median <= s.high_quartile &&
        s.high_quartile <= s.max)) {
    reject(timer, number(s.median),
           "a spread with min <= low quartile <= median <= high quartile <= max");
  }
}

// D: evaluations per point, by the adaptive strategy's noise rule (1 when unknown).
int evaluations_for(const PlanRequest& r) {
  return std::isnan(r.gradient_noise)
             ? 1
             : AdaptiveSplit::evaluations_for(r.max_parallelism, r.gradient_noise);
}

}  // namespace

void PlanRequest::validate() const {
  if (dim == 0) reject("dim", "0", ">= 1");
  if (max_parallelism < 1 || max_parallelism > kMaxParallelism) {
    reject("max_parallelism", std::to_string(max_parallelism), "in [1, 65536]");
  }
  if (history < 1 || history > kMaxHistory) {
    reject("history", std::to_string(history), "in [1, 4096]");
  }
  if (threads < 0 || threads > kMaxThreads) {
    reject("threads", std::to_string(threads), "in [0, 1024] (0: every core)");
  }
  if (device.is_cuda() && device.index < 0) {
    reject("device", device.name(), "cpu or cuda:<index >= 0>");
  }
  if (!(gradient_seconds > 0.0) || !std::isfinite(gradient_seconds)) {
    reject("gradient_seconds", number(gradient_seconds), "> 0 and finite");
  }
  if (repetitions < kMinRepetitions || repetitions > kMaxRepetitions) {
    reject("repetitions", std::to_string(repetitions), "in [3, 100]");
  }
  if (!(efficiency > 0.0 && efficiency <= 1.0)) {
    reject("efficiency", number(efficiency), "in (0, 1]");
  }
  if (!std::isnan(gradient_noise) && !(gradient_noise >= 0.0 && std::isfinite(gradient_noise))) {
    reject("gradient_noise", number(gradient_noise), "finite and >= 0 (NaN: unknown)");
  }
}

double plan_memory_bytes(const PlanRequest& r) {
  const double rows = 2.0 * r.history + 4.0 * r.max_parallelism + 16.0;
  return rows * static_cast<double>(r.dim) * sizeof(float);
}

void check_plan_memory(const PlanRequest& r) {
  const double needed = plan_memory_bytes(r);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return;  // unknown: the measurement will tell
  const double available = static_cast<double>(pages) * static_cast<double>(page_size);
  if (needed > 0.8 * available) {
    char text[256];
    std::snprintf(text, sizeof(text),
                  "dim: %zu is too large for this machine: a round at N = %d, T0 = %d needs "
                  "about %.3g GB, it has %.3g GB",
                  r.dim, r.max_parallelism, r.history, needed / 1e9, available / 1e9);
    throw std::invalid_argument(text);
  }
}

const char* choice_name(Plan::Choice choice) {
  switch (choice) {
    case Plan::Choice::sequential:
      return "sequential";
    case Plan::Choice::averaging:
      return "averaging";
    case Plan::Choice::optex:
      return "optex";
  }
  return "unknown";
}

Plan recommend_plan(const PlanRequest& request, const std::vector<MeasuredRound>& rounds,
                    const Spread& plain_step) {
  request.validate();
  const PlanRequest& r = request;
  const int evaluations = evaluations_for(r);
  check_spread("plain_step", plain_step);
  const double p = plain_step.median;
  const double g = r.gradient_seconds;

  // The break-even at overhead o and plain step q.
  const auto break_even = [](double o, double s, double q) {
    return std::max(0.0, (o - s * q) / (s - 1.0));
  };
  const auto candidate = [&](int n, int t, const Spread& overhead) {
    PlanCandidate c;
    c.parallelism = n;
    c.evaluations_per_point = evaluations;
    c.points = n / evaluations;
    c.history = t;
    c.overhead_seconds = overhead.median;
    c.overhead = overhead;
    c.round_seconds = g + overhead.median;
    c.steps_per_round = 1.0 + r.efficiency * (c.points - 1);
    c.seconds_per_step = c.round_seconds / c.steps_per_round;
    c.seconds_per_step_low = (g + overhead.low_quartile) / c.steps_per_round;
    c.seconds_per_step_high = (g + overhead.high_quartile) / c.steps_per_round;
    const double s = c.steps_per_round;
    const bool single = c.points < 2;
    c.break_even_gradient_seconds = single ? kNaN : break_even(overhead.median, s, p);
    c.break_even_low =
        single ? kNaN : break_even(overhead.low_quartile, s, plain_step.high_quartile);
    c.break_even_high =
        single ? kNaN : break_even(overhead.high_quartile, s, plain_step.low_quartile);
    return c;
  };

  std::vector<int> histories{r.history};  // the user's first, then the rest largest first
  std::vector<PlanCandidate> candidates;
  candidates.push_back(candidate(evaluations, r.history, plain_step));  // P = 1: the plain step
  for (const MeasuredRound& m : rounds) {
    if (m.parallelism > r.max_parallelism || m.parallelism % evaluations != 0 ||
        m.parallelism / evaluations < 2) {
      reject("rounds", "N = " + std::to_string(m.parallelism),
             ("a multiple of D = " + std::to_string(evaluations) +
              " with N / D >= 2, N <= " + std::to_string(r.max_parallelism))
                 .c_str());
    }
    if (m.history < 1 || m.history > r.history) {
      reject("rounds", "T0 = " + std::to_string(m.history),
             ("in [1, " + std::to_string(r.history) + "]").c_str());
    }
    check_spread("round_seconds", m.overhead);
    if (std::find(histories.begin(), histories.end(), m.history) == histories.end()) {
      histories.push_back(m.history);
    }
    candidates.push_back(candidate(m.parallelism, m.history, m.overhead));
  }
  std::sort(histories.begin() + 1, histories.end(), std::greater<>());

  const Table table(r, evaluations, histories, candidates, p);
  Plan out;
  out.request = r;
  out.candidates = std::move(candidates);
  out.plain_step_seconds = p;
  out.plain_step = plain_step;
  out.plain_seconds_per_step = g + p;
  detail::recommend(table, evaluations, out);
  return out;
}

Plan plan(const PlanRequest& request, const RoundTimer& round_seconds,
          const StepTimer& step_seconds) {
  request.validate();
  // What the measurements of this machine would allocate, before they do.
  if (!round_seconds || !step_seconds) check_plan_memory(request);
  const PlanRequest& r = request;
  const int n_max = r.max_parallelism;
  const int evaluations = evaluations_for(r);

  std::vector<int> parallelisms;
  for (long long m = 1; static_cast<long long>(evaluations) * m <= n_max; m *= 2) {
    parallelisms.push_back(static_cast<int>(evaluations * m));
  }
  if (parallelisms.back() != n_max) parallelisms.push_back(n_max);  // D divides n_max
  std::vector<int> histories{r.history};
  for (int t : {r.history / 2, r.history / 4}) {
    if (t >= kSmallestHistory &&
        std::find(histories.begin(), histories.end(), t) == histories.end()) {
      histories.push_back(t);
    }
  }
  std::vector<RoundShape> shapes;
  for (int t : histories) {
    for (int n : parallelisms) {
      if (n / evaluations < 2) continue;
      shapes.push_back(
          {.dim = r.dim, .parallelism = n, .history = t, .device = r.device, .threads = r.threads});
    }
  }

  // Round-robin: a busy spell of the machine lands on every candidate's
  // samples alike instead of moving one candidate's median.
  std::vector<double> step_samples;
  std::vector<std::vector<double>> round_samples(shapes.size());
  for (int repetition = 0; repetition < r.repetitions; ++repetition) {
    step_samples.push_back(checked_time(
        "step_seconds", step_seconds ? step_seconds(r.dim) : measure_plain_step(r.dim)));
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      round_samples[i].push_back(checked_time(
          "round_seconds", round_seconds
                               ? round_seconds(shapes[i])
                               : measure_round_cost(shapes[i], kRoundsPerSample).seconds));
    }
  }
  std::vector<MeasuredRound> rounds;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    rounds.push_back({.parallelism = shapes[i].parallelism,
                      .history = shapes[i].history,
                      .overhead = spread_of(round_samples[i])});
  }
  return recommend_plan(r, rounds, spread_of(step_samples));
}

}  // namespace optex
