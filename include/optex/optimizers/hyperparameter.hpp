// A base optimizer's hyperparameters as data. Each optimizer lists its fields
// once (name, member, requirement, documentation); validation, checkpoints,
// the configuration fingerprint of the distributed engine, the Python classes
// and the PyTorch facade all read that one list, so none of them has to be
// edited when an optimizer is added.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace optex {

// What a hyperparameter's value must satisfy. The optimizers' bounds are
// torch.optim's own (a learning rate of exactly 0 is an ordinary value that
// schedules reach), plus finiteness and the float32 range, which torch does not
// check: see docs/DESIGN.md section 9.
enum class Requirement {
  positive,       // finite and > 0
  non_negative,   // finite and >= 0
  unit_interval,  // in [0, 1)
  flag,           // a bool: anything goes
};

template <class Owner, class Value>
struct Hyperparameter {
  static_assert(std::is_same_v<Value, double> || std::is_same_v<Value, bool>,
                "hyperparameters are doubles or bools (the checkpoint and binding formats)");
  using value_type = Value;
  using Member = Value Owner::*;

  std::string_view name;  // also the Python attribute and keyword
  Member member;
  Requirement requirement;
  std::string_view doc;  // one line, for the Python attribute
  // False: fixed by the Python class instead of being an attribute (AdamW is
  // an Adam whose decoupled_weight_decay is always set).
  bool in_python = true;
};

// One Python class of an optimizer: its name, docstring and defaults. The
// fields hidden from Python take their values from `defaults`.
template <class Owner>
struct PythonClass {
  std::string_view name;
  std::string_view doc;
  Owner defaults;
};

namespace detail {

// "lr: must be finite and >= 0, got nan": throws std::invalid_argument.
[[noreturn]] void reject(std::string_view name, double value, std::string_view requirement);

// For cannot_become(): why momentum `next` cannot replace `current` in a running engine when
// one is zero and the other not (a momentum buffer exists only with non-zero momentum);
// "" otherwise.
std::string momentum_buffer_change(double current, double next);
std::string_view requirement_text(Requirement requirement);

inline bool satisfies(double v, Requirement requirement) {
  switch (requirement) {
    case Requirement::positive:
      return std::isfinite(v) && v > 0.0;
    case Requirement::non_negative:
      return std::isfinite(v) && v >= 0.0;
    case Requirement::unit_interval:
      return std::isfinite(v) && v >= 0.0 && v < 1.0;
    case Requirement::flag:
      return true;
  }
  return false;
}

// Calls f(field) for every hyperparameter of Optimizer, in declaration order.
template <class Optimizer, class F>
constexpr void for_each_hyperparameter(F&& f) {
  std::apply([&](const auto&... field) { (f(field), ...); }, Optimizer::hyperparameters());
}

// Throws std::invalid_argument naming `name` and `v` unless v satisfies `requirement`.
inline void require(std::string_view name, double v, Requirement requirement) {
  if (!satisfies(v, requirement)) reject(name, v, requirement_text(requirement));
}

// Checks each field against its requirement and the float32 range, in order;
// the first failure throws std::invalid_argument naming the field and the value.
template <class Optimizer>
void check_hyperparameters(const Optimizer& o) {
  for_each_hyperparameter<Optimizer>([&](const auto& field) {
    if constexpr (std::is_same_v<typename std::decay_t<decltype(field)>::value_type, double>) {
      const double v = o.*field.member;
      require(field.name, v, field.requirement);
      // The steps compute in float32, where a larger value is infinite.
      if (std::fabs(v) > static_cast<double>(FLT_MAX)) {
        reject(field.name, v,
               "at most 3.40282e+38, the largest float32 (the steps run in float32)");
      }
    }
  });
}

}  // namespace detail
}  // namespace optex
