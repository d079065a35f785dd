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
  void step(std::span<float> x, OptimizerState& s, std::span<const float> g) const;

  friend bool operator==(const Sgd&, const Sgd&) = default;
};

}  // namespace optex
