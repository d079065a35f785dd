#include "optex/estimator/gp_estimator.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "optex/backend/streaming.hpp"
#include "optex/util/allocation.hpp"
#include "sharded/completed_sums.hpp"

namespace optex {

GpGradientEstimator::GpGradientEstimator(Covariance kernel, double noise, InputScaling scaling,
                                         std::size_t capacity)
    : settings_{kernel, noise, scaling} {
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
    factor_.reserve(capacity);
    distances_.resize(capacity);
    weights_.resize(capacity);
  });
}

void GpGradientEstimator::fit(const GradientHistory& history, double lengthscale) {
  require_lengthscale(lengthscale);  // refused: the estimator keeps its fit
  fitted_size_ = 0;                  // unfitted, unless the fit below succeeds
  fit_ = fit_with_jitter(
      history, settings_, lengthscale, covariance_, [this](const Eigen::MatrixXd& covariance) {
        return factor_.factor(covariance.data(), static_cast<std::size_t>(covariance.rows()));
      });
  fitted_size_ = history.size();
  fitted_version_ = history.version();
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
  variance_ = factor_.weigh({distances_.data(), n}, settings_.kernel, fit_.inv_scaled_lengthscale,
                            weights_);
}

}  // namespace optex
