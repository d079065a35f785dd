#include "optex/estimator/history_gram.hpp"

#include <stdexcept>
#include <string>

#include "optex/util/allocation.hpp"

namespace optex {

HistoryGram::HistoryGram(std::size_t capacity) : capacity_(capacity) {
  if (capacity == 0) throw std::invalid_argument("history: capacity must be >= 1, got 0");
  const std::string what = "history: capacity " + std::to_string(capacity);
  const char* contents = "fp64 distance and gradient Gram matrices";
  const std::size_t bytes =
      detail::checked_bytes(what, contents, {2, capacity, capacity}, sizeof(double));
  detail::allocate_or_explain(what, contents, bytes, [&] {
    squared_distances_.assign(capacity * capacity, 0.0);
    squared_norms_.assign(capacity, 0.0);
    gradient_gram_.assign(capacity * capacity, 0.0);
  });
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
