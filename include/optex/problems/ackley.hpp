// Ackley (a = 20, b = 0.2, c = 2 pi) in any dimension:
//   f(x) = -a exp(-b r) - exp((1/d) sum cos(c x_i)) + a + e,  r = sqrt((1/d) sum x_i^2)
// on [-32.768, 32.768]^d, minimum 0 at x = 0. A nearly flat outer region with a
// lattice of local minima near the integer points, and a funnel to the origin.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>
#include <span>
#include <string_view>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Ackley : public ProblemBase<Ackley> {
 public:
  static constexpr double kA = 20.0;
  static constexpr double kB = 0.2;
  static constexpr double kC = 2.0 * std::numbers::pi;

  std::string_view name() const { return "ackley"; }
  Domain domain() const { return {-32.768, 32.768}; }

 private:
  friend class ProblemBase<Ackley>;

  // x_i = 2.25: a quarter-integer, where the cosine ripple is steepest, so both
  // terms of the gradient are active (it points toward the origin); f ~ 8.97.
  static constexpr float kStartValue = 2.25f;
  static constexpr float kMinimizerValue = 0.0f;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  static double Compute(std::span<const float> x, std::span<float> g) {
    const double d = static_cast<double>(x.size());
    double sum_sq = 0.0;
    double sum_cos = 0.0;
    for (const float v : x) {
      const double xi = v;
      sum_sq += xi * xi;
      sum_cos += std::cos(kC * xi);
    }
    const double r = std::sqrt(sum_sq / d);
    const double e_r = std::exp(-kB * r);
    const double e_cos = std::exp(sum_cos / d);
    const double f = -kA * e_r - e_cos + kA + std::numbers::e;
    if (!g.empty()) {
      // d r / d x_i = x_i / (d r) is undefined at r = 0, where the exponential term
      // has a kink; use 0 there (the cosine term's gradient is 0 there too).
      const double radial = r > 0.0 ? kA * kB * e_r / (d * r) : 0.0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i];
        g[i] = static_cast<float>(radial * xi + e_cos * kC * std::sin(kC * xi) / d);
      }
    }
    return f;
  }
};

}  // namespace optex::problems
