// Points with several evaluations (Options::evaluations_per_point, the
// adaptive strategy): the engine's proxy chain makes P distinct points, the
// caller's batch holds N = sum of evaluations rows, and each point's gradient
// and loss are the means of its admissible evaluations (DESIGN.md section 2).
// Host rows only: the CPU backend's batches.
#pragma once

#include <span>
#include <vector>

#include "optex/batch.hpp"
#include "optex/coordinate_shard.hpp"

namespace optex::detail {

// rows := the chain's points, point p repeated evaluations[p] times in order;
// predicted row r := the prediction of row r's point where that point has one
// (every point but the last), zero otherwise.
void expand_points(Batch& chain, std::span<const int> evaluations, Batch& rows);

struct Reduction {
  // Per-evaluation gradient noise against signal (IterationInfo::gradient_noise),
  // NaN when no point had two admissible evaluations.
  double gradient_noise = 0.0;
};

// chain's gradient row p and loss p := the means of point p's admissible
// evaluations (rows with admissible[r] != 0), summed in double in row order;
// a NaN loss where a point has none (the commit then drops it). Writes the
// chain only. `scratch` is work space (resized to d doubles). With `sums`
// the rows hold one slice of the coordinates: the noise's sums over
// coordinates are completed across the slices (coordinate_shard.hpp).
Reduction reduce_evaluations(Batch& rows, std::span<const char> admissible,
                             std::span<const int> evaluations, Batch& chain,
                             std::vector<double>& scratch, ShardSums* sums = nullptr);

}  // namespace optex::detail
