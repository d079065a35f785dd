// Ellipsoid: f(x) = 1/2 sum_i lambda_i x_i^2, minimum 0 at x = 0, with curvatures
// log-spaced from 1/kappa to 1 (lambda_i = kappa^((i - d) / (d - 1)), i = 1..d; lambda = 1
// at d = 1). Convex, but ill-conditioned by a chosen condition number kappa.
//
// Axis-aligned it is separable, which flatters any per-coordinate model (Adam's):
// Rotated<Ellipsoid> is the rotated ellipsoid f(x) = 1/2 sum_i lambda_i (Q x)_i^2 that
// optex-bench runs as ellipsoid_1e2, ellipsoid_1e4 and ellipsoid_1e6. The largest
// curvature is 1 at every kappa, so gradient descent is stable for lr < 2; a U(-1, 1)^d
// start has expected loss (1/6) sum_i lambda_i, about d / (6 ln kappa) for large kappa.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Ellipsoid : public ProblemBase<Ellipsoid> {
 public:
  explicit Ellipsoid(double condition_number) : kappa_(Checked(condition_number)) {}

  std::string_view name() const { return "ellipsoid"; }
  double condition_number() const { return kappa_; }
  // The box optex-bench's starts are drawn from; a quadratic has no natural one.
  Domain domain() const { return {-1.0, 1.0}; }

  // lambda_i for the 0-based coordinate i of a d-dimensional point.
  double curvature(std::size_t i, std::size_t d) const {
    detail::check_dimension("d", d);
    if (i >= d) {
      throw std::invalid_argument("i: must be < d = " + std::to_string(d) + ", got " +
                                  std::to_string(i));
    }
    return Curvature(i, d);
  }

 private:
  friend class ProblemBase<Ellipsoid>;
  // standard_start: every x_i = 1, so f = (1/2) sum lambda_i and the gradient is the
  // curvatures; the minimizer is the origin, the minimum 0.
  static constexpr float kStartValue = 1.0f;
  static constexpr float kMinimizerValue = 0.0f;

  static double Checked(double kappa) {
    if (!(std::isfinite(kappa) && kappa >= 1.0)) {
      throw std::invalid_argument("condition_number: must be finite and >= 1, got " +
                                  std::to_string(kappa));
    }
    return kappa;
  }

  double Curvature(std::size_t i, std::size_t d) const {
    if (d == 1) return 1.0;
    const double t = (static_cast<double>(i) - static_cast<double>(d - 1)) /
                     static_cast<double>(d - 1);  // in [-1, 0]
    return std::exp(t * std::log(kappa_));
  }

  // f and, when g is non-empty, its gradient: one code path for every entry point.
  double Compute(std::span<const float> x, std::span<float> g) const {
    const std::size_t d = x.size();
    double f = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double lambda = Curvature(i, d);
      const double xi = x[i];
      f += 0.5 * lambda * xi * xi;
      if (!g.empty()) g[i] = static_cast<float>(lambda * xi);
    }
    return f;
  }

  double kappa_;
};

}  // namespace optex::problems
