#include "optex/detail/point_evaluations.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "optex/adaptive_split.hpp"
#include "optex/detail/engine_backend.hpp"

namespace optex::detail {

void expand_points(Batch& chain, std::span<const int> evaluations, Batch& rows) {
  const std::size_t d = rows.dim();
  const float* points = BatchAccess::points(chain);
  const float* predictions = BatchAccess::predicted(chain);
  float* out_points = BatchAccess::points(rows);
  float* out_predicted = BatchAccess::predicted(rows);
  const std::vector<char>& was_predicted = BatchAccess::was_predicted(chain);
  std::vector<char>& out_was_predicted = BatchAccess::was_predicted(rows);
  const auto last_point = static_cast<int>(evaluations.size()) - 1;
  const auto n_rows = static_cast<std::size_t>(rows.size());
  std::size_t r = 0;
  for (int p = 0; p <= last_point; ++p) {
    const auto from = static_cast<std::size_t>(p);
    for (int k = 0; k < evaluations[from]; ++k, ++r) {
      std::copy_n(points + from * d, d, out_points + r * d);
      if (r + 1 >= n_rows) continue;  // the last row has no predicted row
      if (p < last_point) {
        std::copy_n(predictions + from * d, d, out_predicted + r * d);
        out_was_predicted[r] = was_predicted[from];
      } else {
        std::fill_n(out_predicted + r * d, d, 0.0f);
        out_was_predicted[r] = 0;
      }
    }
  }
  BatchAccess::set_proxy_steps_applied(rows, BatchAccess::proxy_steps_applied(chain));
}

Reduction reduce_evaluations(Batch& rows, std::span<const char> admissible,
                             std::span<const int> evaluations, Batch& chain,
                             std::vector<double>& scratch, ShardSums* sums) {
  const std::size_t d = rows.dim();
  const float* grads = BatchAccess::grads(rows);
  float* out = BatchAccess::grads(chain);
  scratch.assign(d, 0.0);
  // Per point with two or more admissible evaluations: the squared norm of the
  // mean, the spread around it (sums over coordinates) and the count.
  std::vector<double> sums_over_coordinates;
  std::vector<int> replicates;
  std::size_t first = 0;
  for (std::size_t p = 0; p < evaluations.size(); ++p) {
    const auto count = static_cast<std::size_t>(evaluations[p]);
    std::fill(scratch.begin(), scratch.end(), 0.0);
    double loss_sum = 0.0;
    int used = 0;
    for (std::size_t r = first; r < first + count; ++r) {
      if (!admissible[r]) continue;
      const float* g = grads + r * d;
      for (std::size_t j = 0; j < d; ++j) scratch[j] += g[j];
      loss_sum += rows.loss(static_cast<int>(r));
      ++used;
    }
    float* mean = out + p * d;
    if (used == 0) {
      std::fill_n(mean, d, 0.0f);
      chain.loss(static_cast<int>(p)) = std::numeric_limits<double>::quiet_NaN();
      first += count;
      continue;
    }
    for (std::size_t j = 0; j < d; ++j) {
      scratch[j] /= used;
      mean[j] = static_cast<float>(scratch[j]);
    }
    chain.loss(static_cast<int>(p)) = loss_sum / used;
    if (used >= 2) {
      double spread = 0.0, mean_norm = 0.0;
      for (std::size_t j = 0; j < d; ++j) mean_norm += scratch[j] * scratch[j];
      for (std::size_t r = first; r < first + count; ++r) {
        if (!admissible[r]) continue;
        const float* g = grads + r * d;
        for (std::size_t j = 0; j < d; ++j) {
          const double e = g[j] - scratch[j];
          spread += e * e;
        }
      }
      sums_over_coordinates.push_back(mean_norm);
      sums_over_coordinates.push_back(spread);
      replicates.push_back(used);
    }
    first += count;
  }
  complete_sums(sums, sums_over_coordinates);
  double noise_sum = 0.0;
  for (std::size_t k = 0; k < replicates.size(); ++k) {
    // The sample covariance's trace, and the signal's unbiased squared norm.
    const int used = replicates[k];
    const double trace = sums_over_coordinates[2 * k + 1] / (used - 1);
    const double signal = sums_over_coordinates[2 * k] - trace / used;
    noise_sum += signal > 0.0 ? std::min(trace / signal, AdaptiveSplit::kMaxNoise)
                              : AdaptiveSplit::kMaxNoise;
  }
  Reduction reduction;
  reduction.gradient_noise = !replicates.empty()
                                 ? noise_sum / static_cast<double>(replicates.size())
                                 : std::numeric_limits<double>::quiet_NaN();
  return reduction;
}

}  // namespace optex::detail
