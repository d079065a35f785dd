// The window of the last T0 evaluated (point, gradient) pairs, in a ring buffer.
//
// All storage is allocated once, at construction: pushing a pair overwrites
// the oldest slot and updates, for that slot only, the pairwise squared
// distances between points and the inner products between gradients. That is
// the "incremental Gram update" of the design: per iteration only the N new
// rows and columns are computed, at O(N * T0 * d), and everything the
// estimator and the lengthscale selection need afterwards is T0 x T0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace optex {

struct CheckpointAccess;

class GradientHistory {
 public:
  GradientHistory(std::size_t capacity, std::size_t dim);

  // Appends a pair; once full, replaces the oldest. Sizes must equal dim()
  // and values must be finite (the engine checks; this class trusts it).
  void push(std::span<const float> point, std::span<const float> gradient);

  std::size_t capacity() const { return capacity_; }
  std::size_t dim() const { return dim_; }
  // Valid slots are always 0 .. size()-1 (the buffer fills from slot 0).
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Bumped by every push: lets a fit tell whether it still matches the history.
  std::uint64_t version() const { return version_; }
  std::size_t newest_slot() const { return (next_ + capacity_ - 1) % capacity_; }

  std::span<const float> point(std::size_t slot) const {
    return {points_.data() + slot * dim_, dim_};
  }
  std::span<const float> gradient(std::size_t slot) const {
    return {gradients_.data() + slot * dim_, dim_};
  }
  // Row-major size() x dim() blocks of points and gradients.
  const float* points_data() const { return points_.data(); }
  const float* gradients_data() const { return gradients_.data(); }

  // ||x_i - x_j||^2, ||x_i||^2 and <g_i, g_j> (see streaming.hpp for the accumulation).
  double squared_distance(std::size_t i, std::size_t j) const {
    return squared_distances_[i * capacity_ + j];
  }
  double squared_norm(std::size_t slot) const { return squared_norms_[slot]; }
  double gradient_inner(std::size_t i, std::size_t j) const {
    return gradient_gram_[i * capacity_ + j];
  }

 private:
  friend struct CheckpointAccess;  // reads and restores every member

  std::size_t capacity_;
  std::size_t dim_;
  std::size_t size_ = 0;
  std::size_t next_ = 0;  // slot the next push writes
  std::uint64_t version_ = 0;
  std::vector<float> points_;
  std::vector<float> gradients_;
  std::vector<double> squared_distances_;  // capacity x capacity
  std::vector<double> squared_norms_;      // capacity
  std::vector<double> gradient_gram_;      // capacity x capacity
  std::vector<double> scratch_;            // capacity
};

}  // namespace optex
