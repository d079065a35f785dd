// Sphere: f(x) = sum x_i^2 on [-5.12, 5.12]^d, minimum 0 at x = 0. Convex and
// separable: the sanity check every optimizer must pass.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"

namespace optex::problems {

class Sphere : public ProblemBase<Sphere> {
 public:
  std::string_view name() const { return "sphere"; }
  Domain domain() const { return {-5.12, 5.12}; }

 private:
  friend class ProblemBase<Sphere>;

  // x_i = 1: the scale of the OptEx authors' U(-1, 1) starts; f = d, gradient 2 everywhere.
  static constexpr float kStartValue = 1.0f;
  static constexpr float kMinimizerValue = 0.0f;

  // f and, when g is non-empty, its gradient (one code path for all entry points).
  static double Compute(std::span<const float> x, std::span<float> g) {
    double f = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = x[i];
      f += xi * xi;
      if (!g.empty()) g[i] = static_cast<float>(2.0 * xi);
    }
    return f;
  }
};

}  // namespace optex::problems
