#include "optex/estimator/gp_estimator.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "optex/backend/streaming.hpp"
#include "optex/util/allocation.hpp"
#include "sharded/completed_sums.hpp"

namespace optex {

double input_scale(const HistoryGram& history, InputScaling scaling) {
  if (scaling == InputScaling::none || history.empty()) return 1.0;
  // The authors' code: mean over history of sqrt(||x_j||).
  double sum = 0.0;
  for (std::size_t j = 0; j < history.size(); ++j)
    sum += std::sqrt(std::sqrt(history.squared_norm(j)));
  const double scale = sum / static_cast<double>(history.size());
  return scale > 0.0 ? scale : 1.0;  // every point at the origin: nothing to scale
}

void covariance_matrix(const HistoryGram& history, Covariance kernel, double scaled_lengthscale,
                       double diagonal, Eigen::MatrixXd& out) {
  const auto n = static_cast<Eigen::Index>(history.size());
  out.resize(n, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    out(i, i) = 1.0 + diagonal;
    for (Eigen::Index j = 0; j < i; ++j) {
      const double r = std::sqrt(history.squared_distance(static_cast<std::size_t>(i),
                                                          static_cast<std::size_t>(j))) /
                       scaled_lengthscale;
      out(i, j) = out(j, i) = covariance_value(kernel, r);
    }
  }
}

GpGradientEstimator::GpGradientEstimator(Covariance kernel, double noise, InputScaling scaling,
                                         std::size_t capacity)
    : kernel_(kernel), noise_(noise), scaling_(scaling) {
  if (!std::isfinite(noise) || noise < 0.0) {
    throw std::invalid_argument("noise: must be finite and >= 0, got " + std::to_string(noise));
  }
  const std::string what = "estimator: history capacity " + std::to_string(capacity);
  const char* contents = "fp64 covariance and its Cholesky factor";
  const std::size_t bytes =
      detail::checked_bytes(what, contents, {2, capacity, capacity}, sizeof(double));
  const auto n = static_cast<Eigen::Index>(capacity);
  detail::allocate_or_explain(what, contents, bytes, [&] {
    covariance_.resize(n, n);
    distances_.resize(capacity);
    weights_.resize(n);
    // Eigen leaves an unfactorised LLT's status uninitialised, which moving the
    // estimator would copy (undefined behaviour): factorise a harmless identity.
    cholesky_.compute(Eigen::MatrixXd::Identity(n, n));
  });
}

void GpGradientEstimator::fit(const GradientHistory& history, double lengthscale) {
  lengthscale_ = lengthscale;
  scale_ = input_scale(history, scaling_);
  fitted_size_ = history.size();
  fitted_version_ = history.version();
  if (fitted_size_ == 0) return;
  for (double jitter = 0.0; jitter <= 1e-2; jitter = jitter == 0.0 ? 1e-10 : jitter * 10.0) {
    covariance_matrix(history, kernel_, scale_ * lengthscale_, noise_ + jitter, covariance_);
    cholesky_.compute(covariance_);
    if (cholesky_.info() == Eigen::Success) {
      jitter_ = jitter;
      return;
    }
  }
  fitted_size_ = 0;
  std::ostringstream msg;
  msg << "gp estimator: Cholesky failed even with jitter 1e-2 (lengthscale " << lengthscale
      << ", noise " << noise_ << ", history " << history.size() << ")";
  throw std::runtime_error(msg.str());
}

void GpGradientEstimator::predict(const GradientHistory& history, std::span<const float> x,
                                  std::span<float> out, const BlockPool& pool) {
  weigh(history, x, pool);
  // Pass 2 over G: the weighted sum of history gradients.
  streaming::weighted_sum(pool, history.gradients_data(), fitted_size_, history.dim(),
                          weights_.data(), out.data());
}

void GpGradientEstimator::weigh(const GradientHistory& history, std::span<const float> x,
                                const BlockPool& pool, ShardSums* sums) {
  const std::size_t n = fitted_size_;
  const std::size_t d = history.dim();
  if (n == 0 || n != history.size() || fitted_version_ != history.version()) {
    throw std::logic_error("gp estimator: predict() and weigh() need fit() on the current history");
  }
  // Pass 1 over X: distances to every history point, then the kernel vector.
  const float* query = x.data();
  streaming::squared_distances(pool, history.points_data(), n, d, {&query, 1}, distances_.data());
  complete_sums(sums, {distances_.data(), n});
  // A query not checked against the bound may honestly be +inf or NaN away.
  if (sums != nullptr) {
    detail::check_completed_squares({distances_.data(), n}, "squared distances from the query",
                                    true);
  }
  const double inv = 1.0 / (scale_ * lengthscale_);
  auto k = weights_.head(static_cast<Eigen::Index>(n));
  for (std::size_t j = 0; j < n; ++j) {
    k[static_cast<Eigen::Index>(j)] = covariance_value(kernel_, std::sqrt(distances_[j]) * inv);
  }
  // The kernel vector is kept for the posterior variance: 1 - k^T (K + sigma^2 I)^-1 k.
  std::copy(k.data(), k.data() + n, distances_.begin());
  cholesky_.solveInPlace(k);  // weights = (K + sigma^2 I)^-1 k(X, x)
  double explained = 0.0;
  for (std::size_t j = 0; j < n; ++j) explained += distances_[j] * k[static_cast<Eigen::Index>(j)];
  // Round-off may take it a hair below zero at a history point; the variance is not negative.
  variance_ = std::max(0.0, 1.0 - explained);
}

}  // namespace optex
