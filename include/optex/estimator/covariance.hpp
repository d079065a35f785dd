// The covariance functions (GP kernels) of the gradient estimator. Called
// Covariance rather than Kernel so that "kernel" in this code base always
// means a CUDA kernel.
//
// Every covariance here is a function of r = ||x - x'|| / lengthscale with unit
// output scale, so k(0) = 1. The output scale does not matter for the GP mean except
// through the ratio noise / scale, which the `noise` option already sets.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

#include "optex/backend/host_device.hpp"

namespace optex {

enum class Covariance { matern12, matern32, matern52, rbf };

// Shared with the CUDA code, hence the C math functions (::exp, ::sqrt).
OPTEX_HOST_DEVICE inline double covariance_value(Covariance covariance, double r) noexcept {
  switch (covariance) {
    case Covariance::matern12:
      return ::exp(-r);
    case Covariance::matern32: {
      const double a = ::sqrt(3.0) * r;
      return (1.0 + a) * ::exp(-a);
    }
    case Covariance::matern52: {
      const double a = ::sqrt(5.0) * r;
      return (1.0 + a + a * a / 3.0) * ::exp(-a);
    }
    case Covariance::rbf:
      return ::exp(-0.5 * r * r);
  }
  return 0.0;
}

inline std::string_view covariance_name(Covariance covariance) noexcept {
  switch (covariance) {
    case Covariance::matern12:
      return "matern12";
    case Covariance::matern32:
      return "matern32";
    case Covariance::matern52:
      return "matern52";
    case Covariance::rbf:
      return "rbf";
  }
  return "unknown";
}

inline Covariance covariance_from_name(std::string_view name) {
  for (Covariance k :
       {Covariance::matern12, Covariance::matern32, Covariance::matern52, Covariance::rbf}) {
    if (covariance_name(k) == name) return k;
  }
  throw std::invalid_argument("kernel: unknown kernel '" + std::string(name) +
                              "' (expected matern12, matern32, matern52 or rbf)");
}

}  // namespace optex
