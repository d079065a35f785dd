// The device backend's proxy steps in coefficient space (coefficient_steps.hpp;
// DESIGN.md section 7): a GP step's distances from the round's anchor
// products instead of a pass over the history's points. The steps themselves
// still run on the device with the exact fp32 recurrence, so the points and
// the state are those of the direct path given the weights; only the
// weights' inputs are computed another way.
#include <algorithm>
#include <cstddef>
#include <span>
#include <variant>
#include <vector>

#include "backend/device_backend.hpp"

namespace optex::detail {

bool DeviceBackend::coefficients_apply() const {
  return sums_ == nullptr && n_ > 1 && optimizer_.count() == 1 &&
         std::holds_alternative<Sgd>(optimizer_.front());
}

void DeviceBackend::compute_anchor_products(std::size_t n) {
  fresh_.clear();
  for (std::size_t t = 0; t < n; ++t) {
    if (!pair_known_[t]) fresh_.push_back(static_cast<int>(t));
  }
  const float* m = slots_.uses(Sgd::kMomentumBuffer) ? state_.slot[Sgd::kMomentumBuffer] : nullptr;
  // One pass, or one per fresh_capacity_ renewed slots after a restore or an
  // observe() of many pairs; each pass also brings the anchor's products.
  std::size_t done = 0;
  do {
    const std::size_t count = std::min(fresh_capacity_, fresh_.size() - done);
    const std::span<const int> chunk(fresh_.data() + done, count);
    const AnchorLayout layout(n, count);
    p_->anchor_products(history_x_, history_g_, n, d_, x_, m, chunk, anchor_device_);
    p_->fetch(
        std::vector<Fetch>{fetch_of<double>(anchor_device_, anchor_host_.data(), layout.size())});
    for (std::size_t k = 0; k < count; ++k) {
      const auto t = static_cast<std::size_t>(chunk[k]);
      for (std::size_t j = 0; j < n; ++j) {
        pair_products_[t * capacity_ + j] = anchor_host_[layout.rows() + k * n + j];
        pair_products_[j * capacity_ + t] = anchor_host_[layout.cols() + k * n + j];
      }
    }
    done += count;
  } while (done < fresh_.size());
  for (const int t : fresh_) pair_known_[static_cast<std::size_t>(t)] = 1;

  const AnchorLayout layout(n, 0);
  const double* host = anchor_host_.data();
  products_.n = n;
  products_.e = host + layout.e();
  products_.f = host + layout.f();
  products_.q = host + layout.q();
  products_.h = host + layout.h();
  products_.s = host + layout.s();
  products_.r = host + layout.r();
  products_.mm = host[layout.scalars()];
  products_.am = host[layout.scalars() + 1];
  products_.aa = host[layout.scalars() + 2];
  products_.pair = pair_products_.data();
  products_.stride = capacity_;
  products_.gram = &gram_;
}

bool DeviceBackend::coefficient_distances(int p, std::size_t n) {
  if (!coefficients_wanted_) return false;
  if (p == 0) {
    coefficient_steps_taken_ = -1;
    // A verified round redoes its window first: its points are not in the span.
    if (!coefficients_apply() || work_step_ != step_ || !work_is_committed_) return false;
    compute_anchor_products(n);
    coefficient_steps_.emplace(std::get<Sgd>(optimizer_.front()), optimizer_[0].local_step(step_),
                               n);
    coefficient_steps_taken_ = 0;
  } else if (coefficient_steps_taken_ != p) {
    coefficient_steps_taken_ = -1;
    return false;
  }
  distances_host_.resize(n);
  coefficient_steps_->squared_distances(products_, distances_host_);
  p_->put(distances_host_.data(), query_distances_, n * sizeof(double));
  return true;
}

void DeviceBackend::coefficient_step(int p, std::size_t n) {
  if (coefficient_steps_taken_ != p) return;
  // The weights as the step uses them: rounded to fp32 (a wait on a device).
  double* w = weights_host_.data() + static_cast<std::size_t>(p) * capacity_;
  p_->fetch(std::vector<Fetch>{
      fetch_of<double>(weights_ + static_cast<std::size_t>(p) * capacity_, w, n)});
  rounded_weights_.resize(n);
  for (std::size_t j = 0; j < n; ++j) {
    rounded_weights_[j] = static_cast<double>(static_cast<float>(w[j]));
  }
  coefficient_steps_->step(rounded_weights_);
  ++coefficient_steps_taken_;
}

}  // namespace optex::detail
