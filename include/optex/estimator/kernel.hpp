// The former names of the covariance functions, kept for existing code:
// "kernel" now always means a CUDA kernel. Include optex/estimator/covariance.hpp.
#pragma once

#include <string_view>

#include "optex/estimator/covariance.hpp"

namespace optex {

using Kernel [[deprecated("use optex::Covariance (optex/estimator/covariance.hpp)")]] = Covariance;

[[deprecated("use optex::covariance_value")]] inline double kernel_value(Covariance c,
                                                                         double r) noexcept {
  return covariance_value(c, r);
}
[[deprecated("use optex::covariance_name")]] inline std::string_view kernel_name(
    Covariance c) noexcept {
  return covariance_name(c);
}
[[deprecated("use optex::covariance_from_name")]] inline Covariance kernel_from_name(
    std::string_view name) {
  return covariance_from_name(name);
}

}  // namespace optex
