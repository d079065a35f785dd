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

  void step(std::span<float> x, OptimizerState& s, std::span<const float> g) const;

  friend bool operator==(const Adam&, const Adam&) = default;
};

// AdamW with PyTorch's defaults (weight decay 1e-2).
inline Adam adamw(double lr = 1e-3, double weight_decay = 1e-2) {
  return Adam{.lr = lr, .weight_decay = weight_decay, .decoupled_weight_decay = true};
}

}  // namespace optex
