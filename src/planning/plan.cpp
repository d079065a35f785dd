// The planner (plan.hpp): candidates, their measured overheads, the rules that
// pick one, and the report.
#include "optex/planning/plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/adaptive_split.hpp"
#include "optex/backend/block_pool.hpp"
#include "optex/engine/options.hpp"

namespace optex {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The T0 rule: a history whose overhead exceeds this fraction of the gradient is cut.
constexpr double kHistoryOverheadShare = 0.1;
// Halves of the user's T0 below this are not tried: the model needs a few pairs.
constexpr int kSmallestHistory = 4;

[[noreturn]] void reject(const char* name, const std::string& value, const char* requirement) {
  throw std::invalid_argument(std::string(name) + ": must be " + requirement + ", got " + value);
}

std::string number(double v) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", v);
  return text;
}

// A duration for the report: 3 significant digits in s, ms or us.
std::string duration(double seconds) {
  char text[64];
  if (std::isnan(seconds)) return "-";
  if (std::isinf(seconds)) return "never";
  if (seconds >= 1.0) {
    std::snprintf(text, sizeof(text), "%.3g s", seconds);
  } else if (seconds >= 1e-3 || seconds == 0.0) {
    std::snprintf(text, sizeof(text), "%.3g ms", seconds * 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.3g us", seconds * 1e6);
  }
  return text;
}

// What the rules decide at one gradient time, from the measured table.
struct Decision {
  Plan::Choice choice = Plan::Choice::sequential;
  int candidate = -1;     // the best P >= 2 candidate at the chosen T0, -1 when none
  int history = 0;        // the chosen T0
  int dropped_from = -1;  // the candidate at the user's T0 whose overhead cut T0, or -1
};

class Table {
 public:
  Table(const PlanRequest& request, int evaluations, std::vector<int> histories,
        std::vector<PlanCandidate> candidates, double plain_step)
      : request_(request),
        evaluations_(evaluations),
        histories_(std::move(histories)),
        candidates_(std::move(candidates)),
        plain_step_(plain_step) {}

  double seconds_per_step(const PlanCandidate& c, double g) const {
    return (g + c.overhead_seconds) / c.steps_per_round;
  }

  // The lowest seconds per step among the P >= 2 candidates at `history`
  // (ties: the smaller N, listed first), or -1.
  int best_at(int history, double g) const {
    int best = -1;
    for (std::size_t i = 0; i < candidates_.size(); ++i) {
      const PlanCandidate& c = candidates_[i];
      if (c.points < 2 || c.history != history) continue;
      if (best < 0 || seconds_per_step(c, g) <
                          seconds_per_step(candidates_[static_cast<std::size_t>(best)], g)) {
        best = static_cast<int>(i);
      }
    }
    return best;
  }

  // The candidate of `parallelism` at `history`.
  int find(int parallelism, int history) const {
    for (std::size_t i = 0; i < candidates_.size(); ++i) {
      const PlanCandidate& c = candidates_[i];
      if (c.points >= 2 && c.parallelism == parallelism && c.history == history) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  Decision decide(double g) const {
    Decision d;
    d.history = request_.history;
    const Plan::Choice fallback =
        evaluations_ > 1 ? Plan::Choice::averaging : Plan::Choice::sequential;
    d.choice = fallback;
    const int at_user = best_at(request_.history, g);
    if (at_user < 0) return d;
    const PlanCandidate& first = candidates_[static_cast<std::size_t>(at_user)];
    const double allowed = kHistoryOverheadShare * g;
    if (first.overhead_seconds > allowed) {
      d.dropped_from = at_user;
      d.history = histories_.back();  // the smallest, unless one fits
      for (int t : histories_) {      // largest first
        const int i = find(first.parallelism, t);
        if (i >= 0 && candidates_[static_cast<std::size_t>(i)].overhead_seconds <= allowed) {
          d.history = t;
          break;
        }
      }
      if (d.history == request_.history) d.dropped_from = -1;
    }
    d.candidate = best_at(d.history, g);
    const PlanCandidate& c = candidates_[static_cast<std::size_t>(d.candidate)];
    if (seconds_per_step(c, g) < g + plain_step_) d.choice = Plan::Choice::optex;
    return d;
  }

  // The smallest gradient time >= g above which decide() recommends OptEx,
  // +infinity when it never does. decide() is constant between the points
  // where a rule's comparison turns: the break-evens, the T0 rule's
  // thresholds and where two candidates' seconds per step cross.
  double first_payoff_above(double g) const {
    std::vector<double> turns;
    for (const PlanCandidate& a : candidates_) {
      if (a.points < 2) continue;
      turns.push_back(a.break_even_gradient_seconds);
      turns.push_back(a.overhead_seconds / kHistoryOverheadShare);
      for (const PlanCandidate& b : candidates_) {
        if (b.points < 2 || b.history != a.history || b.steps_per_round == a.steps_per_round) {
          continue;
        }
        turns.push_back(
            (b.overhead_seconds * a.steps_per_round - a.overhead_seconds * b.steps_per_round) /
            (b.steps_per_round - a.steps_per_round));
      }
    }
    std::erase_if(turns, [g](double t) { return !(t >= g) || !std::isfinite(t); });
    std::sort(turns.begin(), turns.end());
    turns.erase(std::unique(turns.begin(), turns.end()), turns.end());
    for (std::size_t i = 0; i < turns.size(); ++i) {
      const double inside =
          i + 1 < turns.size() ? 0.5 * (turns[i] + turns[i + 1]) : 2.0 * turns[i] + 1.0;
      if (decide(inside).choice == Plan::Choice::optex) return turns[i];
    }
    return kInfinity;
  }

  const std::vector<PlanCandidate>& candidates() const { return candidates_; }

 private:
  const PlanRequest& request_;
  int evaluations_;
  std::vector<int> histories_;  // largest first
  std::vector<PlanCandidate> candidates_;
  double plain_step_;
};

double checked_time(const char* timer, double seconds) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds)) {
    reject(timer, number(seconds), "a finite time >= 0 in seconds");
  }
  return seconds;
}

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

