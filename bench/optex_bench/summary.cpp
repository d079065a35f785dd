#include "summary.hpp"

#include <cmath>
#include <limits>

namespace optex_bench {

std::string join_note(std::string a, const std::string& b) {
  if (b.empty()) return a;
  return a.empty() ? b : a + "; " + b;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// a / b for median rounds; NaN when either is unreached or b is 0 (already there).
double speedup(double numerator_rounds, double method_rounds) {
  if (!std::isfinite(numerator_rounds) || !std::isfinite(method_rounds) || method_rounds <= 0.0) {
    return kNaN;
  }
  return numerator_rounds / method_rounds;
}

SummaryRow summarize_method(const TaskOutcome& task, const MethodOutcome& m) {
  SummaryRow row;
  row.task = task.task;
  row.parallelism = m.parallelism;
  row.method = m.method.name;
  row.lr = m.lr;
  row.target = task.target;
  row.seeds = static_cast<int>(m.runs.size());
  std::vector<double> rounds, seconds, finals;
  int failed = 0;
  std::string first_failure;
  for (const Trajectory& t : m.runs) {
    rounds.push_back(rounds_to_target(t, task.target));
    seconds.push_back(seconds_to_target(t, task.target));
    finals.push_back(final_loss(t));
    if (std::isfinite(rounds.back())) ++row.reached;
    if (!t.failure.empty() && failed++ == 0) first_failure = t.failure;
  }
  row.rounds = quartiles(rounds);
  row.seconds = quartiles(seconds);
  row.final = quartiles(finals);
  row.sqrt_parallelism = std::sqrt(static_cast<double>(m.parallelism));
  if (m.method.kind == MethodKind::data_parallel && !task.stochastic) {
    row.note = join_note(row.note,
                         "noise 0: the N gradients at the iterate are identical, so N x minibatch "
                         "is vanilla at this lr (its N evaluations per round buy nothing)");
  }
  if (std::isnan(task.target)) {
    row.note = join_note(row.note, "no target: vanilla's median final loss is not finite");
  }
  if (m.method.kind == MethodKind::target) {
    row.note = join_note(row.note,
                         "upper bound: N sequential steps per round, not achievable with N "
                         "parallel workers");
  }
  if (failed > 0) {
    row.note = join_note(row.note, std::to_string(failed) + " of " + std::to_string(row.seeds) +
                                       " runs failed (later rounds null): " + first_failure);
  }
  return row;
}

}  // namespace

std::vector<SummaryRow> summarize(const Settings& settings, const std::vector<TaskOutcome>& tasks) {
  std::vector<SummaryRow> out;
  for (const TaskOutcome& task : tasks) {
    for (int n : settings.parallelism) {
      std::vector<SummaryRow> rows;
      double vanilla_rounds = kNaN;
      double best_baseline_rounds = std::numeric_limits<double>::infinity();
      std::string best_baseline;
      for (const MethodOutcome& m : task.methods) {
        if (m.parallelism != n) continue;
        rows.push_back(summarize_method(task, m));
        const double median = rows.back().rounds.median;
        if (m.method.kind == MethodKind::vanilla) vanilla_rounds = median;
        if (is_same_budget_baseline(m.method.kind) && median < best_baseline_rounds) {
          best_baseline_rounds = median;
          best_baseline = m.method.name;
        }
      }
      for (SummaryRow& row : rows) {
        row.speedup_vs_vanilla = speedup(vanilla_rounds, row.rounds.median);
        row.speedup_vs_best_baseline = speedup(best_baseline_rounds, row.rounds.median);
        if (std::isfinite(best_baseline_rounds)) row.best_baseline = best_baseline;
        out.push_back(std::move(row));
      }
    }
  }
  return out;
}

}  // namespace optex_bench
