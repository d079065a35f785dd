// Rosenbrock: f(x) = sum_{i<d} 100 (x_{i+1} - x_i^2)^2 + (x_i - 1)^2 on [-5, 10]^d,
// minimum 0 at x = 1. A curved, badly conditioned valley; needs d >= 2.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"

namespace optex::problems {

class Rosenbrock {
 public:
  std::string_view name() const { return "rosenbrock"; }

  double Evaluate(std::span<const float> x) const {
    CheckDim("x", x.size());
    return Compute(x, {});
  }
  void Gradient(std::span<const float> x, std::span<float> g) const { EvaluateWithGradient(x, g); }
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    CheckDim("x", x.size());
    detail::check_gradient(x, g);
    return Compute(x, g);
  }

  Domain domain() const { return {-5.0, 10.0}; }

  // The classic start (-1.2, 1, -1.2, 1, ...); f = 24.2 at d = 2.
  std::vector<float> standard_start(std::size_t d) const {
    CheckDim("d", d);
    std::vector<float> x(d);
    for (std::size_t i = 0; i < d; ++i) x[i] = (i % 2 == 0) ? -1.2f : 1.0f;
    return x;
  }
  std::vector<float> minimizer(std::size_t d) const {
    CheckDim("d", d);
    return std::vector<float>(d, 1.0f);
  }
  double minimum(std::size_t d) const {
    CheckDim("d", d);
    return 0.0;
  }

 private:
  static void CheckDim(std::string_view param, std::size_t d) {
    detail::check_dimension(param, d, 2, "rosenbrock couples neighbouring coordinates");
  }

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
