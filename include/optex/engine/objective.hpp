// What minimize() accepts as an objective, following ensmallen's function
// concepts, with float32 parameters:
//   double EvaluateWithGradient(std::span<const float> x, std::span<float> g);  // preferred
//   double Evaluate(std::span<const float> x);  plus  void Gradient(x, g);
//   or any callable f(x, g) -> double, such as a lambda.
// A stochastic objective may also take the seed of its minibatch (or episodes):
//   double EvaluateWithGradient(x, g, std::uint64_t seed);  or  f(x, g, seed).
// minimize() calls the objective from several threads at once, on different
// points: it must be safe to call concurrently (a const member function that
// touches no shared mutable state is).
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

namespace optex {

template <class F>
concept HasEvaluateWithGradient = requires(F& f, std::span<const float> x, std::span<float> g) {
  { f.EvaluateWithGradient(x, g) } -> std::convertible_to<double>;
};

template <class F>
concept HasEvaluateAndGradient = requires(F& f, std::span<const float> x, std::span<float> g) {
  { f.Evaluate(x) } -> std::convertible_to<double>;
  f.Gradient(x, g);
};

template <class F>
concept CallableObjective =
    std::is_invocable_r_v<double, F&, std::span<const float>, std::span<float>>;

template <class F>
concept Objective = HasEvaluateWithGradient<F> || HasEvaluateAndGradient<F> || CallableObjective<F>;

// Loss at x, gradient into g, whichever form the objective has.
template <class F>
double evaluate_with_gradient(F& f, std::span<const float> x, std::span<float> g) {
  static_assert(Objective<F>,
                "optex: the objective needs `double EvaluateWithGradient(std::span<const float> x, "
                "std::span<float> g)`, or `double Evaluate(std::span<const float> x)` together "
                "with `void Gradient(std::span<const float> x, std::span<float> g)`, or must be "
                "callable as `double f(std::span<const float> x, std::span<float> g)`");
  if constexpr (HasEvaluateWithGradient<F>) {
    return static_cast<double>(f.EvaluateWithGradient(x, g));
  } else if constexpr (HasEvaluateAndGradient<F>) {
    f.Gradient(x, g);
    return static_cast<double>(f.Evaluate(x));
  } else {
    return static_cast<double>(f(x, g));
  }
}

template <class F>
concept SeededObjective = requires(F& f, std::span<const float> x, std::span<float> g,
                                   std::uint64_t seed) {
  { f.EvaluateWithGradient(x, g, seed) } -> std::convertible_to<double>;
}
|| std::is_invocable_r_v<double, F&, std::span<const float>, std::span<float>, std::uint64_t>;

// Loss at x, gradient into g, with `seed` choosing the minibatch when the
// objective takes one (otherwise the seed is not used).
template <class F>
double evaluate_with_gradient(F& f, std::span<const float> x, std::span<float> g,
                              std::uint64_t seed) {
  if constexpr (requires { f.EvaluateWithGradient(x, g, seed); }) {
    return static_cast<double>(f.EvaluateWithGradient(x, g, seed));
  } else if constexpr (std::is_invocable_r_v<double, F&, std::span<const float>, std::span<float>,
                                             std::uint64_t>) {
    return static_cast<double>(f(x, g, seed));
  } else {
    return evaluate_with_gradient(f, x, g);
  }
}

}  // namespace optex
