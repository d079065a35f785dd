// The base optimizers the engine can drive, as one value type, and the
// operations every part of the library applies to any of them.
//
// Each optimizer is one header under optimizers/ that holds everything about
// it (docs/DESIGN.md section 9); adding one means writing that header and
// naming the type in `Optimizer` below. Every function here dispatches with
// std::visit, so a kind that does not provide what the BaseOptimizer concept
// asks for is a compile error, not a run-time surprise.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "optex/optimizers/adam.hpp"
#include "optex/optimizers/lion.hpp"
#include "optex/optimizers/optimizer_state.hpp"
#include "optex/optimizers/rmsprop.hpp"
#include "optex/optimizers/sgd.hpp"

namespace optex {

// What a base optimizer provides (see optimizers/sgd.hpp for a commented one).
template <class T>
concept BaseOptimizer = std::is_trivially_copyable_v<T> && std::equality_comparable<T> &&
    requires(const T& o, std::int64_t step, float& x, float g, SlotValues& s,
             const typename T::Coefficients& c) {
  { T::name } -> std::convertible_to<std::string_view>;
  { T::checkpoint_tag } -> std::convertible_to<std::uint8_t>;
  T::hyperparameters();
  T::python_classes();
  T::slot_names;
  { T::non_negative_slots } -> std::convertible_to<StateSlots>;
  o.validate();
  { o.state_slots() } -> std::same_as<StateSlots>;
  { o.cannot_become(o) } -> std::same_as<std::string>;
  { o.coefficients(step) } -> std::same_as<typename T::Coefficients>;
  T::update(x, g, s, c);
};

// The optimizer kinds. Checkpoint tags must be unique (checked below) and
// never reused: files store them.
using Optimizer = std::variant<Sgd, Adam, RmsProp, Lion>;

namespace detail {
template <class V>
struct AllBaseOptimizers;
template <class... O>
struct AllBaseOptimizers<std::variant<O...>> {
  static constexpr bool value = (BaseOptimizer<O> && ...);
  static constexpr bool tags_unique() {
    const std::uint8_t tags[] = {O::checkpoint_tag...};
    for (std::size_t i = 0; i < sizeof...(O); ++i)
      for (std::size_t j = i + 1; j < sizeof...(O); ++j)
        if (tags[i] == tags[j]) return false;
    return true;
  }
};
}  // namespace detail
static_assert(detail::AllBaseOptimizers<Optimizer>::value,
              "every Optimizer alternative must satisfy BaseOptimizer");
static_assert(detail::AllBaseOptimizers<Optimizer>::tags_unique(),
              "two optimizers share a checkpoint tag");

// Calls f(std::type_identity<O>{}) for every optimizer kind, in variant order.
template <class F>
constexpr void for_each_optimizer_kind(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(std::type_identity<std::variant_alternative_t<I, Optimizer>>{}), ...);
  }
  (std::make_index_sequence<std::variant_size_v<Optimizer>>{});
}

// Throws std::invalid_argument naming the first bad hyperparameter.
inline void validate(const Optimizer& opt) {
  std::visit([](const auto& o) { o.validate(); }, opt);
}

inline std::string_view optimizer_name(const Optimizer& opt) {
  return std::visit([](const auto& o) -> std::string_view { return o.name; }, opt);
}

inline StateSlots state_slots(const Optimizer& opt) {
  return std::visit([](const auto& o) { return o.state_slots(); }, opt);
}

// The name of state slot `slot` ("exp_avg_sq"), and whether it must never be
// negative (a second moment); "slot <j>" for a slot the optimizer does not name.
inline std::string slot_name(const Optimizer& opt, int slot) {
  return std::visit(
      [slot](const auto& o) {
        const auto& names = o.slot_names;
        return slot >= 0 && static_cast<std::size_t>(slot) < names.size()
                   ? std::string(names[static_cast<std::size_t>(slot)])
                   : "slot " + std::to_string(slot);
      },
      opt);
}
inline bool slot_is_non_negative(const Optimizer& opt, int slot) {
  return std::visit([slot](const auto& o) { return o.non_negative_slots.uses(slot); }, opt);
}

// A fresh state for dimension `dim`: zero buffers where the optimizer keeps them.
inline OptimizerState init_state(const Optimizer& opt, std::size_t dim) {
  return zero_state(state_slots(opt), dim);
}
template <BaseOptimizer O>  // an exact match, so that init_state(Adam{}, d) is not ambiguous
OptimizerState init_state(const O& opt, std::size_t dim) {
  return zero_state(opt.state_slots(), dim);
}

// Why `next` cannot replace `current` in a running engine: another kind, or
// a change of the state layout or the algorithm ("" when it can).
std::string cannot_replace(const Optimizer& current, const Optimizer& next);

// One update of x in place with gradient g; advances s.step. s must have the
// optimizer's slots (init_state).
void apply_step(const Optimizer& opt, std::span<float> x, OptimizerState& s,
                std::span<const float> g);
template <BaseOptimizer O>
void apply_step(const O& opt, std::span<float> x, OptimizerState& s, std::span<const float> g) {
  apply_step(Optimizer(opt), x, s, g);
}

// The same optimizer with another learning rate (every kind has `lr`).
inline Optimizer with_learning_rate(Optimizer opt, double lr) {
  std::visit([lr](auto& o) { o.lr = lr; }, opt);
  return opt;
}

// The optimizer of a Python class name, lower case ("sgd", "adam", "adamw",
// "rmsprop", "lion") with that class's defaults; std::invalid_argument
// listing the known names otherwise. For command lines.
Optimizer optimizer_from_name(std::string_view name);
// Those names, "sgd, adam, adamw, rmsprop, lion".
std::string optimizer_names();

}  // namespace optex
