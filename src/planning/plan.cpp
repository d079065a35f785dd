// The planner (plan.hpp): candidates, their measured overheads, the rules that
// pick one, and the report.
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

namespace optex {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The T0 rule: a history whose overhead exceeds this fraction of the gradient is cut.
constexpr double kHistoryOverheadShare = 0.1;
// Halves of the user's T0 below this are not tried: the model needs a few pairs.
constexpr int kSmallestHistory = 4;
// Rounds timed for one sample of a candidate's overhead: their median damps a
// single hiccup; the repetitions give the spread.
constexpr int kRoundsPerSample = 3;

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

// An interval for the report, both ends in the unit of the larger:
// "[20.1, 22.8] ms".
std::string interval(double low, double high) {
  char text[96];
  if (std::isnan(low) || std::isnan(high)) return "-";
  if (std::isinf(high)) {
    std::string bounded = "[";
    bounded += duration(low);
    bounded += ", never]";
    return bounded;
  }
  double scale = 1.0;
  const char* unit = "s";
  if (high < 1e-3 && high != 0.0) {
    scale = 1e6;
    unit = "us";
  } else if (high < 1.0) {
    scale = 1e3;
    unit = "ms";
  }
  std::snprintf(text, sizeof(text), "[%.3g, %.3g] %s", low * scale, high * scale, unit);
  return text;
}

// What the rules decide at one gradient time, from the measured table.
struct Decision {
  Plan::Choice choice = Plan::Choice::sequential;
  int candidate = -1;     // the chosen P >= 2 candidate at the chosen T0, -1 when none
  int history = 0;        // the chosen T0
  int dropped_from = -1;  // the candidate at the user's T0 whose overhead cut T0, or -1
  // The candidate with the lowest median seconds per step at the chosen T0:
  // the OptEx choice before the spread rules, -1 when none.
  int fastest = -1;
  // A candidate at the chosen T0 whose break-even interval holds the gradient
  // time, so that the spread cannot tell OptEx from the simpler choice; -1
  // when none.
  int contested = -1;
  bool uncertain() const { return contested >= 0 || (candidate >= 0 && candidate != fastest); }
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

  // Whether the seconds per step of a and b, at their overheads' quartiles,
  // overlap at gradient time g.
  static bool steps_overlap(const PlanCandidate& a, const PlanCandidate& b, double g) {
    const double a_low = (g + a.overhead.low_quartile) / a.steps_per_round;
    const double a_high = (g + a.overhead.high_quartile) / a.steps_per_round;
    const double b_low = (g + b.overhead.low_quartile) / b.steps_per_round;
    const double b_high = (g + b.overhead.high_quartile) / b.steps_per_round;
    return a_low <= b_high && b_low <= a_high;
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
    d.fastest = best_at(d.history, g);
    if (d.fastest >= 0) settle(d, g);
    return d;
  }

  // The spread rules (plan.hpp): OptEx only when g clears the fastest
  // candidate's whole break-even interval, then the fewest workers the spread
  // cannot tell from the fastest; otherwise the simpler choice, contested
  // when g reaches into a candidate's break-even interval.
  void settle(Decision& d, double g) const {
    const PlanCandidate& fastest = candidates_[static_cast<std::size_t>(d.fastest)];
    const bool pays_at_medians = seconds_per_step(fastest, g) < g + plain_step_;
    if (pays_at_medians && g > fastest.break_even_high) {
      d.choice = Plan::Choice::optex;
      d.candidate = d.fastest;
      for (std::size_t i = 0; i < candidates_.size(); ++i) {  // by N, smallest first
        const PlanCandidate& c = candidates_[i];
        if (c.points >= 2 && c.history == d.history && g > c.break_even_high &&
            steps_overlap(c, fastest, g)) {
          d.candidate = static_cast<int>(i);
          break;
        }
      }
      return;
    }
    if (pays_at_medians) {
      d.contested = d.fastest;
      return;
    }
    for (std::size_t i = 0; i < candidates_.size(); ++i) {
      const PlanCandidate& c = candidates_[i];
      if (c.points >= 2 && c.history == d.history && c.break_even_low <= g) {
        d.contested = static_cast<int>(i);
        return;
      }
    }
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
      turns.push_back(a.break_even_high);
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
  recommend(table, evaluations, out);
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
