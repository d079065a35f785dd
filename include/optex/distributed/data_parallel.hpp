// Data parallelism inside an OptEx group (DistributedOptions::data_parallel):
// D ranks evaluate the same point on different minibatches and the group's
// gradient is their mean. These two functions are the whole definition, so a
// single process can reproduce a hybrid run exactly (tests do).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "optex/util/random.hpp"

namespace optex {

// The seed of data rank `data_rank`'s minibatch at a point whose own seed is
// `point_seed` (Batch::seed). With one data rank it is the point's seed, so a
// run without data parallelism sees the seeds Batch::seed hands out.
constexpr std::uint64_t minibatch_seed(std::uint64_t point_seed, int data_rank,
                                       int data_parallel) noexcept {
  if (data_parallel == 1) return point_seed;
  return mix_seed(point_seed, static_cast<std::uint64_t>(data_rank) + 1);
}

// out[j] = (rows[0][j] + rows[1][j] + ... + rows[D-1][j]) / D, summed in rank
// order in float. `rows` holds D rows of out.size() floats, rank-major. A fixed
// order makes the mean the same bits on every rank and in a single process.
inline void mean_in_rank_order(std::span<const float> rows, std::span<float> out) {
  const std::size_t n = out.size();
  if (n == 0 || rows.size() % n != 0 || rows.empty()) {
    throw std::invalid_argument("rows: size " + std::to_string(rows.size()) +
                                " is not a positive multiple of the output size " +
                                std::to_string(n));
  }
  const std::size_t ranks = rows.size() / n;
  const float divisor = static_cast<float>(ranks);
  // Row by row (streams memory); per element the order is still rank 0, 1, ...
  for (std::size_t j = 0; j < n; ++j) out[j] = rows[j];
  for (std::size_t r = 1; r < ranks; ++r) {
    for (std::size_t j = 0; j < n; ++j) out[j] += rows[r * n + j];
  }
  for (std::size_t j = 0; j < n; ++j) out[j] /= divisor;
}

// The same for losses, in double.
inline double mean_in_rank_order(std::span<const double> values) {
  if (values.empty()) throw std::invalid_argument("values: empty");
  double sum = values[0];
  for (std::size_t r = 1; r < values.size(); ++r) sum += values[r];
  return sum / static_cast<double>(values.size());
}

}  // namespace optex
