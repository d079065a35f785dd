// What the engine reports after each committed iteration (to callbacks, and
// as the return value of Engine::tell).
#pragma once

#include <cstdint>
#include <span>

namespace optex {

struct IterationInfo {
  std::int64_t iteration = 0;    // iterations committed so far (1 after the first tell)
  std::int64_t evaluations = 0;  // true gradient evaluations so far
  double loss = 0.0;             // loss at the point the commit stepped from (the last finite one)
  double best_loss = 0.0;        // lowest finite loss of the batch
  double grad_norm = 0.0;        // ||g|| at that point
  // Mean cosine between predicted and true gradient over the proxy points
  // that had a real prediction; NaN when none had (N = 1, warm-up).
  double cosine = 0.0;
  double lengthscale = 0.0;  // lengthscale used by this iteration's proxy steps
  int committed_point = 0;   // index of the point the commit stepped from (N-1 unless dropped)
  int dropped = 0;           // pairs with a non-finite gradient or loss, kept out of the history
  // The new iterate, valid until the next tell; empty on a device engine
  // (Engine::iterate() copies it from the device on request).
  std::span<const float> iterate;
};

}  // namespace optex