// The recommendation, its numbers and its reason, from the measured table:
// fills every field of `out` but the request, the candidates and the plain
// step's.
void recommend(const Table& table, int evaluations, Plan& out) {
  const PlanRequest& r = out.request;
  const double g = r.gradient_seconds;
  const double p = out.plain_step_seconds;
  const int n_max = r.max_parallelism;
  const Decision d = table.decide(g);
  out.choice = d.choice;
  out.history = r.history;
  const PlanCandidate* best =
      d.candidate >= 0 ? &out.candidates[static_cast<std::size_t>(d.candidate)] : nullptr;

  char text[512];
  std::string reason;
  if (d.choice == Plan::Choice::optex) {
    out.parallelism = best->parallelism;
    out.evaluations_per_point = evaluations;
    out.history = best->history;
    out.break_even_gradient_seconds = best->break_even_gradient_seconds;
    out.expected_round_seconds = best->round_seconds;
    std::snprintf(text, sizeof(text),
                  "OptEx with N = %d: a round (gradient %s + overhead %s) advances %.3g steps, "
                  "%s per step against %s for the plain optimizer (%.2fx); it pays off above a "
                  "gradient of %s.",
                  best->parallelism, duration(g).c_str(), duration(best->overhead_seconds).c_str(),
                  best->steps_per_round, duration(best->seconds_per_step).c_str(),
                  duration(g + p).c_str(), (g + p) / best->seconds_per_step,
                  duration(best->break_even_gradient_seconds).c_str());
    reason = text;
    if (d.dropped_from >= 0) {
      const PlanCandidate& cut = out.candidates[static_cast<std::size_t>(d.dropped_from)];
      std::snprintf(text, sizeof(text),
                    " T0 = %d instead of %d: at N = %d the overhead at T0 = %d is %s, above 10%% "
                    "of the gradient (%s).",
                    best->history, r.history, cut.parallelism, r.history,
                    duration(cut.overhead_seconds).c_str(),
                    duration(kHistoryOverheadShare * g).c_str());
      reason += text;
    }
  } else {
    out.parallelism = d.choice == Plan::Choice::averaging ? evaluations : 1;
    out.evaluations_per_point = out.parallelism;
    out.break_even_gradient_seconds = table.first_payoff_above(g);
    out.expected_round_seconds = g + p;
    if (d.choice == Plan::Choice::averaging) {
      std::snprintf(text, sizeof(text),
                    "Averaging (N x minibatch): all N = %d evaluations at one point, one step per "
                    "round with the noise divided by %d.",
                    evaluations, evaluations);
      reason = text;
    } else {
      reason = "Plain optimizer.";
    }
    if (best != nullptr) {
      std::snprintf(text, sizeof(text),
                    " The overhead %s (N = %d, T0 = %d) exceeds what %.3g extra steps per round "
                    "save at gradient %s; OptEx pays off above %s.",
                    duration(best->overhead_seconds).c_str(), best->parallelism, best->history,
                    best->steps_per_round - 1.0, duration(g).c_str(),
                    duration(out.break_even_gradient_seconds).c_str());
      reason += text;
    } else if (n_max == 1) {
      reason += " N = 1 leaves nothing to run in parallel.";
    } else {
      reason += " No N up to the maximum gives two or more points.";
    }
  }
  reason += noise_sentence(r, evaluations);
  out.reason = std::move(reason);
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

Plan plan(const PlanRequest& request, const RoundTimer& round_seconds,
          const StepTimer& step_seconds) {
  request.validate();
  // What the measurements of this machine would allocate, before they do.
  if (!round_seconds || !step_seconds) check_plan_memory(request);
  const PlanRequest& r = request;
  const int n_max = r.max_parallelism;
  const int evaluations =
      std::isnan(r.gradient_noise) ? 1 : AdaptiveSplit::evaluations_for(n_max, r.gradient_noise);

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

  const double p =
      checked_time("step_seconds", step_seconds ? step_seconds(r.dim) : measure_plain_step(r.dim));
  const double g = r.gradient_seconds;

  const auto candidate = [&](int n, int t, double overhead) {
    PlanCandidate c;
    c.parallelism = n;
    c.evaluations_per_point = evaluations;
    c.points = n / evaluations;
    c.history = t;
    c.overhead_seconds = overhead;
    c.round_seconds = g + overhead;
    c.steps_per_round = 1.0 + r.efficiency * (c.points - 1);
    c.seconds_per_step = c.round_seconds / c.steps_per_round;
    c.break_even_gradient_seconds =
        c.points < 2
            ? kNaN
            : std::max(0.0, (overhead - c.steps_per_round * p) / (c.steps_per_round - 1.0));
    return c;
  };
  std::vector<PlanCandidate> candidates;
  candidates.push_back(candidate(evaluations, r.history, p));  // P = 1: the plain step
  for (int t : histories) {
    for (int n : parallelisms) {
      if (n / evaluations < 2) continue;
      const RoundShape shape{
          .dim = r.dim, .parallelism = n, .history = t, .device = r.device, .threads = r.threads};
      const double o =
          checked_time("round_seconds",
                       round_seconds ? round_seconds(shape) : measure_round_cost(shape).seconds);
      candidates.push_back(candidate(n, t, o));
    }
  }

  const Table table(r, evaluations, histories, candidates, p);
  Plan out;
  out.request = r;
  out.candidates = std::move(candidates);
  out.plain_step_seconds = p;
  out.plain_seconds_per_step = r.gradient_seconds + p;
  recommend(table, evaluations, out);
  return out;
}

std::string format_plan(const Plan& plan) {
  const PlanRequest& r = plan.request;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "optex plan: d = %zu, N <= %d, T0 = %d, %s, threads %s, gradient %s, e = %.3g, "
                "noise %s\n",
                r.dim, r.max_parallelism, r.history, r.device.name().c_str(),
                r.threads == 0 ? "all" : std::to_string(r.threads).c_str(),
                duration(r.gradient_seconds).c_str(), r.efficiency,
                std::isnan(r.gradient_noise) ? "unknown" : number(r.gradient_noise).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "plain optimizer: step %s, %s per step with the gradient\n\n",
                duration(plan.plain_step_seconds).c_str(),
                duration(plan.plain_seconds_per_step).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "%6s %6s %4s %5s %11s %11s %11s %11s %11s\n", "N", "points",
                "D", "T0", "overhead", "round", "steps", "per step", "break-even");
  out += line;
  for (const PlanCandidate& c : plan.candidates) {
    std::snprintf(
        line, sizeof(line), "%6d %6d %4d %5s %11s %11s %11.3g %11s %11s\n", c.parallelism, c.points,
        c.evaluations_per_point, c.points < 2 ? "-" : std::to_string(c.history).c_str(),
        duration(c.overhead_seconds).c_str(), duration(c.round_seconds).c_str(), c.steps_per_round,
        duration(c.seconds_per_step).c_str(), duration(c.break_even_gradient_seconds).c_str());
    out += line;
  }
  out += "\nRecommendation: ";
  switch (plan.choice) {
    case Plan::Choice::optex:
      std::snprintf(line, sizeof(line), "OptEx, N = %d (%d points x %d evaluation%s), T0 = %d\n",
                    plan.parallelism, plan.parallelism / plan.evaluations_per_point,
                    plan.evaluations_per_point, plan.evaluations_per_point == 1 ? "" : "s",
                    plan.history);
      break;
    case Plan::Choice::averaging:
      std::snprintf(line, sizeof(line), "averaging, N = %d evaluations at one point\n",
                    plan.parallelism);
      break;
    case Plan::Choice::sequential:
      std::snprintf(line, sizeof(line), "the plain optimizer, one evaluation per step\n");
      break;
  }
  out += line;
  std::snprintf(line, sizeof(line), "expected round %s; break-even gradient %s\n",
                duration(plan.expected_round_seconds).c_str(),
                duration(plan.break_even_gradient_seconds).c_str());
  out += line;
  out += "Reason: " + plan.reason + "\n";
  return out;
}

}  // namespace optex
