#include "statistics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace optex_bench {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The p-quantile of sorted values, interpolating; inf stays inf (never inf - inf).
double quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double position = p * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(position));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  const double weight = position - static_cast<double>(below);
  if (weight == 0.0) return sorted[below];
  if (std::isinf(sorted[above])) return kInfinity;
  return sorted[below] + weight * (sorted[above] - sorted[below]);
}

}  // namespace

double rounds_to_target(const Trajectory& run, double target) {
  for (std::size_t r = 0; r < run.loss.size(); ++r) {
    if (run.loss[r] <= target) return static_cast<double>(r);
  }
  return kInfinity;
}

double seconds_to_target(const Trajectory& run, double target) {
  const double round = rounds_to_target(run, target);
  return std::isfinite(round) ? run.seconds[static_cast<std::size_t>(round)] : kInfinity;
}

double final_loss(const Trajectory& run) {
  const double last = run.loss.empty() ? kInfinity : run.loss.back();
  return std::isnan(last) ? kInfinity : last;
}

Quartiles quartiles(std::vector<double> values) {
  for (double& v : values) {
    if (std::isnan(v)) v = kInfinity;
  }
  std::sort(values.begin(), values.end());
  return {quantile(values, 0.25), quantile(values, 0.5), quantile(values, 0.75)};
}

}  // namespace optex_bench
