// The device backend's side of the verified mode (Options::mode ==
// Mode::verified; DESIGN.md section 2, "The verified mode"): the redone steps
// that open a window, the replay that measures each guess, and the staging of
// the steps the commit keeps. Every step is enqueue_step(), the one the proxy
// steps and the commit take, so a replay repeats the base optimizer bit for bit.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/device_backend.hpp"
#include "sharded/completed_sums.hpp"

namespace optex::detail {

void DeviceBackend::redo_step(Batch& batch, int i, std::size_t slot, bool gp_correction) {
  const BatchRows rows = rows_of(batch);
  if (i < 1 || i >= batch.size() || slot >= gram_.size()) {
    throw std::out_of_range("redo_step: point " + std::to_string(i) + " from history slot " +
                            std::to_string(slot) + " is outside the batch or the history");
  }
  const int p = i - 1;
  const float* x_in = rows.point(p, d_);
  float* predicted = rows.prediction(p, d_);
  const bool fitted =
      fitted_size_ != 0 && fitted_size_ == gram_.size() && fitted_version_ == gram_.version();
  if (!gp_correction || !fitted) {  // the measured gradient as it is
    p_->load(history_g_.row(slot, d_), predicted, d_);
    StepGradient g;
    g.row = predicted;
    enqueue_step(g, x_in, rows.point(i, d_));
    return;
  }
  // The measured gradient g_s at the old guess x_s, corrected to the new point by the
  // GP: g_s + mu(x_in) - mu(x_s), one weighted sum of the history gradients with the
  // weights w(x_in) - w(x_s) + e_s. Where the guess has converged (x_in == x_s) the two
  // weight vectors are the same bits, and the step is g_s's exactly.
  const std::size_t n = fitted_size_;
  double* w = weights_ + static_cast<std::size_t>(p) * capacity_;
  const auto weights_at = [&](StoredRows query, std::vector<double>& host) {
    p_->squared_distances(history_x_, n, d_, {&query, 1}, query_distances_);
    complete_query_distances(n);
    p_->gp_weights(query_distances_, n, kernel_, inv_scaled_lengthscale_, w, variances_ + p,
                   gp_infos_ + p);
    host.resize(n);
    p_->fetch(std::vector<Fetch>{fetch_of<double>(w, host.data(), n)});
  };
  weights_at(history_x_.row(slot, d_), redo_old_host_);
  weights_at(fp32_rows(x_in), redo_weights_host_);  // its variance and flag stay the row's
  for (std::size_t j = 0; j < n; ++j) redo_weights_host_[j] -= redo_old_host_[j];
  redo_weights_host_[slot] += 1.0;
  p_->put(redo_weights_host_.data(), w, n * sizeof(double));
  StepGradient g;
  g.history = history_g_;
  g.weights = w;
  g.rows = n;
  g.sum = predicted;
  enqueue_step(g, x_in, rows.point(i, d_));
  gp_rows_[static_cast<std::size_t>(p)] = 1;
}

std::vector<double> DeviceBackend::window_disagreements(Batch& batch, int count) {
  const BatchRows rows = rows_of(batch);
  reset_work_state();
  work_state_is_last_ = false;
  const float* from = x_;
  for (int j = 0; j + 1 < count; ++j) {
    StepGradient g;
    g.row = rows.grad(j, d_);
    enqueue_step(g, from, next_x_);  // in place from the second step on
    from = next_x_;
    const StoredRows guess = fp32_rows(rows.point(j + 1, d_));
    p_->squared_distances(fp32_rows(next_x_), 1, d_, {&guess, 1},
                          sums_device_ + 2 * static_cast<std::size_t>(j));
    p_->dot(next_x_, next_x_, d_, sums_device_ + 2 * static_cast<std::size_t>(j) + 1);
  }
  std::vector<double> sums(count > 1 ? 2 * static_cast<std::size_t>(count - 1) : 0);
  if (!sums.empty()) {
    p_->fetch(std::vector<Fetch>{fetch_of<double>(sums_device_, sums.data(), sums.size())});
    complete_sums(sums_, sums);
  }
  return sums;
}

bool DeviceBackend::stage_steps(Batch& batch, int count) {
  const BatchRows rows = rows_of(batch);
  reset_work_state();
  work_state_is_last_ = false;
  const float* from = x_;
  staged_norm_row_ = -1;
  staged_length_ = false;
  for (int j = 0; j < count; ++j) {
    StepGradient g;
    g.row = rows.grad(j, d_);
    // The last step's own pass checks the staged iterate and state.
    enqueue_step(g, from, next_x_, j + 1 == count ? staged_checks() : StepChecks{});
    from = next_x_;
  }
  return check_staged(count > 0);
}

}  // namespace optex::detail
