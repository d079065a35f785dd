// Choosing the kernel lengthscale from the history itself.
//
// Both criteria need only T0 x T0 quantities the history keeps up to date
// (pairwise distances and the gradient Gram matrix Q = G G^T), so a selection
// over a grid costs O(grid * T0^3), independent of d.
//   leave-one-out: sum_i ||mu_{-i}(x_i) - g_i||^2
//                  = sum_i (A^-1 Q A^-1)_ii / (A^-1)_ii^2   (Rasmussen & Williams eq. 5.12)
//   marginal likelihood, with the output scale profiled out (the d outputs
//   share A = c K~, and c has a closed-form optimum):
//                  maximise -T0 log tr(K~^-1 Q) - log det K~
#pragma once

#include <span>

#include "optex/engine/options.hpp"
#include "optex/estimator/gradient_history.hpp"

namespace optex {

// The built-in grid, as multiples of the median pairwise history distance.
std::span<const double> default_lengthscale_grid();

struct LengthscaleChoice {
  double lengthscale;  // in the units of the scaled inputs
  double score;        // the criterion's value at the choice (lower is better)
  bool changed;        // false when the history could not support a choice
};

// Returns `current` unchanged when the history has fewer than 3 points or all
// of them coincide.
LengthscaleChoice select_lengthscale(const HistoryGram& history, const Options& options,
                                     double current);

}  // namespace optex
