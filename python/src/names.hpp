// The Python spelling of the core library's enumerations: each value is the
// string of its C++ enumerator name ("matern52", "leave_one_out", ...), and a
// device is "cpu", "cuda" or "cuda:<index>".
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "optex/backend/device.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"

namespace optex::python {

template <class E>
struct EnumNames;  // specialised below: `values`, a list of (value, name) pairs

template <>
struct EnumNames<Covariance> {
  static constexpr std::array<std::pair<Covariance, std::string_view>, 4> values{{
      {Covariance::matern12, "matern12"},
      {Covariance::matern32, "matern32"},
      {Covariance::matern52, "matern52"},
      {Covariance::rbf, "rbf"},
  }};
};
template <>
struct EnumNames<Proxy> {
  static constexpr std::array<std::pair<Proxy, std::string_view>, 3> values{{
      {Proxy::gp, "gp"},
      {Proxy::target, "target"},
      {Proxy::last_gradient, "last_gradient"},
  }};
};
template <>
struct EnumNames<ProxyDistances> {
  static constexpr std::array<std::pair<ProxyDistances, std::string_view>, 2> values{{
      {ProxyDistances::direct, "direct"},
      {ProxyDistances::coefficients, "coefficients"},
  }};
};
template <>
struct EnumNames<InputScaling> {
  static constexpr std::array<std::pair<InputScaling, std::string_view>, 2> values{{
      {InputScaling::none, "none"},
      {InputScaling::reference_mean_sqrt_norm, "reference_mean_sqrt_norm"},
  }};
};
template <>
struct EnumNames<Warmup> {
  static constexpr std::array<std::pair<Warmup, std::string_view>, 2> values{{
      {Warmup::zero_gradient, "zero_gradient"},
      {Warmup::last_gradient, "last_gradient"},
  }};
};
template <>
struct EnumNames<LengthscaleSelection> {
  static constexpr std::array<std::pair<LengthscaleSelection, std::string_view>, 3> values{{
      {LengthscaleSelection::fixed, "fixed"},
      {LengthscaleSelection::leave_one_out, "leave_one_out"},
      {LengthscaleSelection::marginal_likelihood, "marginal_likelihood"},
  }};
};
template <>
struct EnumNames<Strategy> {
  static constexpr std::array<std::pair<Strategy, std::string_view>, 2> values{{
      {Strategy::fixed, "fixed"},
      {Strategy::adaptive, "adaptive"},
  }};
};
template <>
struct EnumNames<ContinueFrom> {
  static constexpr std::array<std::pair<ContinueFrom, std::string_view>, 2> values{{
      {ContinueFrom::last, "last"},
      {ContinueFrom::best_loss, "best_loss"},
  }};
};
template <>
struct EnumNames<Mode> {
  static constexpr std::array<std::pair<Mode, std::string_view>, 2> values{{
      {Mode::approximate, "approximate"},
      {Mode::verified, "verified"},
  }};
};
template <>
struct EnumNames<Precision> {
  static constexpr std::array<std::pair<Precision, std::string_view>, 3> values{{
      {Precision::fp32, "fp32"},
      {Precision::bf16, "bf16"},
      {Precision::bf16_gradients, "bf16_gradients"},
  }};
};

// "'a', 'b' or 'c'": the accepted names, for error messages and docstrings.
template <class E>
std::string name_list() {
  std::string out;
  const auto& values = EnumNames<E>::values;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += i + 1 == values.size() ? " or " : ", ";
    out += '\'';
    out += values[i].second;
    out += '\'';
  }
  return out;
}

template <class E>
std::string_view name_of(E value) {
  for (const auto& [v, name] : EnumNames<E>::values) {
    if (v == value) return name;
  }
  throw std::logic_error("optex: an enumeration value without a Python name");
}

// Throws std::invalid_argument (ValueError) naming `param` and listing the
// accepted names.
template <class E>
E parse_name(std::string_view param, std::string_view text) {
  for (const auto& [v, name] : EnumNames<E>::values) {
    if (name == text) return v;
  }
  throw std::invalid_argument(std::string(param) + ": unknown value '" + std::string(text) +
                              "' (expected " + name_list<E>() + ")");
}

// "cpu", "cuda" (device 0) or "cuda:<index>".
Device parse_device(std::string_view param, std::string_view text);

}  // namespace optex::python
