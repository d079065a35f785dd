#include "optex/history_gram.hpp"

#include <stdexcept>

namespace optex {

HistoryGram::HistoryGram(std::size_t capacity)
    : capacity_(capacity),
      squared_distances_(capacity * capacity, 0.0),
      squared_norms_(capacity, 0.0),
      gradient_gram_(capacity * capacity, 0.0) {
  if (capacity == 0) throw std::invalid_argument("history: capacity must be >= 1, got 0");
}

std::size_t HistoryGram::advance() {
  const std::size_t slot = next_;
  next_ = (next_ + 1) % capacity_;
  ++version_;
  if (size_ < capacity_) ++size_;
  return slot;
}

void HistoryGram::set_row(std::size_t slot, const double* squared_distances, double squared_norm,
                          const double* gradient_inner) {
  for (std::size_t j = 0; j < size_; ++j) {
    const double dist = j == slot ? 0.0 : squared_distances[j];
    squared_distances_[slot * capacity_ + j] = dist;
    squared_distances_[j * capacity_ + slot] = dist;
    gradient_gram_[slot * capacity_ + j] = gradient_inner[j];
    gradient_gram_[j * capacity_ + slot] = gradient_inner[j];
  }
  squared_norms_[slot] = squared_norm;
}

}  // namespace optex
