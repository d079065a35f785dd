// Rastrigin: f(x) = 10 d + sum x_i^2 - 10 cos(2 pi x_i) on [-5.12, 5.12]^d, minimum
// 0 at x = 0. Separable, with a local minimum near every integer point.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>
#include <span>
#include <string_view>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Rastrigin : public ProblemBase<Rastrigin> {
 public:
  std::string_view name() const { return "rastrigin"; }
  Domain domain() const { return {-5.12, 5.12}; }

 private:
  friend class ProblemBase<Rastrigin>;

  // x_i = 2.25: a quarter-integer, where the cosine ripple is steepest (gradient
  // 4.5 + 20 pi per coordinate); f = 15.0625 d.
  static constexpr float kStartValue = 2.25f;
  static constexpr float kMinimizerValue = 0.0f;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  static double Compute(std::span<const float> x, std::span<float> g) {
    constexpr double kTwoPi = 2.0 * std::numbers::pi;
    double f = 10.0 * static_cast<double>(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = x[i];
      f += xi * xi - 10.0 * std::cos(kTwoPi * xi);
      if (!g.empty()) g[i] = static_cast<float>(2.0 * xi + 10.0 * kTwoPi * std::sin(kTwoPi * xi));
    }
    return f;
  }
};

}  // namespace optex::problems
