// Adam (Kingma and Ba 2015) with PyTorch's torch.optim.Adam / AdamW semantics:
// coupled L2 weight decay by default, decoupled (AdamW, Loshchilov and Hutter
// 2019) when `decoupled_weight_decay` is set.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "optex/optimizer_state.hpp"

namespace optex {

struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;

  void validate() const;

  OptimizerState init(std::size_t dim) const {
    OptimizerState s;
    s.first_moment.assign(dim, 0.0f);
    s.second_moment.assign(dim, 0.0f);
    return s;
  }

  void step(std::span<float> x, OptimizerState& s, std::span<const float> g) const {
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
};

// AdamW with PyTorch's defaults (weight decay 1e-2).
inline Adam adamw(double lr = 1e-3, double weight_decay = 1e-2) {
  return Adam{.lr = lr, .weight_decay = weight_decay, .decoupled_weight_decay = true};
}

}  // namespace optex
