// The explicit, copyable state of a base optimizer (optax style: the optimizer
// value holds hyperparameters only; everything that changes lives here).
#pragma once

#include <cstdint>
#include <vector>

namespace optex {

struct OptimizerState {
  std::vector<float> first_moment;   // SGD: momentum buffer; Adam: m. Empty when unused.
  std::vector<float> second_moment;  // Adam: v. Empty when unused.
  std::int64_t step = 0;             // number of updates applied so far

  friend bool operator==(const OptimizerState&, const OptimizerState&) = default;
};

}  // namespace optex
