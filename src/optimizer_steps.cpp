// The elementwise optimizer passes. Out of line so that this file alone is
// compiled with -fno-math-errno: with errno semantics GCC cannot vectorise the
// loop around std::sqrt (Adam ran about 2x slower). sqrt is correctly rounded
// either way, so results are unchanged bit for bit.
#include <cmath>

#include "optex/adam.hpp"
#include "optex/sgd.hpp"

namespace optex {

void Sgd::step(std::span<float> x, OptimizerState& s, std::span<const float> g) const {
  const auto lr_f = static_cast<float>(lr);
  const auto wd = static_cast<float>(weight_decay);
  const auto mu = static_cast<float>(momentum);
  const std::size_t n = x.size();
  float* __restrict xp = x.data();
  const float* __restrict gp = g.data();
  if (momentum == 0.0) {
    for (std::size_t i = 0; i < n; ++i) xp[i] -= lr_f * (gp[i] + wd * xp[i]);
  } else {
    float* __restrict b = s.first_moment.data();
    const bool first = s.step == 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = gp[i] + wd * xp[i];
      const float bi = first ? gi : mu * b[i] + gi;
      b[i] = bi;
      xp[i] -= lr_f * (nesterov ? gi + mu * bi : bi);
    }
  }
  ++s.step;
}

void Adam::step(std::span<float> x, OptimizerState& s, std::span<const float> g) const {
  ++s.step;
  // Scalars in double, then rounded once: the elementwise pass is float32.
  const auto t = static_cast<double>(s.step);
  const double bias1 = 1.0 - std::pow(beta1, t);
  const double bias2 = 1.0 - std::pow(beta2, t);
  const auto step_size = static_cast<float>(lr / bias1);
  const auto inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  const auto b1 = static_cast<float>(beta1);
  const auto b2 = static_cast<float>(beta2);
  const auto eps_f = static_cast<float>(eps);
  const auto l2 = decoupled_weight_decay ? 0.0f : static_cast<float>(weight_decay);
  const auto shrink = static_cast<float>(decoupled_weight_decay ? 1.0 - lr * weight_decay : 1.0);
  const std::size_t n = x.size();
  float* __restrict xp = x.data();
  float* __restrict m = s.first_moment.data();
  float* __restrict v = s.second_moment.data();
  const float* __restrict gp = g.data();
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = gp[i] + l2 * xp[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bias2 + eps_f;
    xp[i] = xp[i] * shrink - step_size * m[i] / denom;
  }
}

}  // namespace optex
