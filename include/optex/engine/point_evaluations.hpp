// Points with several evaluations (Options::evaluations_per_point, the
// adaptive strategy): the engine's proxy chain makes P distinct points, the
// caller's batch holds N = sum of evaluations rows, and each point's gradient
// and loss are the means of its admissible evaluations (DESIGN.md section 2).
// The rows are copied and averaged by the backend (EngineBackend::
// expand_points and reduce_evaluations, on any device); what the means say
// about the gradient's noise is decided here, on the host.
#pragma once

#include <span>

namespace optex::detail {

// The per-evaluation gradient noise against signal (IterationInfo::
// gradient_noise) from the points with two or more admissible evaluations:
// sums[2k] = ||mean_k||^2 and sums[2k + 1] = the spread of point k's
// evaluations around their mean (sums over coordinates, in fp64), replicates[k]
// = how many. NaN without any such point.
double gradient_noise(std::span<const double> sums, std::span<const int> replicates);

}  // namespace optex::detail
