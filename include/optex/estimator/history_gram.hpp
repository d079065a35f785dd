// The T0 x T0 side of the history: which ring slots hold pairs, and the
// pairwise squared distances between points, their squared norms, and the
// inner products between gradients.
//
// Everything the lengthscale selection and the fit need is here, so it lives
// on the host whatever device holds the T0 x d points and gradients: the CPU
// history fills it from its own passes, the CUDA history from the N new rows
// it computes on the device each iteration (and copies back, T0 values each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace optex {

struct SnapshotAccess;

class HistoryGram {
 public:
  explicit HistoryGram(std::size_t capacity);

  std::size_t capacity() const { return capacity_; }
  // Valid slots are always 0 .. size()-1 (the buffer fills from slot 0).
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Bumped by every push: lets a fit tell whether it still matches the history.
  std::uint64_t version() const { return version_; }
  std::size_t newest_slot() const { return (next_ + capacity_ - 1) % capacity_; }
  // The slot the next push writes (the oldest once full).
  std::size_t next_slot() const { return next_; }

  // ||x_i - x_j||^2, ||x_i||^2 and <g_i, g_j>.
  double squared_distance(std::size_t i, std::size_t j) const {
    return squared_distances_[i * capacity_ + j];
  }
  double squared_norm(std::size_t slot) const { return squared_norms_[slot]; }
  double gradient_inner(std::size_t i, std::size_t j) const {
    return gradient_gram_[i * capacity_ + j];
  }

  // A push, in two halves. advance() claims next_slot() and counts the new
  // pair; once the pair is stored, set_row() records its row and column:
  // squared_distances[j] = ||x_slot - x_j||^2 and gradient_inner[j] =
  // <g_slot, g_j> for every j < size() (the own-distance entry is ignored).
  std::size_t advance();
  void set_row(std::size_t slot, const double* squared_distances, double squared_norm,
               const double* gradient_inner);

 protected:
  friend struct SnapshotAccess;  // takes and restores every member (engine_snapshot.cpp)

  std::size_t capacity_;
  std::size_t size_ = 0;
  std::size_t next_ = 0;
  std::uint64_t version_ = 0;
  std::vector<double> squared_distances_;  // capacity x capacity
  std::vector<double> squared_norms_;      // capacity
  std::vector<double> gradient_gram_;      // capacity x capacity
};

}  // namespace optex
