// Hyperparameters per contiguous range of the parameter vector: PyTorch's
// parameter groups (no weight decay on biases and norms, per-layer learning
// rates). Every range uses the same optimizer kind, so the state keeps one
// layout over all of x; each range has its own values (lr, weight decay,
// betas, momentum, ...).
//
//   optex::Engine engine(x0, optex::OptimizerRanges{{weights, optex::adamw(1e-3, 0.05)},
//                                                   {biases, optex::adamw(1e-3, 0.0)}},
//                        options);
//
// One optimizer converts to a single range that covers every coordinate,
// whatever the dimension: Engine(x0, optex::Adam{.lr = 1e-3}) is that.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <vector>

#include "optex/optimizers/optimizer.hpp"

namespace optex {

class BlockPool;

struct OptimizerRange {
  std::size_t size = 0;  // coordinates: the range follows the one before it
  Optimizer optimizer;
  // The state's step count when the range joined (>= 0): its optimizer sees
  // its own steps only, as a fresh optimizer would (torch.optim's per-parameter
  // `step`: a parameter group added later starts Adam's bias correction, and
  // SGD's momentum buffer, at its first step). Like a hyperparameter, it may
  // change in set_optimizer; it may never exceed the state's step.
  std::int64_t step_offset = 0;

  // The step count this range's optimizer sees when the state has taken
  // `state_step` updates.
  std::int64_t local_step(std::int64_t state_step) const { return state_step - step_offset; }

  friend bool operator==(const OptimizerRange&, const OptimizerRange&) = default;
};

class OptimizerRanges {
 public:
  // One range that covers every coordinate.
  OptimizerRanges(Optimizer optimizer);  // NOLINT(google-explicit-constructor): the common case
  template <BaseOptimizer O>
  OptimizerRanges(const O& optimizer)  // NOLINT(google-explicit-constructor)
      : OptimizerRanges(Optimizer(optimizer)) {}
  // Consecutive ranges from coordinate 0, in order; their sizes must add up
  // to the dimension of the engine they are given to.
  OptimizerRanges(std::vector<OptimizerRange> ranges);  // NOLINT(google-explicit-constructor)
  OptimizerRanges(std::initializer_list<OptimizerRange> ranges)
      : OptimizerRanges(std::vector<OptimizerRange>(ranges)) {}

  // Built from one optimizer: one range whose size follows the dimension.
  bool covers_any_dimension() const { return covers_any_dimension_; }
  std::size_t count() const { return ranges_.size(); }
  std::span<const OptimizerRange> ranges() const { return ranges_; }
  const OptimizerRange& operator[](std::size_t r) const { return ranges_[r]; }
  // The optimizer of the first range (the only one, unless ranges were given).
  const Optimizer& front() const { return ranges_.front().optimizer; }
  // The slots the state keeps: those of any range.
  StateSlots state_slots() const;

  // The same ranges sized for dimension `dim`. Throws std::invalid_argument
  // for no range, a range of size 0 or a negative step_offset (the
  // constructor's checks), sizes that do not add up to dim, ranges
  // of different optimizer kinds, or a bad hyperparameter (its message,
  // prefixed by "range r: " when there are several ranges).
  OptimizerRanges for_dimension(std::size_t dim) const;

  friend bool operator==(const OptimizerRanges&, const OptimizerRanges&) = default;

 private:
  std::vector<OptimizerRange> ranges_;
  bool covers_any_dimension_ = false;
};

// The part of `sized` (ranges sized for a whole vector) over coordinates
// [offset, offset + size), each range cut to it, with its hyperparameters and
// step offset: what one slice of a sharded engine steps with. One optimizer
// for every coordinate stays that. Throws std::invalid_argument when the part
// is empty or reaches past the ranges.
OptimizerRanges slice_ranges(const OptimizerRanges& sized, std::size_t offset, std::size_t size);

// The sum of the ranges' sizes; nullopt when it does not fit in a size_t.
std::optional<std::size_t> total_size(std::span<const OptimizerRange> ranges);

// The ranges that `ranges` can be replaced with in a running engine: the
// same sizes, kinds and state layouts (step offsets may change). Returns why
// not ("" if it can).
std::string cannot_replace(const OptimizerRanges& current, const OptimizerRanges& next);

// Throws std::invalid_argument naming the first range whose step_offset is
// beyond `state_step`, the step count of the state the ranges are to step: a
// range cannot have joined at a step the state has not reached.
void check_step_offsets(const OptimizerRanges& ranges, std::int64_t state_step);

// One update of x in place, each range with its own hyperparameters at its
// own step count (OptimizerRange::local_step); ranges must be sized for x
// (for_dimension) and their offsets within s.step (std::invalid_argument,
// before anything is written). Advances s.step once.
void apply_step(const OptimizerRanges& ranges, std::span<float> x, OptimizerState& s,
                std::span<const float> g);
// The same update with its coordinates in blocks on the pool's threads: the
// same bits on any number of threads.
void apply_step(const OptimizerRanges& ranges, std::span<float> x, OptimizerState& s,
                std::span<const float> g, const BlockPool& pool);

// One apply_step in parts, for a pass that fuses the update with other work
// block by block (the CPU's proxy step): the constructor checks what
// apply_step checks and takes each range's coefficients at the state's step;
// update(begin, end) updates coordinates [begin, end) (clipped to x), from
// any thread, for disjoint parts; finish() advances s.step once. Updating
// every coordinate once, in any parts and order, then finish(), equals
// apply_step bit for bit. x, s and g must outlive it.
// A state's slots as pointers to d floats each (nullptr where unused).
using StateSlotPointers = std::array<float*, kMaxStateSlots>;

class StepInParts {
 public:
  StepInParts(const OptimizerRanges& ranges, std::span<float> x, OptimizerState& s,
              std::span<const float> g);
  // The same update of a state held as slot pointers at step count `step`;
  // finish() leaves the count to the caller.
  StepInParts(const OptimizerRanges& ranges, std::span<float> x, const StateSlotPointers& slots,
              std::int64_t step, std::span<const float> g);
  void update(std::size_t begin, std::size_t end) const;
  void finish();

 private:
  std::function<void(std::size_t, std::size_t)> update_;
  OptimizerState* state_;
  std::size_t dim_;
  bool finished_ = false;
};

inline OptimizerState init_state(const OptimizerRanges& ranges, std::size_t dim) {
  return zero_state(ranges.state_slots(), dim);
}

}  // namespace optex
