#include "optex/gradient_history.hpp"

#include <stdexcept>
#include <string>

#include "optex/streaming.hpp"

namespace optex {

GradientHistory::GradientHistory(std::size_t capacity, std::size_t dim)
    : capacity_(capacity),
      dim_(dim),
      points_(capacity * dim),
      gradients_(capacity * dim),
      squared_distances_(capacity * capacity, 0.0),
      squared_norms_(capacity, 0.0),
      gradient_gram_(capacity * capacity, 0.0),
      scratch_(capacity, 0.0) {
  if (capacity == 0) throw std::invalid_argument("history: capacity must be >= 1, got 0");
  if (dim == 0) throw std::invalid_argument("history: dim must be >= 1, got 0");
}

void GradientHistory::push(std::span<const float> point, std::span<const float> gradient) {
  if (point.size() != dim_ || gradient.size() != dim_) {
    throw std::invalid_argument("history: pair of sizes " + std::to_string(point.size()) + ", " +
                                std::to_string(gradient.size()) + " does not match dim " +
                                std::to_string(dim_));
  }
  const std::size_t slot = next_;
  std::copy(point.begin(), point.end(), points_.begin() + static_cast<std::ptrdiff_t>(slot * dim_));
  std::copy(gradient.begin(), gradient.end(),
            gradients_.begin() + static_cast<std::ptrdiff_t>(slot * dim_));
  next_ = (next_ + 1) % capacity_;
  ++version_;
  if (size_ < capacity_) ++size_;

  // Only row and column `slot` change: one pass over the points and one over
  // the gradients, each reading the new row once.
  const float* x = points_.data() + slot * dim_;
  const float* g = gradients_.data() + slot * dim_;
  streaming::squared_distances(points_.data(), size_, dim_, x, scratch_.data());
  for (std::size_t j = 0; j < size_; ++j) {
    squared_distances_[slot * capacity_ + j] = scratch_[j];
    squared_distances_[j * capacity_ + slot] = scratch_[j];
  }
  squared_distances_[slot * capacity_ + slot] = 0.0;
  squared_norms_[slot] = streaming::dot(x, x, dim_);
  streaming::inner_products(gradients_.data(), size_, dim_, g, scratch_.data());
  for (std::size_t j = 0; j < size_; ++j) {
    gradient_gram_[slot * capacity_ + j] = scratch_[j];
    gradient_gram_[j * capacity_ + slot] = scratch_[j];
  }
}

}  // namespace optex
