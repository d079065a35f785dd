// Stationary covariance kernels of the GP gradient estimator.
//
// Every kernel here is a function of r = ||x - x'|| / lengthscale with unit output
// scale, so k(0) = 1. The output scale does not matter for the GP mean except
// through the ratio noise / scale, which the `noise` option already sets.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

#include "optex/detail/host_device.hpp"

namespace optex {

enum class Kernel { matern12, matern32, matern52, rbf };

// Shared with the CUDA kernels, hence the C math functions (::exp, ::sqrt).
OPTEX_HOST_DEVICE inline double kernel_value(Kernel kernel, double r) noexcept {
  switch (kernel) {
    case Kernel::matern12:
      return ::exp(-r);
    case Kernel::matern32: {
      const double a = ::sqrt(3.0) * r;
      return (1.0 + a) * ::exp(-a);
    }
    case Kernel::matern52: {
      const double a = ::sqrt(5.0) * r;
      return (1.0 + a + a * a / 3.0) * ::exp(-a);
    }
    case Kernel::rbf:
      return ::exp(-0.5 * r * r);
  }
  return 0.0;
}

inline std::string_view kernel_name(Kernel kernel) noexcept {
  switch (kernel) {
    case Kernel::matern12:
      return "matern12";
    case Kernel::matern32:
      return "matern32";
    case Kernel::matern52:
      return "matern52";
    case Kernel::rbf:
      return "rbf";
  }
  return "unknown";
}

inline Kernel kernel_from_name(std::string_view name) {
  for (Kernel k : {Kernel::matern12, Kernel::matern32, Kernel::matern52, Kernel::rbf}) {
    if (kernel_name(k) == name) return k;
  }
  throw std::invalid_argument("kernel: unknown kernel '" + std::string(name) +
                              "' (expected matern12, matern32, matern52 or rbf)");
}

}  // namespace optex
