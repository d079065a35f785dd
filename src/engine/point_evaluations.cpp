#include "optex/engine/point_evaluations.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>

#include "optex/engine/adaptive_split.hpp"

namespace optex::detail {

double gradient_noise(std::span<const double> sums, std::span<const int> replicates) {
  if (replicates.empty()) return std::numeric_limits<double>::quiet_NaN();
  double noise_sum = 0.0;
  for (std::size_t k = 0; k < replicates.size(); ++k) {
    // The sample covariance's trace, and the signal's unbiased squared norm.
    const int used = replicates[k];
    const double trace = sums[2 * k + 1] / (used - 1);
    const double signal = sums[2 * k] - trace / used;
    noise_sum += signal > 0.0 ? std::min(trace / signal, AdaptiveSplit::kMaxNoise)
                              : AdaptiveSplit::kMaxNoise;
  }
  return noise_sum / static_cast<double>(replicates.size());
}

}  // namespace optex::detail
