#include "optex/gradient_history.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "optex/detail/allocation.hpp"
#include "optex/streaming.hpp"

namespace optex {

namespace {

std::string describe(std::size_t capacity, std::size_t dim) {
  return "history: " + std::to_string(capacity) + " points of dimension " + std::to_string(dim);
}
constexpr const char* kContents = "fp32 points and gradients";

// Checks dim and the bytes of the points and gradients before the base class
// allocates its statistics.
std::size_t checked_capacity(std::size_t capacity, std::size_t dim) {
  if (dim == 0) throw std::invalid_argument("history: dim must be >= 1, got 0");
  (void)detail::checked_bytes(describe(capacity, dim), kContents, {2, capacity, dim},
                              sizeof(float));
  return capacity;
}

}  // namespace

GradientHistory::GradientHistory(std::size_t capacity, std::size_t dim)
    : HistoryGram(checked_capacity(capacity, dim)), dim_(dim) {
  const std::string what = describe(capacity, dim);
  const std::size_t bytes =
      detail::checked_bytes(what, kContents, {2, capacity, dim}, sizeof(float));
  detail::allocate_or_explain(what, kContents, bytes, [&] {
    points_.resize(capacity * dim);
    gradients_.resize(capacity * dim);
    scratch_distances_.assign(capacity, 0.0);
    scratch_inner_.assign(capacity, 0.0);
  });
}

void GradientHistory::push(std::span<const float> point, std::span<const float> gradient) {
  if (point.size() != dim_ || gradient.size() != dim_) {
    throw std::invalid_argument("history: pair of sizes " + std::to_string(point.size()) + ", " +
                                std::to_string(gradient.size()) + " does not match dim " +
                                std::to_string(dim_));
  }
  const std::size_t slot = advance();
  float* x = points_.data() + slot * dim_;
  float* g = gradients_.data() + slot * dim_;
  std::copy(point.begin(), point.end(), x);
  std::copy(gradient.begin(), gradient.end(), g);
  // Only row and column `slot` change: one pass over the points and one over
  // the gradients, each reading the new row once.
  streaming::squared_distances(points_.data(), size(), dim_, x, scratch_distances_.data());
  streaming::inner_products(gradients_.data(), size(), dim_, g, scratch_inner_.data());
  set_row(slot, scratch_distances_.data(), streaming::dot(x, x, dim_), scratch_inner_.data());
}

void GradientHistory::assign(const HistoryGram& gram, std::span<const float> points,
                             std::span<const float> gradients) {
  if (gram.capacity() != capacity() || points.size() != gram.size() * dim_ ||
      gradients.size() != gram.size() * dim_) {
    throw std::invalid_argument("history: assign of " + std::to_string(gram.size()) +
                                " pairs does not match capacity " + std::to_string(capacity()) +
                                " and dim " + std::to_string(dim_));
  }
  static_cast<HistoryGram&>(*this) = gram;
  std::copy(points.begin(), points.end(), points_.begin());
  std::copy(gradients.begin(), gradients.end(), gradients_.begin());
}

}  // namespace optex
