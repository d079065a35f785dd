// Levy in any dimension, with w_i = 1 + (x_i - 1) / 4:
//   f(x) = sin^2(pi w_1) + sum_{i<d} (w_i - 1)^2 [1 + 10 sin^2(pi w_i + 1)]
//          + (w_d - 1)^2 [1 + sin^2(2 pi w_d)]
// on [-10, 10]^d, minimum 0 at x = 1. Multimodal, and separable: every term
// depends on one coordinate only.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>
#include <span>
#include <string_view>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Levy : public ProblemBase<Levy> {
 public:
  std::string_view name() const { return "levy"; }
  Domain domain() const { return {-10.0, 10.0}; }

 private:
  friend class ProblemBase<Levy>;

  // x_i = 4 (w_i = 1.75): off the w-lattice of the sine terms, so they all
  // contribute to the gradient; three units from the minimiser in every coordinate.
  static constexpr float kStartValue = 4.0f;
  static constexpr float kMinimizerValue = 1.0f;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  // Derivatives are taken in w and scaled by dw/dx = 1/4.
  static double Compute(std::span<const float> x, std::span<float> g) {
    constexpr double kPi = std::numbers::pi;
    const std::size_t d = x.size();
    double f = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      const double w = 1.0 + (static_cast<double>(x[i]) - 1.0) / 4.0;
      const double u = w - 1.0;
      double df_dw = 0.0;
      if (i == 0) {
        const double s = std::sin(kPi * w);
        f += s * s;
        df_dw += kPi * std::sin(2.0 * kPi * w);
      }
      if (i + 1 < d) {
        const double s = std::sin(kPi * w + 1.0);
        f += u * u * (1.0 + 10.0 * s * s);
        df_dw +=
            2.0 * u * (1.0 + 10.0 * s * s) + u * u * 10.0 * kPi * std::sin(2.0 * (kPi * w + 1.0));
      } else {  // the last coordinate has its own term
        const double s = std::sin(2.0 * kPi * w);
        f += u * u * (1.0 + s * s);
        df_dw += 2.0 * u * (1.0 + s * s) + u * u * 2.0 * kPi * std::sin(4.0 * kPi * w);
      }
      if (!g.empty()) g[i] = static_cast<float>(df_dw / 4.0);
    }
    return f;
  }
};

}  // namespace optex::problems
