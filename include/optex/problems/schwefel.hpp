// Schwefel 2.26: f(x) = 418.9828872724338 d - sum x_i sin(sqrt(|x_i|)) on
// [-500, 500]^d, minimum 0 at x_i = 420.968746 (the SFU convention, shifted so
// that f* = 0; not the unshifted variant whose minimum is -418.98 d).
// Separable and deceptive: the best local minima lie far from each other.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"

namespace optex::problems {

class Schwefel {
 public:
  static constexpr double kOffset = 418.9828872724338;
  static constexpr double kMinimizer = 420.968746;

  std::string_view name() const { return "schwefel"; }

  double Evaluate(std::span<const float> x) const {
    detail::check_dimension("x", x.size());
    return Compute(x, {});
  }
  void Gradient(std::span<const float> x, std::span<float> g) const { EvaluateWithGradient(x, g); }
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    detail::check_dimension("x", x.size());
    detail::check_gradient(x, g);
    return Compute(x, g);
  }

  Domain domain() const { return {-500.0, 500.0}; }

  // x_i = 100: inside the box and away from 0 (where the gradient vanishes); the
  // gradient there is about 4.7 per coordinate.
  std::vector<float> standard_start(std::size_t d) const {
    detail::check_dimension("d", d);
    return std::vector<float>(d, 100.0f);
  }
  std::vector<float> minimizer(std::size_t d) const {
    detail::check_dimension("d", d);
    return std::vector<float>(d, static_cast<float>(kMinimizer));
  }
  double minimum(std::size_t d) const {
    detail::check_dimension("d", d);
    return 0.0;
  }

 private:
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
