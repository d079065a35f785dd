// A repeated timing summarised as its median and spread: what the planner
// reports for every measured quantity, so that a busy machine shows up as a
// wide interval instead of as a different recommendation (DESIGN.md section 5,
// "Targets and statistics": medians and interquartile ranges).
//
//   optex::Spread s = optex::spread_of({1, 2, 3, 4, 100});
//   // s.median 3, s.low_quartile 2, s.high_quartile 4, s.min 1, s.max 100
//
// Quartiles interpolate linearly between order statistics (numpy's default,
// and the benchmarks' "median_rule"): the q-quantile of n sorted samples is at
// position q (n - 1).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace optex {

struct Spread {
  double median = 0;
  double low_quartile = 0;   // 25th percentile
  double high_quartile = 0;  // 75th percentile
  double min = 0;
  double max = 0;
  int count = 0;  // samples summarised

  // A quantity measured once, or known exactly: every statistic is `value`.
  static Spread exactly(double value) { return {value, value, value, value, value, 1}; }
  double interquartile_range() const { return high_quartile - low_quartile; }
};

// The q-quantile (q in [0, 1]) of ascending `sorted`, interpolated linearly.
inline double sorted_quantile(const std::vector<double>& sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const std::size_t below = static_cast<std::size_t>(std::floor(position));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  const double weight = position - static_cast<double>(below);
  return sorted[below] + weight * (sorted[above] - sorted[below]);
}

// The summary of `samples`; throws std::invalid_argument when there are none.
inline Spread spread_of(std::vector<double> samples) {
  if (samples.empty()) throw std::invalid_argument("samples: must hold at least one, got none");
  std::sort(samples.begin(), samples.end());
  return {.median = sorted_quantile(samples, 0.5),
          .low_quartile = sorted_quantile(samples, 0.25),
          .high_quartile = sorted_quantile(samples, 0.75),
          .min = samples.front(),
          .max = samples.back(),
          .count = static_cast<int>(samples.size())};
}

}  // namespace optex
