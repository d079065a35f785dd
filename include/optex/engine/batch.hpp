// The N points of one OptEx iteration, handed out by Engine::ask().
//
// The caller evaluates each point (in any order, on any worker) and writes its
// gradient and loss here; Engine::tell() then commits. The batch belongs to
// the engine that made it and stays valid until the next ask().
//
// On a CUDA engine (Options::device = Device::cuda(k)) the rows live in device
// memory: device_point(i) and device_grad(i) are device pointers, and nothing
// of size d crosses to the host unless asked for. The host views still work,
// as copies: point(i), points() and predicted_gradient(i) copy from the
// device on first use, and grad(i) / grads() / set_gradient() hand out host
// staging rows that tell() uploads. Write a gradient row through one side
// only: a row touched through a mutable host view is uploaded over whatever
// the device row holds. The engine works on its own CUDA stream: finish the
// kernels or copies that write device_grad(i) (synchronise their stream)
// before calling tell(). A copy of a batch shares its device rows and is
// valid, like the batch itself, until the next ask().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/device.hpp"

namespace optex {

namespace detail {
struct BatchAccess;
// Copies between device rows and host memory; implemented by a device backend.
class DeviceRows {
 public:
  virtual ~DeviceRows() = default;
  virtual void download(const float* device_src, float* host_dst, std::size_t count) const = 0;
  virtual void upload(const float* host_src, float* device_dst, std::size_t count) const = 0;
};
// A mutex that lets its owner stay copyable: a copy gets a fresh mutex.
struct CopyableMutex {
  CopyableMutex() = default;
  CopyableMutex(const CopyableMutex&) {}
  CopyableMutex& operator=(const CopyableMutex&) { return *this; }
  std::mutex mutex;
};
}  // namespace detail

class Batch {
 public:
  int size() const { return size_; }
  std::size_t dim() const { return dim_; }
  // The iteration this batch belongs to (0-based).
  std::int64_t iteration() const { return iteration_; }
  // Where the rows live: the engine's device.
  Device device() const { return device_; }

  std::span<const float> point(int i) const {
    if (on_device()) host_point_rows(i, i + 1);
    return {points_.data() + offset(i), dim_};
  }
  std::span<float> grad(int i) {
    if (on_device()) stage_gradient_rows(i, i + 1);
    return {grads_.data() + offset(i), dim_};
  }
  std::span<const float> grad(int i) const {
    if (on_device()) host_gradient_row(i);
    return {grads_.data() + offset(i), dim_};
  }
  double& loss(int i) { return losses_[static_cast<std::size_t>(check(i))]; }
  double loss(int i) const { return losses_[static_cast<std::size_t>(check(i))]; }

  // Copies a gradient in, checking its size.
  void set_gradient(int i, std::span<const float> g) {
    if (g.size() != dim_) {
      throw std::invalid_argument("gradient: size " + std::to_string(g.size()) +
                                  " does not match the dimension " + std::to_string(dim_));
    }
    auto dst = grad(i);
    std::copy(g.begin(), g.end(), dst.begin());
  }

  // A seed for point i's own randomness (its minibatch, its episodes), drawn
  // from the engine's seeded generator: the same on every run and every rank.
  std::uint64_t seed(int i) const { return seeds_[static_cast<std::size_t>(check(i))]; }

  // The gradient the proxy step from point i used (i < size() - 1); zero where
  // nothing was predicted (warm-up).
  std::span<const float> predicted_gradient(int i) const {
    if (i < 0 || i >= size_ - 1) {
      throw std::out_of_range(
          "i: " + std::to_string(i) + " has no predicted gradient (" +
          (size_ > 1 ? "the proxy steps start from points 0 to " + std::to_string(size_ - 2)
                     : std::string("there are no proxy steps with N = 1")) +
          ")");
    }
    if (on_device()) host_predicted_row(i);
    return {predicted_.data() + static_cast<std::size_t>(i) * dim_, dim_};
  }

  // Contiguous row-major views, size() x dim(), for bindings and communicators.
  std::span<const float> points() const {
    if (on_device()) host_point_rows(0, size_);
    return points_;
  }
  std::span<float> grads() {
    if (on_device()) stage_gradient_rows(0, size_);
    return grads_;
  }
  std::span<double> losses() { return losses_; }

  // Device engines: copies the gradient rows written through host views to
  // their device rows now (tell() does it itself). For code that reads the
  // device rows before tell(), such as a communicator gathering them. On a
  // CPU engine there is nothing to do.
  void upload_staged_gradients();

  // The rows in the engine's device memory: device pointers on a CUDA engine,
  // the host rows above on a CPU engine. Row i starts i * dim() floats in.
  const float* device_points() const { return on_device() ? device_points_ : points_.data(); }
  float* device_grads() { return on_device() ? device_grads_ : grads_.data(); }
  const float* device_point(int i) const { return device_points() + offset(i); }
  float* device_grad(int i) { return device_grads() + offset(i); }

 private:
  friend class Engine;
  friend struct detail::BatchAccess;

  int check(int i) const {
    if (i < 0 || i >= size_) {
      throw std::out_of_range("i: point index " + std::to_string(i) + " is outside [0, " +
                              std::to_string(size_) + ")");
    }
    return i;
  }
  std::size_t offset(int i) const { return static_cast<std::size_t>(check(i)) * dim_; }
  bool on_device() const { return device_rows_ != nullptr; }

  // Host rows of a CPU engine (allocated here, once) or the bookkeeping of a
  // device engine's host copies (allocated on first use).
  void allocate(int n, std::size_t d, Device device = Device::cpu());
  // Device engines: make host copies of rows [begin, end) current, stage
  // gradient rows for upload, or copy one gradient / prediction row down.
  void host_point_rows(int begin, int end) const;
  void stage_gradient_rows(int begin, int end);
  void host_gradient_row(int i) const;
  void host_predicted_row(int i) const;
  void allocate_host_copies() const;  // caller holds host_mutex_
  // A new ask(): every host copy is stale, nothing is staged.
  void invalidate_host_copies();

  int size_ = 0;
  std::size_t dim_ = 0;
  std::int64_t iteration_ = 0;
  std::uint64_t owner_ = 0;          // id of the engine that made it
  bool proxy_steps_applied_ = true;  // false when warm-up held every point at the iterate
  Device device_;
  mutable std::vector<float> points_;     // N x d (host copies on a device engine)
  mutable std::vector<float> grads_;      // N x d, filled by the caller
  mutable std::vector<float> predicted_;  // (N-1) x d
  std::vector<double> losses_;            // N, filled by the caller
  std::vector<std::uint64_t> seeds_;      // N
  std::vector<char> was_predicted_;       // 1 where predicted_ holds a real prediction

  // Device engines only.
  const detail::DeviceRows* device_rows_ = nullptr;
  float* device_points_ = nullptr;              // N x d
  float* device_grads_ = nullptr;               // N x d
  float* device_predicted_ = nullptr;           // (N-1) x d
  mutable std::vector<char> point_copied_;      // per row: host copy current
  mutable std::vector<char> predicted_copied_;  // per row: host copy current
  std::vector<char> gradient_staged_;           // per row: host row to upload at tell()
  // Host views may be used from the caller's worker threads at once.
  mutable detail::CopyableMutex host_mutex_;
};

}  // namespace optex
