// The elementwise optimizer passes on the CPU: one loop per optimizer kind and
// slot layout, instantiated for every kind of the Optimizer variant. Each
// coordinate goes through the optimizer's own update (the one the CUDA kernel
// calls too).
//
// Out of line so that this file alone is compiled with -fno-math-errno: with
// errno semantics GCC cannot vectorise the loops around sqrt. sqrt is
// correctly rounded either way, so results are unchanged bit for bit.
#include <algorithm>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex {
namespace {

// The update of coordinates [begin, end) with one range's coefficients. The
// slots in use are a template argument so that the loop loads and stores
// exactly those and vectorises like a hand-written one.
template <class O, unsigned Slots>
void update_coordinates(float* __restrict x, const float* __restrict g, float* __restrict s0,
                        float* __restrict s1, float* __restrict s2, std::size_t begin,
                        std::size_t end, const typename O::Coefficients c) {
  for (std::size_t k = begin; k < end; ++k) {
    SlotValues s{};
    if constexpr ((Slots & 1u) != 0) s[0] = s0[k];
    if constexpr ((Slots & 2u) != 0) s[1] = s1[k];
    if constexpr ((Slots & 4u) != 0) s[2] = s2[k];
    O::update(x[k], g[k], s, c);
    if constexpr ((Slots & 1u) != 0) s0[k] = s[0];
    if constexpr ((Slots & 2u) != 0) s1[k] = s[1];
    if constexpr ((Slots & 4u) != 0) s2[k] = s[2];
  }
}

static_assert(kMaxStateSlots == 3, "update_coordinates spells out three slots");

template <class O, unsigned... Layouts>
void update_with_layout(unsigned layout, float* x, const float* g, const StateSlotPointers& s,
                        std::size_t begin, std::size_t end, const typename O::Coefficients& c,
                        std::integer_sequence<unsigned, Layouts...>) {
  const bool matched =
      ((layout == Layouts
            ? (update_coordinates<O, Layouts>(x, g, s[0], s[1], s[2], begin, end, c), true)
            : false) ||
       ...);
  if (!matched) throw std::logic_error("apply_step: a state layout beyond kMaxStateSlots");
}

// The update of coordinates [lo, hi) by every range of kind O that meets them,
// each with the coefficients it had when the step began.
template <class O>
std::function<void(std::size_t, std::size_t)> range_updates(const OptimizerRanges& ranges,
                                                            std::span<float> x,
                                                            const StateSlotPointers& s,
                                                            unsigned layout, std::int64_t step,
                                                            std::span<const float> g) {
  struct Span {
    std::size_t begin, end;
    typename O::Coefficients c;
  };
  std::vector<Span> spans;
  spans.reserve(ranges.count());
  std::size_t begin = 0;
  for (const OptimizerRange& range : ranges.ranges()) {
    const std::size_t end = ranges.covers_any_dimension() ? x.size() : begin + range.size;
    spans.push_back(
        {begin, end, std::get<O>(range.optimizer).coefficients(range.local_step(step))});
    begin = end;
  }
  return [spans = std::move(spans), layout, x, s, g](std::size_t lo, std::size_t hi) {
    for (const Span& sp : spans) {
      const std::size_t b = std::max(sp.begin, lo);
      const std::size_t e = std::min(sp.end, hi);
      if (b >= e) continue;
      update_with_layout<O>(layout, x.data(), g.data(), s, b, e, sp.c,
                            std::make_integer_sequence<unsigned, 1u << kMaxStateSlots>{});
    }
  };
}

StateSlotPointers slot_pointers(OptimizerState& s) {
  StateSlotPointers p{};
  for (std::size_t j = 0; j < p.size(); ++j)
    p[j] = s.slots[j].empty() ? nullptr : s.slots[j].data();
  return p;
}

// The dimension the ranges cover: x's when they cover any, else their total.
std::size_t ranges_dimension(const OptimizerRanges& ranges, std::span<float> x) {
  if (ranges.covers_any_dimension()) return x.size();
  const std::optional<std::size_t> total = total_size(ranges.ranges());
  if (!total) {
    throw std::invalid_argument("apply_step: the ranges' sizes add up to more than any dimension");
  }
  return *total;
}

void check_sizes(std::size_t expected, std::span<float> x, const OptimizerState& s,
                 std::span<const float> g, StateSlots slots) {
  if (x.size() != expected || g.size() != expected) {
    throw std::invalid_argument(
        "apply_step: x has " + std::to_string(x.size()) + " and g " + std::to_string(g.size()) +
        " coordinates, the ranges' dimension is " + std::to_string(expected));
  }
  if (s.used() != slots) {
    throw std::invalid_argument(
        "apply_step: the state keeps other slots than the optimizer (a state of another "
        "optimizer or layout; make it with init_state)");
  }
  for (int j = 0; j < kMaxStateSlots; ++j) {
    const std::size_t have = s.slots[static_cast<std::size_t>(j)].size();
    if (slots.uses(j) && have != expected) {
      throw std::invalid_argument("apply_step: the state's slot " + std::to_string(j) + " has " +
                                  std::to_string(have) + " coordinates, the dimension is " +
                                  std::to_string(expected));
    }
  }
}

}  // namespace

