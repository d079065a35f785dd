// Stochastic gradient descent with momentum, Nesterov momentum and (coupled)
// weight decay, with PyTorch's torch.optim.SGD semantics (dampening 0).
#pragma once

#include <cstddef>
#include <span>

#include "optex/optimizer_state.hpp"

namespace optex {

struct Sgd {
  double lr = 1e-2;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;  // adds weight_decay * x to the gradient

  // Throws std::invalid_argument naming the first bad hyperparameter.
  void validate() const;

  OptimizerState init(std::size_t dim) const {
    OptimizerState s;
    if (momentum != 0.0) s.first_moment.assign(dim, 0.0f);
    return s;
  }

  // One update of x in place. PyTorch semantics: the momentum buffer starts
  // as the first gradient rather than decaying from zero.
  void step(std::span<float> x, OptimizerState& s, std::span<const float> g) const {
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
};

}  // namespace optex
