// Sphere: f(x) = sum x_i^2 on [-5.12, 5.12]^d, minimum 0 at x = 0. Convex and
// separable: the sanity check every optimizer must pass.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"

namespace optex::problems {

class Sphere {
 public:
  std::string_view name() const { return "sphere"; }

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

  Domain domain() const { return {-5.12, 5.12}; }

  // x_i = 1: the scale of the OptEx authors' U(-1, 1) starts; f = d, gradient 2 everywhere.
  std::vector<float> standard_start(std::size_t d) const {
    detail::check_dimension("d", d);
    return std::vector<float>(d, 1.0f);
  }
  std::vector<float> minimizer(std::size_t d) const {
    detail::check_dimension("d", d);
    return std::vector<float>(d, 0.0f);
  }
  double minimum(std::size_t d) const {
    detail::check_dimension("d", d);
    return 0.0;
  }

 private:
  // f and, when g is non-empty, its gradient. All three public entry points come
  // here, so EvaluateWithGradient agrees bit for bit with Evaluate + Gradient.
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
