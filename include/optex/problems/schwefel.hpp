// Schwefel 2.26: f(x) = 418.9828872724338 d - sum x_i sin(sqrt(|x_i|)) on
// [-500, 500]^d, minimum 0 at x_i = 420.968746 (the SFU convention, shifted so
// that f* = 0; not the unshifted variant whose minimum is -418.98 d).
// Separable and deceptive: the best local minima lie far from each other.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Schwefel : public ProblemBase<Schwefel> {
 public:
  static constexpr double kOffset = 418.9828872724338;
  static constexpr double kMinimizer = 420.968746;

  std::string_view name() const { return "schwefel"; }
  Domain domain() const { return {-500.0, 500.0}; }

 private:
  friend class ProblemBase<Schwefel>;

  // x_i = 100: inside the box and away from 0 (where the gradient vanishes); the
  // gradient there is about 4.7 per coordinate.
  static constexpr float kStartValue = 100.0f;
  static constexpr float kMinimizerValue = static_cast<float>(kMinimizer);

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  // With s = sqrt(|x|): d/dx [x sin s] = sin s + (s / 2) cos s, which is smooth
  // through x = 0 (no division by s).
  static double Compute(std::span<const float> x, std::span<float> g) {
    double f = kOffset * static_cast<double>(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = x[i];
      const double s = std::sqrt(std::abs(xi));
      f -= xi * std::sin(s);
      if (!g.empty()) g[i] = static_cast<float>(-(std::sin(s) + 0.5 * s * std::cos(s)));
    }
    return f;
  }
};

}  // namespace optex::problems
