// The elementwise optimizer passes. Out of line so that this file alone is
// compiled with -fno-math-errno: with errno semantics GCC cannot vectorise the
// loop around std::sqrt (Adam ran about 2x slower). sqrt is correctly rounded
// either way, so results are unchanged bit for bit.
#include <cmath>

#include "optex/adam.hpp"
#include "optex/detail/elementwise.hpp"
#include "optex/sgd.hpp"

namespace optex {

void Sgd::step(std::span<float> x, OptimizerState& s, std::span<const float> g) const {
  const detail::SgdCoefficients c = detail::sgd_coefficients(*this, s.step);
  const std::size_t n = x.size();
  float* __restrict xp = x.data();
  const float* __restrict gp = g.data();
  if (!c.use_momentum) {
    float unused = 0.0f;
    for (std::size_t i = 0; i < n; ++i) detail::sgd_update(xp[i], unused, gp[i], c);
  } else {
    float* __restrict b = s.first_moment.data();
    for (std::size_t i = 0; i < n; ++i) detail::sgd_update(xp[i], b[i], gp[i], c);
  }
  ++s.step;
}

void Adam::step(std::span<float> x, OptimizerState& s, std::span<const float> g) const {
  const detail::AdamCoefficients c = detail::adam_coefficients(*this, s.step);
  ++s.step;
  const std::size_t n = x.size();
  float* __restrict xp = x.data();
  float* __restrict m = s.first_moment.data();
  float* __restrict v = s.second_moment.data();
  const float* __restrict gp = g.data();
  for (std::size_t i = 0; i < n; ++i) detail::adam_update(xp[i], m[i], v[i], gp[i], c);
}

}  // namespace optex
