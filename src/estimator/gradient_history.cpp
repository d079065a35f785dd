#include "optex/estimator/gradient_history.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/streaming.hpp"
#include "optex/util/allocation.hpp"
#include "sharded/completed_sums.hpp"

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
    scratch_.reserve(2 * capacity + 1);
  });
}

void GradientHistory::push(std::span<const float> point, std::span<const float> gradient,
                           const BlockPool& pool) {
  if (point.size() != dim_ || gradient.size() != dim_) {
    throw std::invalid_argument("history: pair of sizes " + std::to_string(point.size()) + ", " +
                                std::to_string(gradient.size()) + " does not match dim " +
                                std::to_string(dim_));
  }
  const float* x = point.data();
  const float* g = gradient.data();
  push_all({&x, 1}, {&g, 1}, pool);
}

void GradientHistory::push_all(std::span<const float* const> points,
                               std::span<const float* const> gradients, const BlockPool& pool,
                               ShardSums* sums) {
  if (points.size() != gradients.size()) {
    throw std::invalid_argument("history: " + std::to_string(points.size()) + " points but " +
                                std::to_string(gradients.size()) + " gradients");
  }
  const std::size_t n = points.size();
  if (n == 0) return;
  // Only the last capacity() pairs survive; the earlier ones still advance the
  // ring (and the version) as their pushes would have.
  const std::size_t skipped = n > capacity() ? n - capacity() : 0;
  // On a slice the completion below is a collective that may throw: keep what
  // the push overwrites, so that a failed push leaves the history as it was.
  std::optional<Backup> backup;
  if (sums != nullptr) backup.emplace(*this, n - skipped);
  std::vector<std::size_t> slots;
  std::vector<const float*> new_points;
  std::vector<const float*> new_gradients;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t slot = advance();
    if (k < skipped) continue;
    float* x = points_.data() + slot * dim_;
    float* g = gradients_.data() + slot * dim_;
    std::copy(points[k], points[k] + dim_, x);
    std::copy(gradients[k], gradients[k] + dim_, g);
    slots.push_back(slot);
    new_points.push_back(x);
    new_gradients.push_back(g);
  }
  // Only the new slots' rows and columns change: one pass over the points and
  // one over the gradients, each reading every new row once.
  // The distances, the squared norms and the inner products sit in one
  // buffer so that a sharded history completes them in one call.
  const std::size_t rows = size();
  const std::size_t pairs = slots.size();
  scratch_.resize(pairs * (2 * rows + 1));
  double* distances = scratch_.data();
  double* norms = distances + pairs * rows;
  double* inner = norms + pairs;
  streaming::squared_distances(pool, points_.data(), rows, dim_, new_points, distances, norms);
  streaming::inner_products(pool, gradients_.data(), rows, dim_, new_gradients, inner);
  try {
    complete_sums(sums, scratch_);
    if (sums != nullptr) {
      std::vector<std::ptrdiff_t> push_of(rows, -1);
      for (std::size_t k = 0; k < pairs; ++k) push_of[slots[k]] = static_cast<std::ptrdiff_t>(k);
      detail::check_gram_rows(
          {pairs, rows, distances, norms, inner}, [&](std::size_t k) { return slots[k]; },
          [&](std::size_t j) { return push_of[j]; },
          detail::kUnderflowPerCoordinate * static_cast<double>(dim_));
    }
  } catch (...) {
    if (backup) backup->restore(*this);
    throw;
  }
  // In push order: an entry between two new slots is set by both, the later last.
  for (std::size_t k = 0; k < pairs; ++k) {
    set_row(slots[k], distances + k * rows, norms[k], inner + k * rows);
  }
}

GradientHistory::Backup::Backup(const GradientHistory& h, std::size_t pairs)
    : gram(h), points(pairs * h.dim_), gradients(pairs * h.dim_) {
  // The slots the next `pairs` pushes write, in order.
  for (std::size_t k = 0, slot = h.next_slot(); k < pairs; ++k, slot = (slot + 1) % h.capacity()) {
    slots.push_back(slot);
    std::copy_n(h.points_.data() + slot * h.dim_, h.dim_, points.data() + k * h.dim_);
    std::copy_n(h.gradients_.data() + slot * h.dim_, h.dim_, gradients.data() + k * h.dim_);
  }
}

void GradientHistory::Backup::restore(GradientHistory& h) const {
  static_cast<HistoryGram&>(h) = gram;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    std::copy_n(points.data() + k * h.dim_, h.dim_, h.points_.data() + slots[k] * h.dim_);
    std::copy_n(gradients.data() + k * h.dim_, h.dim_, h.gradients_.data() + slots[k] * h.dim_);
  }
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
