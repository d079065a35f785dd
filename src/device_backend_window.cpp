// The device backend's side of the verified mode (Options::mode ==
// Mode::verified; DESIGN.md section 2, "The verified mode"): the redone steps
// that open a window, the replay that measures each guess, and the staging of
// the steps the commit keeps. Every step is enqueue_step(), the one the proxy
// steps and the commit take, so a replay repeats the base optimizer bit for bit.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "completed_sums.hpp"
#include "device_backend.hpp"

namespace optex::detail {

void DeviceBackend::redo_step(Batch& batch, int i, std::size_t slot) {
  const BatchRows rows = rows_of(batch);
  if (i < 1 || i >= batch.size() || slot >= gram_.size()) {
    throw std::out_of_range("redo_step: point " + std::to_string(i) + " from history slot " +
                            std::to_string(slot) + " is outside the batch or the history");
  }
  float* predicted = rows.prediction(i - 1, d_);
  p_->load(history_g_.row(slot, d_), predicted, d_);
  StepGradient g;
  g.row = predicted;
  enqueue_step(g, rows.point(i - 1, d_), rows.point(i, d_));
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
  for (int j = 0; j < count; ++j) {
    StepGradient g;
    g.row = rows.grad(j, d_);
    enqueue_step(g, from, next_x_);
    from = next_x_;
  }
  return check_staged();
}

}  // namespace optex::detail
