// The GP's decisions, written once for every place that fits it: the
// covariance over the history, the jitter escalation of the fit, and the
// weights and posterior variance at a query. GpGradientEstimator and the
// engine's device backend (DeviceBackend::fit, and the CPU's gp_weights
// primitive) both call these; CUDA's gp_weights primitive runs the same
// formulas in its kernels (cuda/kernels.cu).
//
//   covariance   K_ij = k(||x_i - x_j|| / (scale * lengthscale)), K_ii = 1
//   fit          K + (noise + jitter) I factorised for jitter = 0, then
//                1e-10, 1e-9, ..., 1e-2; std::runtime_error when all fail
//   weights      w = (K + (noise + jitter) I)^-1 k, k_j = k(sqrt(d2_j) * inv)
//   variance     max(0, 1 - k . w), summed in j order
#pragma once

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/estimator/history_gram.hpp"

namespace optex {

// The scalar every input is divided by before the kernel sees it.
double input_scale(const HistoryGram& history, InputScaling scaling);

// out = K + diagonal I over the history (n x n, column-major), with
// K_ij = k(dist_ij / scaled_lengthscale).
void covariance_matrix(const HistoryGram& history, Covariance kernel, double scaled_lengthscale,
                       double diagonal, Eigen::MatrixXd& out);

// What a GP fit is asked for besides the history.
struct GpSettings {
  Covariance kernel = Covariance::matern52;
  double noise = 0.0;  // sigma^2 on the diagonal, in units of the prior variance
  InputScaling scaling = InputScaling::none;
};

// The outcome of fit_with_jitter().
struct GpFit {
  double scale = 1.0;                   // input_scale() of the history
  double jitter = 0.0;                  // added to the diagonal for the factor that succeeded
  double inv_scaled_lengthscale = 1.0;  // 1 / (scale * lengthscale): the query's factor
};

// Factorises an n x n covariance (column-major fp64) and keeps the factor for
// the solves that follow; returns the factorisation's info code: 0 on
// success, > 0 where the matrix is not positive definite. May throw.
using CovarianceFactor = std::function<int(const Eigen::MatrixXd& covariance)>;

// Throws std::invalid_argument naming the value unless the lengthscale is
// finite and > 0 (a zero, negative or NaN one makes every covariance NaN or
// the identity, silently). Both fits call it before they change anything.
void require_lengthscale(double lengthscale);

// Builds K + (noise + jitter) I into `covariance` and hands it to `factor`
// for jitter = 0, then 1e-10 up to 1e-2 by decades, until `factor` returns
// 0. An empty history calls nothing and returns jitter 0. Throws
// std::runtime_error naming the lengthscale, noise and history size when even
// jitter 1e-2 fails; std::invalid_argument for a lengthscale
// require_lengthscale() refuses, before `covariance` is touched; whatever
// `factor` throws passes through.
GpFit fit_with_jitter(const HistoryGram& history, const GpSettings& settings, double lengthscale,
                      Eigen::MatrixXd& covariance, const CovarianceFactor& factor);

// The host's Cholesky factor of the GP covariance and the solve for a query's
// weights and posterior variance: what GpGradientEstimator and the CPU's
// device primitives share.
class GpFactor {
 public:
  GpFactor();

  // Allocates an n x n factor up front (the identity's: size() is then n),
  // so that what does not fit fails here rather than at a later fit.
  // Throws std::bad_alloc.
  void reserve(std::size_t n);

  // Factorises the n x n column-major `covariance`; returns 0 on success, 1
  // where it is not positive definite (the info code of CovarianceFactor).
  int factor(const double* covariance, std::size_t n);
  // n of the last factor().
  std::size_t size() const { return size_; }

  // With the last factor, from the squared distances d2 of a query to the n
  // fitted points: k_j = kernel(sqrt(d2_j) * inv_scaled_lengthscale),
  // weights := (K + sigma^2 I)^-1 k (weights.size() >= n; the first n are
  // written). Returns the posterior variance max(0, 1 - k . weights) in
  // units of the prior (0 for NaN). Throws std::logic_error, writing nothing,
  // when d2 does not have the last factor's size or weights are too few.
  double weigh(std::span<const double> squared_distances, Covariance kernel,
               double inv_scaled_lengthscale, std::span<double> weights);

 private:
  Eigen::LLT<Eigen::MatrixXd> cholesky_;
  std::size_t size_ = 0;
  Eigen::VectorXd solve_;       // the kernel vector, solved in place into the weights
  std::vector<double> kernel_;  // the kernel vector, kept for the variance
};

}  // namespace optex
