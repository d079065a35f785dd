// The base optimizers the engine can drive, as one value type.
#pragma once

#include <span>
#include <string_view>
#include <variant>

#include "optex/adam.hpp"
#include "optex/sgd.hpp"

namespace optex {

using Optimizer = std::variant<Sgd, Adam>;

inline void validate(const Optimizer& opt) {
  std::visit([](const auto& o) { o.validate(); }, opt);
}

inline OptimizerState init_state(const Optimizer& opt, std::size_t dim) {
  return std::visit([dim](const auto& o) { return o.init(dim); }, opt);
}

inline void apply_step(const Optimizer& opt, std::span<float> x, OptimizerState& s,
                       std::span<const float> g) {
  std::visit([&](const auto& o) { o.step(x, s, g); }, opt);
}

inline std::string_view optimizer_name(const Optimizer& opt) {
  return std::holds_alternative<Sgd>(opt) ? "sgd" : "adam";
}

}  // namespace optex
