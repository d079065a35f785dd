// Per-range hyperparameters: their shape rules and how they may change.
#include "optex/optimizers/optimizer_ranges.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace optex {
namespace {

std::string range_prefix(std::size_t r, std::size_t count) {
  return count > 1 ? "range " + std::to_string(r) + ": " : "";
}

}  // namespace

std::optional<std::size_t> total_size(std::span<const OptimizerRange> ranges) {
  std::size_t total = 0;
  for (const OptimizerRange& r : ranges) {
    // Sizes near SIZE_MAX would wrap around to a small sum that matches the dimension,
    // and every range past the first would then step memory that x does not have.
    if (r.size > std::numeric_limits<std::size_t>::max() - total) return std::nullopt;
    total += r.size;
  }
  return total;
}

OptimizerRanges::OptimizerRanges(Optimizer optimizer)
    : ranges_{OptimizerRange{0, std::move(optimizer)}}, covers_any_dimension_(true) {}

OptimizerRanges::OptimizerRanges(std::vector<OptimizerRange> ranges) : ranges_(std::move(ranges)) {
  if (ranges_.empty()) {
    throw std::invalid_argument("optimizer ranges: need at least one range, got none");
  }
  for (std::size_t r = 0; r < ranges_.size(); ++r) {
    if (ranges_[r].size == 0) {
      throw std::invalid_argument("optimizer ranges: range " + std::to_string(r) +
                                  " has size 0 (every range needs at least one coordinate)");
    }
    if (ranges_[r].step_offset < 0) {
      throw std::invalid_argument("optimizer ranges: range " + std::to_string(r) +
                                  " has step_offset " + std::to_string(ranges_[r].step_offset) +
                                  " (must be >= 0: the state's step count when the range joined)");
    }
    if (ranges_[r].optimizer.index() != ranges_[0].optimizer.index()) {
      throw std::invalid_argument("optimizer ranges: range " + std::to_string(r) + " is " +
                                  std::string(optimizer_name(ranges_[r].optimizer)) +
                                  " but range 0 is " +
                                  std::string(optimizer_name(ranges_[0].optimizer)) +
                                  " (every range shares one optimizer kind and one state layout)");
    }
  }
}

StateSlots OptimizerRanges::state_slots() const {
  StateSlots slots;
  for (const OptimizerRange& r : ranges_) slots = slots | optex::state_slots(r.optimizer);
  return slots;
}

OptimizerRanges OptimizerRanges::for_dimension(std::size_t dim) const {
  for (std::size_t r = 0; r < ranges_.size(); ++r) {
    try {
      validate(ranges_[r].optimizer);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(range_prefix(r, ranges_.size()) + e.what());
    }
  }
  if (covers_any_dimension_) {
    return OptimizerRanges({OptimizerRange{dim, ranges_[0].optimizer, ranges_[0].step_offset}});
  }
  const std::optional<std::size_t> total = total_size(ranges_);
  if (total != dim) {
    throw std::invalid_argument(
        "optimizer ranges: the sizes add up to " +
        (total ? std::to_string(*total)
               : "more than " + std::to_string(std::numeric_limits<std::size_t>::max())) +
        ", but the dimension is " + std::to_string(dim));
  }
  return *this;
}

std::string cannot_replace(const OptimizerRanges& current, const OptimizerRanges& next) {
  if (current.count() != next.count()) {
    return "optimizer ranges: " + std::to_string(next.count()) + " cannot replace " +
           std::to_string(current.count()) +
           " (give one optimizer per range of the running engine)";
  }
  for (std::size_t r = 0; r < current.count(); ++r) {
    if (!next.covers_any_dimension() && next[r].size != current[r].size) {
      return "optimizer ranges: range " + std::to_string(r) + " has size " +
             std::to_string(next[r].size) + ", the running engine's has " +
             std::to_string(current[r].size);
    }
    std::string why = cannot_replace(current[r].optimizer, next[r].optimizer);
    if (!why.empty()) return range_prefix(r, current.count()) + why;
  }
  return {};
}

void check_step_offsets(const OptimizerRanges& ranges, std::int64_t state_step) {
  for (std::size_t r = 0; r < ranges.count(); ++r) {
    if (ranges[r].step_offset > state_step) {
      throw std::invalid_argument(
          "optimizer ranges: range " + std::to_string(r) + " has step_offset " +
          std::to_string(ranges[r].step_offset) + ", beyond the optimizer state's step " +
          std::to_string(state_step) + " (a range joins at a step the state has reached)");
    }
  }
}

OptimizerRanges slice_ranges(const OptimizerRanges& sized, std::size_t offset, std::size_t size) {
  if (sized.covers_any_dimension()) return sized;
  const std::optional<std::size_t> total = total_size(sized.ranges());
  if (size == 0 || !total || offset > *total || size > *total - offset) {
    throw std::invalid_argument("slice: coordinates [" + std::to_string(offset) + ", " +
                                std::to_string(offset) + " + " + std::to_string(size) +
                                ") are not a non-empty part of the ranges");
  }
  std::vector<OptimizerRange> part;
  std::size_t begin = 0;
  for (const OptimizerRange& r : sized.ranges()) {
    const std::size_t end = begin + r.size;
    const std::size_t lo = std::max(begin, offset);
    const std::size_t hi = std::min(end, offset + size);
    if (lo < hi) part.push_back({hi - lo, r.optimizer, r.step_offset});
    begin = end;
  }
  return OptimizerRanges(std::move(part));
}

}  // namespace optex
