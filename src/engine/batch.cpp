#include "optex/engine/batch.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "optex/util/allocation.hpp"

namespace optex {

namespace {

// The host rows of a batch, zeroed: points and gradients (n each), predictions (n - 1).
void allocate_rows(int n, std::size_t d, std::vector<float>& points, std::vector<float>& grads,
                   std::vector<float>& predicted) {
  const auto rows = static_cast<std::size_t>(n);
  const std::size_t predicted_rows = rows > 1 ? rows - 1 : 0;
  const std::string what =
      "batch: parallelism " + std::to_string(n) + " at dimension " + std::to_string(d);
  const char* contents = "fp32 points, gradients and predicted gradients";
  const std::size_t bytes =
      detail::checked_bytes(what, contents, {2 * rows + predicted_rows, d}, sizeof(float));
  // All or nothing: a failure leaves the rows as they were.
  detail::allocate_or_explain(what, contents, bytes, [&] {
    std::vector<float> new_points(rows * d), new_grads(rows * d), new_predicted(predicted_rows * d);
    points.swap(new_points);
    grads.swap(new_grads);
    predicted.swap(new_predicted);
  });
}

}  // namespace

void Batch::allocate(int n, std::size_t d, Device device) {
  const auto rows = static_cast<std::size_t>(n);
  if (!device.is_cuda()) {
    allocate_rows(n, d, points_, grads_, predicted_);
  } else {  // host copies are allocated on first use, at the new size
    points_.clear();
    grads_.clear();
    predicted_.clear();
  }
  size_ = n;
  dim_ = d;
  device_ = device;
  losses_.assign(rows, 0.0);
  seeds_.assign(rows, 0);
  was_predicted_.assign(rows, 0);
  point_copied_.assign(rows, 0);
  predicted_copied_.assign(rows, 0);
  gradient_staged_.assign(rows, 0);
}

void Batch::allocate_host_copies() const {
  if (!points_.empty()) return;
  allocate_rows(size_, dim_, points_, grads_, predicted_);
}

void Batch::host_point_rows(int begin, int end) const {
  if (begin < end) check(begin), check(end - 1);
  std::lock_guard lock(host_mutex_.mutex);
  allocate_host_copies();
  // One copy per run of stale rows: points() costs one synchronisation, not N.
  for (auto row = static_cast<std::size_t>(begin); row < static_cast<std::size_t>(end);) {
    if (point_copied_[row]) {
      ++row;
      continue;
    }
    std::size_t last = row + 1;
    while (last < static_cast<std::size_t>(end) && !point_copied_[last]) ++last;
    device_rows_->download(device_points_ + row * dim_, points_.data() + row * dim_,
                           (last - row) * dim_);
    std::fill(point_copied_.begin() + static_cast<std::ptrdiff_t>(row),
              point_copied_.begin() + static_cast<std::ptrdiff_t>(last), 1);
    row = last;
  }
}

void Batch::stage_gradient_rows(int begin, int end) {
  if (begin < end) check(begin), check(end - 1);
  std::lock_guard lock(host_mutex_.mutex);
  allocate_host_copies();
  for (int i = begin; i < end; ++i) gradient_staged_[static_cast<std::size_t>(i)] = 1;
}

void Batch::host_gradient_row(int i) const {
  const auto row = static_cast<std::size_t>(check(i));
  std::lock_guard lock(host_mutex_.mutex);
  allocate_host_copies();
  // Not cached: the caller's kernels may write the device row at any time.
  if (gradient_staged_[row]) return;
  device_rows_->download(device_grads_ + row * dim_, grads_.data() + row * dim_, dim_);
}

void Batch::host_predicted_row(int i) const {
  const auto row = static_cast<std::size_t>(i);
  std::lock_guard lock(host_mutex_.mutex);
  allocate_host_copies();
  if (predicted_copied_[row]) return;
  device_rows_->download(device_predicted_ + row * dim_, predicted_.data() + row * dim_, dim_);
  predicted_copied_[row] = 1;
}

void Batch::upload_staged_gradients() {
  if (!on_device()) return;
  std::lock_guard lock(host_mutex_.mutex);
  const auto n = static_cast<std::size_t>(size_);
  for (std::size_t r = 0; r < gradient_staged_.size() && r < n;) {
    if (!gradient_staged_[r]) {
      ++r;
      continue;
    }
    std::size_t end = r + 1;  // one copy per run of staged rows
    while (end < n && gradient_staged_[end]) ++end;
    device_rows_->upload(grads_.data() + r * dim_, device_grads_ + r * dim_, (end - r) * dim_);
    std::fill(gradient_staged_.begin() + static_cast<std::ptrdiff_t>(r),
              gradient_staged_.begin() + static_cast<std::ptrdiff_t>(end), 0);
    r = end;
  }
}

void Batch::invalidate_host_copies() {
  std::fill(point_copied_.begin(), point_copied_.end(), 0);
  std::fill(predicted_copied_.begin(), predicted_copied_.end(), 0);
  std::fill(gradient_staged_.begin(), gradient_staged_.end(), 0);
}

}  // namespace optex
