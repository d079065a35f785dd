// One summary row per (task, parallelism, method): medians and quartiles over the
// reported seeds, and speedups in rounds to the target.
#pragma once

#include <string>
#include <vector>

#include "experiment.hpp"
#include "settings.hpp"
#include "statistics.hpp"

namespace optex_bench {

struct SummaryRow {
  std::string task;
  int parallelism = 1;
  std::string method;
  double lr = 0.0;
  double target = 0.0;
  int seeds = 0;
  int reached = 0;    // seeds whose run reached the target
  Quartiles rounds;   // rounds to target; +infinity where unreached (median included)
  Quartiles seconds;  // wall seconds to target (this process, one core), the same way
  Quartiles final;    // loss at the last round
  // Median rounds of vanilla (resp. of the best same-budget baseline: the fewest
  // median rounds among vanilla_nlr, data_parallel and line_search that reached)
  // over this method's median rounds; NaN (null) when either did not reach.
  double speedup_vs_vanilla = 0.0;
  double speedup_vs_best_baseline = 0.0;
  double sqrt_parallelism = 1.0;
  std::string note;           // empty when there is nothing to say
  std::string best_baseline;  // which baseline the second speedup used; empty if none reached
};

// "a; b", or whichever is non-empty.
std::string join_note(std::string a, const std::string& b);

std::vector<SummaryRow> summarize(const Settings& settings, const std::vector<TaskOutcome>& tasks);

}  // namespace optex_bench
