// WithGradientNoise<P>: the base problem with N(0, sigma^2) noise added to every
// gradient coordinate (the loss stays exact), a stand-in for stochastic gradients.
//
// The noise is a pure function of (seed, the bytes of x): the same point gives the
// same noise whichever thread evaluates it and in whatever order, which keeps runs
// deterministic across thread counts and backends.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optex/problems/domain.hpp"
#include "optex/util/random.hpp"

namespace optex::problems {

template <TestProblem P>
class WithGradientNoise {
 public:
  WithGradientNoise(P base, double sigma, std::uint64_t seed)
      : base_(std::move(base)), sigma_(CheckedSigma(sigma)), seed_(seed) {}

  std::string_view name() const { return base_.name(); }
  double sigma() const { return sigma_; }
  std::uint64_t seed() const { return seed_; }
  const P& base() const { return base_; }

  // The exact loss: only gradients are noisy.
  double Evaluate(std::span<const float> x) const { return base_.Evaluate(x); }
  void Gradient(std::span<const float> x, std::span<float> g) const { EvaluateWithGradient(x, g); }
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    const double f = base_.EvaluateWithGradient(x, g);  // validates x and g
    AddNoise(x, g);
    return f;
  }

  Domain domain() const { return base_.domain(); }
  std::vector<float> standard_start(std::size_t d) const { return base_.standard_start(d); }
  std::vector<float> minimizer(std::size_t d) const { return base_.minimizer(d); }
  double minimum(std::size_t d) const { return base_.minimum(d); }

 private:
  static double CheckedSigma(double sigma) {
    if (!(std::isfinite(sigma) && sigma >= 0.0)) {
      throw std::invalid_argument("sigma: must be finite and >= 0, got " + std::to_string(sigma));
    }
    return sigma;
  }

  // Keyed on the raw bytes of x, so -0.0 and 0.0 are different points here.
  void AddNoise(std::span<const float> x, std::span<float> g) const {
    if (sigma_ == 0.0) return;
    const auto* bytes = reinterpret_cast<const unsigned char*>(x.data());
    SplitMix64 rng(mix_seed(seed_, fnv1a64(bytes, x.size_bytes())));
    for (float& gi : g) gi = static_cast<float>(static_cast<double>(gi) + sigma_ * rng.normal());
  }

  P base_;
  double sigma_;
  std::uint64_t seed_;
};

}  // namespace optex::problems
