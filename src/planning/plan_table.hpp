// The planner's measured candidates and the rules that decide at one gradient
// time (plan.hpp, DESIGN.md section 4, "The planner"): the T0 rule, the fastest
// candidate, and the spread rules that keep the simpler choice where the
// measurements cannot tell.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "optex/planning/plan.hpp"

namespace optex::detail {

// The T0 rule: a history whose overhead exceeds this fraction of the gradient is cut.
inline constexpr double kHistoryOverheadShare = 0.1;

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
    return std::numeric_limits<double>::infinity();
  }

  const std::vector<PlanCandidate>& candidates() const { return candidates_; }

 private:
  const PlanRequest& request_;
  int evaluations_;
  std::vector<int> histories_;  // largest first
  std::vector<PlanCandidate> candidates_;
  double plain_step_;
};

}  // namespace optex::detail
