// Rosenbrock: f(x) = sum_{i<d} 100 (x_{i+1} - x_i^2)^2 + (x_i - 1)^2 on [-5, 10]^d,
// minimum 0 at x = 1. A curved, badly conditioned valley; needs d >= 2.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Rosenbrock : public ProblemBase<Rosenbrock> {
 public:
  std::string_view name() const { return "rosenbrock"; }
  Domain domain() const { return {-5.0, 10.0}; }

  // The classic start (-1.2, 1, -1.2, 1, ...); f = 24.2 at d = 2.
  std::vector<float> standard_start(std::size_t d) const {
    CheckDim("d", d);
    std::vector<float> x(d);
    for (std::size_t i = 0; i < d; ++i) x[i] = (i % 2 == 0) ? -1.2f : 1.0f;
    return x;
  }

 private:
  friend class ProblemBase<Rosenbrock>;

  static constexpr std::size_t kMinDimension = 2;
  static constexpr std::string_view kMinDimensionReason =
      "rosenbrock couples neighbouring coordinates";
  static constexpr float kMinimizerValue = 1.0f;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  static double Compute(std::span<const float> x, std::span<float> g) {
    const std::size_t d = x.size();
    double f = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double xi = x[i];
      double gi = 0.0;
      if (i + 1 < d) {  // term i: depends on x_i and x_{i+1}
        const double t = static_cast<double>(x[i + 1]) - xi * xi;
        f += 100.0 * t * t + (xi - 1.0) * (xi - 1.0);
        gi += -400.0 * xi * t + 2.0 * (xi - 1.0);
      }
      if (i > 0) {  // term i-1 also depends on x_i
        const double xp = x[i - 1];
        gi += 200.0 * (xi - xp * xp);
      }
      if (!g.empty()) g[i] = static_cast<float>(gi);
    }
    return f;
  }
};

}  // namespace optex::problems
