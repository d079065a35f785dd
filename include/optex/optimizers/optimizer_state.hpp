// The explicit, copyable state of a base optimizer (optax style: the optimizer
// value holds hyperparameters only; everything that changes lives here).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "optex/util/allocation.hpp"

namespace optex {

// The most per-coordinate buffers a base optimizer keeps (RmsProp, centered
// and with momentum: square average, momentum buffer, gradient average).
inline constexpr int kMaxStateSlots = 3;

// Which slots of an OptimizerState an optimizer uses: bit j for slot j.
struct StateSlots {
  unsigned bits = 0;

  constexpr bool uses(int slot) const { return ((bits >> slot) & 1u) != 0; }
  constexpr StateSlots with(int slot) const { return {bits | (1u << slot)}; }
  constexpr StateSlots operator|(StateSlots other) const { return {bits | other.bits}; }
  constexpr int count() const {
    int n = 0;
    for (int j = 0; j < kMaxStateSlots; ++j) n += uses(j) ? 1 : 0;
    return n;
  }
  friend constexpr bool operator==(StateSlots, StateSlots) = default;
};

// One coordinate's slot values, as the elementwise updates read and write
// them (an unused slot holds a value nobody reads).
using SlotValues = float[kMaxStateSlots];

struct OptimizerState {
  // slots[j]: d floats when the optimizer uses slot j, empty otherwise. What
  // each slot means is the optimizer's (its `slot_names`): SGD's momentum
  // buffer, Adam's first and second moments, ...
  std::array<std::vector<float>, kMaxStateSlots> slots;
  std::int64_t step = 0;  // number of updates applied so far

  // The slots in use.
  StateSlots used() const {
    StateSlots s;
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (!slots[static_cast<std::size_t>(j)].empty()) s = s.with(j);
    }
    return s;
  }

  friend bool operator==(const OptimizerState&, const OptimizerState&) = default;
};

// A fresh state: zero in every slot of `used`, step 0.
inline OptimizerState zero_state(StateSlots used, std::size_t dim) {
  const std::string what = "optimizer state: dimension " + std::to_string(dim);
  const std::string contents = std::to_string(used.count()) + " fp32 slots";
  const std::size_t bytes = detail::checked_bytes(
      what, contents, {static_cast<std::size_t>(used.count()), dim}, sizeof(float));
  return detail::allocate_or_explain(what, contents, bytes, [&] {
    OptimizerState s;
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (used.uses(j)) s.slots[static_cast<std::size_t>(j)].assign(dim, 0.0f);
    }
    return s;
  });
}

}  // namespace optex
