// Griewank: f(x) = sum x_i^2 / 4000 - prod cos(x_i / sqrt(i)) + 1 (i from 1) on
// [-600, 600]^d, minimum 0 at x = 0. A wide bowl with a fine cosine ripple; the
// product couples all coordinates.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Griewank : public ProblemBase<Griewank> {
 public:
  std::string_view name() const { return "griewank"; }
  Domain domain() const { return {-600.0, 600.0}; }

 private:
  friend class ProblemBase<Griewank>;

  // x_i = 100: a sixth of the way to the box edge, where the quadratic bowl
  // (gradient x_i / 2000 = 0.05) dominates the ripple and points to the minimiser.
  static constexpr float kStartValue = 100.0f;
  static constexpr float kMinimizerValue = 0.0f;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  // d/dx_i of the product is sin(x_i/s_i)/s_i times the product of the OTHER
  // cosines, formed from prefix and suffix products (no division by a cosine
  // that may be 0).
  static double Compute(std::span<const float> x, std::span<float> g) {
    const std::size_t d = x.size();
    std::vector<double> prefix(g.empty() ? 0 : d);  // prefix[i] = prod_{j<i} cos_j
    double sum_sq = 0.0;
    double prod = 1.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double xi = x[i];
      sum_sq += xi * xi;
      if (!g.empty()) prefix[i] = prod;
      prod *= std::cos(xi / std::sqrt(static_cast<double>(i + 1)));
    }
    if (!g.empty()) {
      double suffix = 1.0;  // prod_{j>i} cos_j
      for (std::size_t i = d; i-- > 0;) {
        const double xi = x[i];
        const double s = std::sqrt(static_cast<double>(i + 1));
        g[i] = static_cast<float>(xi / 2000.0 + std::sin(xi / s) / s * prefix[i] * suffix);
        suffix *= std::cos(xi / s);
      }
    }
    return sum_sq / 4000.0 - prod + 1.0;
  }
};

}  // namespace optex::problems