StepInParts::StepInParts(const OptimizerRanges& ranges, std::span<float> x, OptimizerState& s,
                         std::span<const float> g)
    : state_(&s), dim_(x.size()) {
  check_sizes(ranges_dimension(ranges, x), x, s, g, ranges.state_slots());
  check_step_offsets(ranges, s.step);
  update_ = std::visit(
      [&](const auto& first) {
        return range_updates<std::decay_t<decltype(first)>>(ranges, x, slot_pointers(s),
                                                            s.used().bits, s.step, g);
      },
      ranges.front());
}

StepInParts::StepInParts(const OptimizerRanges& ranges, std::span<float> x,
                         const StateSlotPointers& slots, std::int64_t step,
                         std::span<const float> g)
    : state_(nullptr), dim_(x.size()) {
  if (ranges_dimension(ranges, x) != x.size() || g.size() != x.size()) {
    throw std::invalid_argument("apply_step: x has " + std::to_string(x.size()) + " and g " +
                                std::to_string(g.size()) +
                                " coordinates, not the ranges' dimension");
  }
  const StateSlots used = ranges.state_slots();
  for (int j = 0; j < kMaxStateSlots; ++j) {
    if (used.uses(j) != (slots[static_cast<std::size_t>(j)] != nullptr)) {
      throw std::invalid_argument("apply_step: the state keeps other slots than the optimizer");
    }
  }
  check_step_offsets(ranges, step);
  update_ = std::visit(
      [&](const auto& first) {
        return range_updates<std::decay_t<decltype(first)>>(ranges, x, slots, used.bits, step, g);
      },
      ranges.front());
}

void StepInParts::update(std::size_t begin, std::size_t end) const {
  update_(begin, std::min(end, dim_));
}

void StepInParts::finish() {
  if (!finished_ && state_ != nullptr) ++state_->step;
  finished_ = true;
}

void apply_step(const OptimizerRanges& ranges, std::span<float> x, OptimizerState& s,
                std::span<const float> g, const BlockPool& pool) {
  StepInParts step(ranges, x, s, g);
  const std::size_t bytes_per_block =
      (3 + 2 * static_cast<std::size_t>(s.used().count())) * kCoordinateBlock * sizeof(float);
  pool.for_blocks(block_count(x.size()), bytes_per_block, [&](std::size_t first, std::size_t last) {
    step.update(first * kCoordinateBlock, last * kCoordinateBlock);
  });
  step.finish();
}

void apply_step(const OptimizerRanges& ranges, std::span<float> x, OptimizerState& s,
                std::span<const float> g) {
  apply_step(ranges, x, s, g, BlockPool::serial());
}

void apply_step(const Optimizer& opt, std::span<float> x, OptimizerState& s,
                std::span<const float> g) {
  apply_step(OptimizerRanges(opt), x, s, g);
}

}  // namespace optex
