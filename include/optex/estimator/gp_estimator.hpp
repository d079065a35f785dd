// The GP-mean gradient estimator: mu(x) = G^T (K + sigma^2 I)^-1 k(X, x).
//
// The GP treats the d gradient coordinates as independent outputs that share
// one kernel over the history points, so mu(x) is a weighted sum of history
// gradients with weights from a T0 x T0 Cholesky solve. The factor is kept;
// no inverse is formed.
//
// A host-side convenience over the GP pieces the engine runs too
// (gp_fit.hpp): the same covariance, jitter escalation, weights and variance,
// so its weights and variance are the engine's on the CPU, bit for bit.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/estimator/gp_fit.hpp"
#include "optex/estimator/gradient_history.hpp"

namespace optex {

class GpGradientEstimator {
 public:
  // Throws std::invalid_argument for a negative or non-finite noise.
  GpGradientEstimator(Covariance kernel, double noise, InputScaling scaling, std::size_t capacity);

  // Factorises the covariance of the current history (fit_with_jitter):
  // jitter escalates by decades from 0 up to 1e-2 while the factorisation
  // reports a non-positive pivot; beyond that it throws std::runtime_error
  // and the estimator is left unfitted. A lengthscale that is not finite and
  // > 0 throws std::invalid_argument and leaves the current fit as it was.
  void fit(const GradientHistory& history, double lengthscale);

  // Writes mu(x) into out (size dim). Requires fit() on this same history.
  // Its two passes over the history run on the pool's threads.
  void predict(const GradientHistory& history, std::span<const float> x, std::span<float> out,
               const BlockPool& pool = BlockPool::serial());

  // predict() without its last pass: the distances to x, the kernel vector,
  // the weights and the variance, leaving mu = sum_j weights()[j] * g_j to
  // the caller (streaming::weighted_sum, or a pass that fuses it). Requires
  // fit() on this same history. With `sums` the history holds one slice of
  // the coordinates and x the same slice: the distances are completed across
  // the slices (coordinate_shard.hpp), so every slice gets the same weights.
  void weigh(const GradientHistory& history, std::span<const float> x,
             const BlockPool& pool = BlockPool::serial(), ShardSums* sums = nullptr);

  // The weights of the last predict() or weigh(): mu = sum_j weights[j] * g_j.
  std::span<const double> weights() const { return {weights_.data(), fitted_size_}; }
  // The GP posterior variance at the x of the last predict() or weigh(), in units of the
  // prior variance k(x, x) = 1: about `noise` at a history point, 1 far from all.
  double variance() const { return variance_; }
  double jitter() const { return fit_.jitter; }
  double scale() const { return fit_.scale; }
  std::size_t fitted_size() const { return fitted_size_; }

 private:
  GpSettings settings_;
  GpFit fit_;
  double variance_ = 0.0;
  std::size_t fitted_size_ = 0;
  std::uint64_t fitted_version_ = 0;  // GradientHistory::version() at the last fit
  Eigen::MatrixXd covariance_;
  GpFactor factor_;
  std::vector<double> distances_;  // squared distances from the query
  std::vector<double> weights_;
};

}  // namespace optex
