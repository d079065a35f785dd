// The entry points every shipped test problem shares, written once: a problem
// derives from ProblemBase<Itself> (CRTP) and supplies only its formula and constants.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"

namespace optex::problems {

// Provides Evaluate, Gradient, EvaluateWithGradient, standard_start, minimizer and
// minimum, with the input checks, for a Derived that declares (privately, with
// `friend class ProblemBase<Derived>;`):
//   double Compute(std::span<const float> x, std::span<float> g) [const, or static];
//       f at x and, when g is non-empty, its gradient written to g (a member when
//       the formula has parameters, such as Ellipsoid's kappa). All three
//       evaluation entry points come here, so EvaluateWithGradient agrees bit for
//       bit with Evaluate + Gradient.
//   static constexpr float kStartValue;      every x_i of standard_start(d)
//   static constexpr float kMinimizerValue;  every x_i of minimizer(d)
// and optionally overrides the defaults below by declaring the same names. A
// Derived may also hide standard_start with its own (calling CheckDim("d", d)).
// Derived still provides name() and domain() itself.
template <class Derived>
class ProblemBase {
 public:
  double Evaluate(std::span<const float> x) const {
    CheckDim("x", x.size());
    return self().Compute(x, {});
  }
  void Gradient(std::span<const float> x, std::span<float> g) const { EvaluateWithGradient(x, g); }
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    CheckDim("x", x.size());
    detail::check_gradient(x, g);
    return self().Compute(x, g);
  }

  std::vector<float> standard_start(std::size_t d) const {
    CheckDim("d", d);
    return std::vector<float>(d, Derived::kStartValue);
  }
  std::vector<float> minimizer(std::size_t d) const {
    CheckDim("d", d);
    return std::vector<float>(d, Derived::kMinimizerValue);
  }
  double minimum(std::size_t d) const {
    CheckDim("d", d);
    return Derived::kMinimumPerDim * static_cast<double>(d);
  }

 protected:
  const Derived& self() const { return static_cast<const Derived&>(*this); }

  // Defaults, overridable in Derived: the smallest dimension accepted, and why (put
  // in the error message when non-empty); the minimum value per coordinate, so that
  // minimum(d) = kMinimumPerDim * d.
  static constexpr std::size_t kMinDimension = 1;
  static constexpr std::string_view kMinDimensionReason = {};
  static constexpr double kMinimumPerDim = 0.0;

  // Throws unless d >= Derived::kMinDimension; `param` names the argument.
  static void CheckDim(std::string_view param, std::size_t d) {
    detail::check_dimension(param, d, Derived::kMinDimension, Derived::kMinDimensionReason);
  }
};

}  // namespace optex::problems
