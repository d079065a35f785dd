// The device backend's side of ask(): the fit, the proxy steps, the end of the
// batch and the chain's expansion into rows (device_backend.hpp describes the
// whole backend).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/device_backend.hpp"
#include "sharded/completed_sums.hpp"

#include "optex/estimator/gp_fit.hpp"

namespace optex::detail {

// ---- ask() ------------------------------------------------------------------------------

double DeviceBackend::fit(double lengthscale) {
  require_lengthscale(lengthscale);  // refused: the backend keeps its fit
  fitted_size_ = 0;
  refresh_gram();
  const std::size_t n = gram_.size();
  if (n == 0) return 0.0;
  // The fit GpGradientEstimator runs too (gp_fit.hpp), factorising on the
  // device: each try waits for its info code, and the host decides whether
  // to escalate the jitter.
  const GpFit fit = fit_with_jitter(
      gram_, {kernel_, noise_, scaling_}, lengthscale, covariance_,
      [this, n](const Eigen::MatrixXd& covariance) {
        int info = 0;
        p_->factor(covariance.data(), n, flags_);
        p_->fetch(std::vector<Fetch>{fetch_of<int>(flags_, &info, 1)});
        if (info < 0) {
          throw std::logic_error("device backend: the factorisation rejected argument " +
                                 std::to_string(-info));
        }
        return info;
      });
  fitted_size_ = n;
  fitted_version_ = gram_.version();
  inv_scaled_lengthscale_ = fit.inv_scaled_lengthscale;
  return fit.jitter;
}

void DeviceBackend::begin_batch(Batch& batch) {
  const BatchRows rows = rows_of(batch);
  BatchAccess::invalidate_host_copies(batch);
  p_->copy(x_, rows.points, d_);
  reset_work_state();
  work_state_is_last_ = true;
  coefficient_steps_taken_ = -1;
  std::fill(gp_rows_.begin(), gp_rows_.end(), 0);
  std::fill(variance_known_.begin(), variance_known_.end(), 0);
  std::fill(variances_host_.begin(), variances_host_.end(), kNaN);
}

void DeviceBackend::proxy_step(Batch& batch, int i, ProxySource source,
                               const HostGradient& oracle) {
  const BatchRows rows = rows_of(batch);
  if (i < 1 || i >= batch.size()) {
    throw std::out_of_range("i: proxy step " + std::to_string(i) + " is outside [1, " +
                            std::to_string(batch.size()) + ")");
  }
  const int p = i - 1;
  const float* x_in = rows.point(p, d_);
  float* x_out = rows.point(i, d_);
  float* predicted = rows.prediction(p, d_);
  switch (source) {
    case ProxySource::hold:
      p_->copy(x_in, x_out, d_);
      p_->zero(predicted, d_);
      return;
    case ProxySource::zero:
      p_->zero(predicted, d_);
      break;
    case ProxySource::newest:
      if (gram_.empty()) throw std::logic_error("device backend: no history gradient to step with");
      p_->load(history_g_.row(gram_.newest_slot(), d_), predicted, d_);
      break;
    case ProxySource::gp: {
      if (fitted_size_ == 0 || fitted_size_ != gram_.size() || fitted_version_ != gram_.version()) {
        throw std::logic_error("gp estimator: predict() needs fit() on the current history");
      }
      // weights = (K + sigma^2 I)^-1 k(X, x_p) on the device; then one pass
      // that forms the GP mean and steps with it.
      const std::size_t n = fitted_size_;
      double* w = weights_ + static_cast<std::size_t>(p) * capacity_;
      if (!coefficient_distances(p, n)) {
        const StoredRows query = fp32_rows(x_in);
        p_->squared_distances(history_x_, n, d_, {&query, 1}, query_distances_);
        complete_query_distances(n);
      }
      p_->gp_weights(query_distances_, n, kernel_, inv_scaled_lengthscale_, w, variances_ + p,
                     gp_infos_ + p);
      coefficient_step(p, n);
      StepGradient g;
      g.history = history_g_;
      g.weights = w;
      g.rows = n;
      g.sum = predicted;
      enqueue_step(g, x_in, x_out);
      gp_rows_[static_cast<std::size_t>(p)] = 1;
      return;
    }
    case ProxySource::oracle: {
      if (!oracle) throw std::logic_error("device backend: ProxySource::oracle without an oracle");
      oracle_g_.resize(d_);
      // The oracle runs on the host and needs point p (a wait on a device).
      const float* x = p_->view(x_in, d_, oracle_x_);
      oracle({x, d_}, oracle_g_);
      p_->put(oracle_g_.data(), predicted, d_ * sizeof(float));
      break;
    }
  }
  StepGradient g;
  g.row = predicted;
  enqueue_step(g, x_in, x_out);
}

void DeviceBackend::complete_query_distances(std::size_t n) {
  if (sums_ == nullptr) return;
  p_->fetch(std::vector<Fetch>{fetch_of<double>(query_distances_, query_host_.data(), n)});
  complete_sums(sums_, {query_host_.data(), n});
  // The query is a proxy point not yet checked against the bound: +inf or NaN may be honest.
  check_completed_squares({query_host_.data(), n}, "squared distances from a proxy point", true);
  p_->put(query_host_.data(), query_distances_, n * sizeof(double));
}

bool DeviceBackend::finish_batch(Batch& batch) {
  const BatchRows rows = rows_of(batch);
  // ask() hands the rows to the caller, who may read them from any stream or
  // from the host: they must be complete. The GP's weights, variances and
  // solve flags and the bound checks of the points and work state ride along
  // in one wait.
  // Without a step since begin_batch() every point is the iterate and the
  // work state the committed state: both were checked when committed.
  const bool stepped = work_step_ != step_;
  const int checks = stepped ? enqueue_within(rows.points, batch.size()) : 0;
  std::vector<Fetch> values{fetch_of<int>(flags_, flags_host_.data(), checks)};
  // Every GP step of this ask(), also one the engine cut from the chain.
  std::size_t gp_steps = 0;
  for (std::size_t r = 0; r < gp_rows_.size(); ++r) gp_steps = gp_rows_[r] ? r + 1 : gp_steps;
  if (gp_steps > 0) {
    values.push_back(fetch_of<double>(weights_, weights_host_.data(), gp_steps * capacity_));
    values.push_back(fetch_of<double>(variances_, variances_host_.data(), gp_steps));
    values.push_back(fetch_of<int>(gp_infos_, gp_infos_host_.data(), gp_steps));
  }
  p_->fetch(values);
  bool weights_finite = true;
  for (std::size_t r = 0; r < gp_steps; ++r) {
    if (!gp_rows_[r]) continue;
    if (gp_infos_host_[r] != 0) {
      throw std::logic_error("device backend: the GP solve rejected argument " +
                             std::to_string(-gp_infos_host_[r]));
    }
    variance_known_[r] = 1;
    const double* w = weights_host_.data() + r * capacity_;
    weights_finite = weights_finite &&
                     std::all_of(w, w + fitted_size_, [](double v) { return std::isfinite(v); });
  }
  // Every slice asks, whatever its own answer: the completion is a collective.
  return checked_on_every_slice(sums_, weights_finite && flags_all(checks),
                                "the GP weights finite and the points and state within bounds");
}

double DeviceBackend::posterior_variance(int row) {
  const auto r = static_cast<std::size_t>(row);
  if (r >= gp_rows_.size() || !gp_rows_[r]) return kNaN;
  if (!variance_known_[r]) {  // asked during the chain (a safeguard): a wait on a device
    p_->fetch(std::vector<Fetch>{fetch_of<double>(variances_ + r, &variances_host_[r], 1)});
    variance_known_[r] = 1;
  }
  return variances_host_[r];
}

double DeviceBackend::distance_from_iterate(Batch& batch, int i) {
  const BatchRows rows = rows_of(batch);
  const StoredRows first = fp32_rows(rows.points);
  double squared = 0.0;
  p_->squared_distances(fp32_rows(rows.point(i, d_)), 1, d_, {&first, 1}, sums_device_);
  p_->fetch(std::vector<Fetch>{fetch_of<double>(sums_device_, &squared, 1)});
  complete_sums(sums_, {&squared, 1});
  if (sums_ != nullptr) {
    check_completed_squares({&squared, 1}, "squared distances from the iterate", true);
  }
  return std::sqrt(squared);
}

// ---- several evaluations per point ----------------------------------------------------

void DeviceBackend::expand_points(Batch& chain, std::span<const int> evaluations, Batch& rows) {
  const BatchRows from = rows_of(chain);
  const BatchRows to = rows_of(rows);
  BatchAccess::invalidate_host_copies(rows);
  const std::vector<char>& was_predicted = BatchAccess::was_predicted(chain);
  std::vector<char>& out_was_predicted = BatchAccess::was_predicted(rows);
  const auto last_point = static_cast<int>(evaluations.size()) - 1;
  const int n_rows = rows.size();
  int r = 0;
  for (int p = 0; p <= last_point; ++p) {
    for (int k = 0; k < evaluations[static_cast<std::size_t>(p)]; ++k, ++r) {
      p_->copy(from.point(p, d_), to.point(r, d_), d_);
      if (r + 1 >= n_rows) continue;  // the last row has no predicted row
      if (p < last_point) {
        p_->copy(from.prediction(p, d_), to.prediction(r, d_), d_);
        out_was_predicted[static_cast<std::size_t>(r)] = was_predicted[static_cast<std::size_t>(p)];
      } else {
        p_->zero(to.prediction(r, d_), d_);
        out_was_predicted[static_cast<std::size_t>(r)] = 0;
      }
    }
  }
  BatchAccess::set_proxy_steps_applied(rows, BatchAccess::proxy_steps_applied(chain));
  p_->fetch({});  // ask() hands the rows to the caller
}

}  // namespace optex::detail
