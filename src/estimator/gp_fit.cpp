#include "optex/estimator/gp_fit.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

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

void require_lengthscale(double lengthscale) {
  if (!std::isfinite(lengthscale) || lengthscale <= 0.0) {
    std::ostringstream msg;
    msg << "lengthscale: must be finite and > 0, got " << lengthscale;
    throw std::invalid_argument(msg.str());
  }
}

GpFit fit_with_jitter(const HistoryGram& history, const GpSettings& settings, double lengthscale,
                      Eigen::MatrixXd& covariance, const CovarianceFactor& factor) {
  require_lengthscale(lengthscale);
  GpFit fit;
  fit.scale = input_scale(history, settings.scaling);
  fit.inv_scaled_lengthscale = 1.0 / (fit.scale * lengthscale);
  if (history.empty()) return fit;
  // A near-duplicate point makes K singular to rounding: a little jitter on
  // the diagonal, the least that factorises, rescues it.
  for (double jitter = 0.0; jitter <= 1e-2; jitter = jitter == 0.0 ? 1e-10 : jitter * 10.0) {
    covariance_matrix(history, settings.kernel, fit.scale * lengthscale, settings.noise + jitter,
                      covariance);
    if (factor(covariance) == 0) {
      fit.jitter = jitter;
      return fit;
    }
  }
  std::ostringstream msg;
  msg << "gp estimator: Cholesky failed even with jitter 1e-2 (lengthscale " << lengthscale
      << ", noise " << settings.noise << ", history " << history.size() << ")";
  throw std::runtime_error(msg.str());
}

GpFactor::GpFactor() {
  // Eigen leaves an unfactorised LLT's status uninitialised, which copying or
  // moving it would read (undefined behaviour): factorise the empty matrix.
  cholesky_.compute(Eigen::MatrixXd(0, 0));
}

void GpFactor::reserve(std::size_t n) {
  const auto size = static_cast<Eigen::Index>(n);
  cholesky_.compute(Eigen::MatrixXd::Identity(size, size));
  size_ = n;
  if (solve_.size() < size) solve_.resize(size);
  kernel_.reserve(n);
}

int GpFactor::factor(const double* covariance, std::size_t n) {
  const auto size = static_cast<Eigen::Index>(n);
  cholesky_.compute(Eigen::Map<const Eigen::MatrixXd>(covariance, size, size));
  size_ = n;
  return cholesky_.info() == Eigen::Success ? 0 : 1;
}

double GpFactor::weigh(std::span<const double> squared_distances, Covariance kernel,
                       double inv_scaled_lengthscale, std::span<double> weights) {
  const std::size_t n = squared_distances.size();
  if (n != size_ || weights.size() < n) {
    throw std::logic_error("gp weights: " + std::to_string(n) + " distances and " +
                           std::to_string(weights.size()) + " weights for a factor of " +
                           std::to_string(size_) + " points");
  }
  const auto size = static_cast<Eigen::Index>(n);
  if (solve_.size() < size) solve_.resize(size);
  kernel_.resize(n);
  // The solve runs in solve_ (Eigen's alignment, whatever weights' is): the
  // same bits wherever the weights go.
  auto k = solve_.head(size);
  for (std::size_t j = 0; j < n; ++j) {
    kernel_[j] = covariance_value(kernel, std::sqrt(squared_distances[j]) * inv_scaled_lengthscale);
    k[static_cast<Eigen::Index>(j)] = kernel_[j];
  }
  cholesky_.solveInPlace(k);  // weights = (K + sigma^2 I)^-1 k(X, x)
  double explained = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    weights[j] = k[static_cast<Eigen::Index>(j)];
    explained += kernel_[j] * weights[j];
  }
  // Round-off may take it a hair below zero at a history point; the variance
  // is not negative (and std::max(0.0, NaN) is 0, as the CUDA kernel has it).
  return std::max(0.0, 1.0 - explained);
}

}  // namespace optex
