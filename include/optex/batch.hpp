// The N points of one OptEx iteration, handed out by Engine::ask().
//
// The caller evaluates each point (in any order, on any worker) and writes its
// gradient and loss here; Engine::tell() then commits. The batch belongs to
// the engine that made it and stays valid until the next ask().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace optex {

class Batch {
 public:
  int size() const { return size_; }
  std::size_t dim() const { return dim_; }
  // The iteration this batch belongs to (0-based).
  std::int64_t iteration() const { return iteration_; }

  std::span<const float> point(int i) const { return {points_.data() + offset(i), dim_}; }
  std::span<float> grad(int i) { return {grads_.data() + offset(i), dim_}; }
  std::span<const float> grad(int i) const { return {grads_.data() + offset(i), dim_}; }
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
    if (i >= size_ - 1) {
      throw std::out_of_range("i: " + std::to_string(i) +
                              " has no predicted gradient (the last "
                              "point is " +
                              std::to_string(size_ - 1) + ")");
    }
    return {predicted_.data() + offset(i), dim_};
  }

  // Contiguous row-major views, size() x dim(), for bindings and communicators.
  std::span<const float> points() const { return points_; }
  std::span<float> grads() { return grads_; }
  std::span<double> losses() { return losses_; }

 private:
  friend class Engine;
  friend struct CheckpointAccess;

  int check(int i) const {
    if (i < 0 || i >= size_) {
      throw std::out_of_range("i: point index " + std::to_string(i) + " is outside [0, " +
                              std::to_string(size_) + ")");
    }
    return i;
  }
  std::size_t offset(int i) const { return static_cast<std::size_t>(check(i)) * dim_; }

  void allocate(int n, std::size_t d) {
    size_ = n;
    dim_ = d;
    points_.assign(static_cast<std::size_t>(n) * d, 0.0f);
    grads_.assign(static_cast<std::size_t>(n) * d, 0.0f);
    predicted_.assign(static_cast<std::size_t>(n > 1 ? n - 1 : 0) * d, 0.0f);
    losses_.assign(static_cast<std::size_t>(n), 0.0);
    seeds_.assign(static_cast<std::size_t>(n), 0);
    was_predicted_.assign(static_cast<std::size_t>(n), 0);
  }

  int size_ = 0;
  std::size_t dim_ = 0;
  std::int64_t iteration_ = 0;
  std::uint64_t owner_ = 0;           // id of the engine that made it
  bool proxy_steps_applied_ = true;   // false when warm-up held every point at the iterate
  std::vector<float> points_;         // N x d
  std::vector<float> grads_;          // N x d, filled by the caller
  std::vector<float> predicted_;      // (N-1) x d
  std::vector<double> losses_;        // N, filled by the caller
  std::vector<std::uint64_t> seeds_;  // N
  std::vector<char> was_predicted_;   // 1 where predicted_ holds a real prediction
};

}  // namespace optex
