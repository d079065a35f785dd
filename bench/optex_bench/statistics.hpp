// Order statistics over seeds, with "never reached" as +infinity.
#pragma once

#include <vector>

#include "methods.hpp"

namespace optex_bench {

// The first round (0 = the start) whose loss is <= target; +infinity when none is.
double rounds_to_target(const Trajectory& run, double target);

// The cumulative wall seconds at that round; +infinity when it never comes.
double seconds_to_target(const Trajectory& run, double target);

// The loss of the last round; NaN (a failed run) counts as +infinity.
double final_loss(const Trajectory& run);

// Quartiles by linear interpolation between order statistics (numpy's default).
// NaN counts as +infinity, so a median over seeds where more than half never
// reached the target is +infinity (written as null).
struct Quartiles {
  double q1;
  double median;
  double q3;
};
Quartiles quartiles(std::vector<double> values);

}  // namespace optex_bench
