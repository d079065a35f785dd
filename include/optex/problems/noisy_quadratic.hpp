// NoisyQuadratic: the noisy quadratic model of batch-size studies (Zhang et al. 2019,
// "Which algorithmic choices matter at which batch sizes?"). The loss is the
// noise-free f(x) = 1/2 sum_i h_i x_i^2 with curvatures h_i = 1/i (i = 1..d), minimum 0
// at x = 0; a gradient is g_i = h_i x_i + sigma sqrt(h_i) xi_i, xi ~ N(0, 1): its noise
// covariance sigma^2 H has the shape a minibatch gradient's has near a minimum, and
// the mean of B evaluations divides it by B.
//
// The noise comes from the problem's seed together with either the bytes of x (the
// TestProblem entry points: the same point gives the same noise, as with
// WithGradientNoise) or an evaluation's own seed (the three-argument
// EvaluateWithGradient, which minimize() calls with Batch::seed: every evaluation a
// fresh minibatch, even of the same point).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "optex/problems/domain.hpp"
#include "optex/problems/problem_base.hpp"
#include "optex/util/random.hpp"

namespace optex::problems {

class NoisyQuadratic : public ProblemBase<NoisyQuadratic> {
 public:
  // sigma = 1: the noise covariance is H itself, the model's usual scale.
  explicit NoisyQuadratic(double sigma = 1.0, std::uint64_t seed = 0)
      : sigma_(CheckedSigma(sigma)), seed_(seed) {}

  std::string_view name() const { return "noisy_quadratic"; }
  double sigma() const { return sigma_; }
  std::uint64_t seed() const { return seed_; }
  // The box optex-bench's starts are drawn from; a quadratic has no natural one.
  Domain domain() const { return {-1.0, 1.0}; }

  // h_i = 1 / (i + 1) for the 0-based coordinate i.
  static double curvature(std::size_t i) { return 1.0 / static_cast<double>(i + 1); }

  // Evaluate (from ProblemBase) is the exact loss: only gradients are noisy.
  void Gradient(std::span<const float> x, std::span<float> g) const { EvaluateWithGradient(x, g); }
  // Noise keyed on (seed, the bytes of x); -0.0 and 0.0 are different points here.
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    CheckPointAndGradient(x, g);
    const auto* bytes = reinterpret_cast<const unsigned char*>(x.data());
    return Compute(x, g, mix_seed(seed_, fnv1a64(bytes, x.size_bytes())));
  }
  // Noise keyed on (seed, evaluation_seed) alone: one minibatch per evaluation seed.
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g,
                              std::uint64_t evaluation_seed) const {
    CheckPointAndGradient(x, g);
    return Compute(x, g, mix_seed(seed_, evaluation_seed));
  }

 private:
  friend class ProblemBase<NoisyQuadratic>;
  // standard_start: every x_i = 1, so f = (1/2) sum 1/i and the expected gradient is
  // the curvatures; the minimizer is the origin, the minimum 0.
  static constexpr float kStartValue = 1.0f;
  static constexpr float kMinimizerValue = 0.0f;

  static double CheckedSigma(double sigma) {
    if (!(std::isfinite(sigma) && sigma >= 0.0)) {
      throw std::invalid_argument("sigma: must be finite and >= 0, got " + std::to_string(sigma));
    }
    return sigma;
  }

  static void CheckPointAndGradient(std::span<const float> x, std::span<float> g) {
    detail::check_dimension("x", x.size());
    detail::check_gradient(x, g);
  }

  // f and, when g is non-empty, the gradient with noise drawn from `noise_stream`.
  double Compute(std::span<const float> x, std::span<float> g,
                 std::uint64_t noise_stream = 0) const {
    SplitMix64 rng(noise_stream);
    double f = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double h = curvature(i);
      const double xi = x[i];
      f += 0.5 * h * xi * xi;
      if (g.empty()) continue;
      const double noise = sigma_ == 0.0 ? 0.0 : sigma_ * std::sqrt(h) * rng.normal();
      g[i] = static_cast<float>(h * xi + noise);
    }
    return f;
  }

  double sigma_;
  std::uint64_t seed_;
};

}  // namespace optex::problems
