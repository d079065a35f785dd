// The largest magnitude a point or gradient entry may have, for dimension d.
//
// Why a bound on finite values: the history's statistics (squared distances,
// norms, gradient inner products) sum d products of two entries, in float on
// the GPU. With every entry at most B(d) = sqrt(FLT_MAX / (8 d)) in
// magnitude, each such sum is at most d (2B)^2 = FLT_MAX / 2, so it is finite
// on every backend, and no accepted value can make the engine unusable.
// An entry above the bound counts as non-finite (DESIGN.md section 6).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <span>

namespace optex {

// B(d) rounded down to a float: 6.5e18 at d = 1, 6.5e15 at d = 10^6, 2.1e14 at d = 10^9.
inline float magnitude_bound(std::size_t d) {
  const double bound =
      std::sqrt(static_cast<double>(FLT_MAX) / (8.0 * static_cast<double>(d > 0 ? d : 1)));
  const auto rounded = static_cast<float>(bound);
  return static_cast<double>(rounded) > bound ? std::nextafter(rounded, 0.0f) : rounded;
}

// Whether v is finite and at most `bound` in magnitude (false for NaN).
inline bool within_bound(float v, float bound) { return std::fabs(v) <= bound; }
inline bool within_bound(double v, float bound) {
  return std::fabs(v) <= static_cast<double>(bound);
}

// Whether every value is within `bound` (FLT_MAX: whether every value is finite).
inline bool all_within_bound(std::span<const float> values, float bound) {
  return std::all_of(values.begin(), values.end(),
                     [bound](float v) { return within_bound(v, bound); });
}

}  // namespace optex
