#include "optex/batch.hpp"

#include <algorithm>

namespace optex {

void Batch::allocate(int n, std::size_t d, Device device) {
  size_ = n;
  dim_ = d;
  device_ = device;
  const auto rows = static_cast<std::size_t>(n);
  losses_.assign(rows, 0.0);
  seeds_.assign(rows, 0);
  was_predicted_.assign(rows, 0);
  point_copied_.assign(rows, 0);
  predicted_copied_.assign(rows, 0);
  gradient_staged_.assign(rows, 0);
  if (device.is_cuda()) {  // host copies are allocated on first use, at the new size
    points_.clear();
    grads_.clear();
    predicted_.clear();
    return;
  }
  points_.assign(rows * d, 0.0f);
  grads_.assign(rows * d, 0.0f);
  predicted_.assign(static_cast<std::size_t>(n > 1 ? n - 1 : 0) * d, 0.0f);
}

void Batch::allocate_host_copies() const {
  if (!points_.empty()) return;
  const auto rows = static_cast<std::size_t>(size_);
  points_.assign(rows * dim_, 0.0f);
  grads_.assign(rows * dim_, 0.0f);
  predicted_.assign(static_cast<std::size_t>(size_ > 1 ? size_ - 1 : 0) * dim_, 0.0f);
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
