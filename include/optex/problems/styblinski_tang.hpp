// Styblinski-Tang: f(x) = 0.5 sum x_i^4 - 16 x_i^2 + 5 x_i on [-5, 5]^d, minimum
// -39.16616570 d at x_i = -2.903534. Separable; each coordinate also has a worse
// local minimum near 2.7468.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class StyblinskiTang : public ProblemBase<StyblinskiTang> {
 public:
  static constexpr double kMinimizer = -2.903534;
  static constexpr double kMinimumPerCoordinate = -39.16616570;

  std::string_view name() const { return "styblinski_tang"; }
  Domain domain() const { return {-5.0, 5.0}; }

 private:
  friend class ProblemBase<StyblinskiTang>;

  // x_i = 0: between the two per-coordinate minima (-2.90 global, 2.75 local) and
  // left of the local maximum near 0.157, so the gradient (2.5 per coordinate)
  // leads into the global basin; f = 0.
  static constexpr float kStartValue = 0.0f;
  static constexpr float kMinimizerValue = static_cast<float>(kMinimizer);
  static constexpr double kMinimumPerDim = kMinimumPerCoordinate;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  static double Compute(std::span<const float> x, std::span<float> g) {
    double f = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = x[i];
      const double x2 = xi * xi;
      f += 0.5 * (x2 * x2 - 16.0 * x2 + 5.0 * xi);
      if (!g.empty()) g[i] = static_cast<float>(2.0 * x2 * xi - 16.0 * xi + 2.5);
    }
    return f;
  }
};

}  // namespace optex::problems
