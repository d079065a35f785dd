// Everything that determines the rest of an engine's run, as plain values:
// what Engine::snapshot() takes and Engine::from_snapshot() builds from, what
// a checkpoint file serialises (Engine::save, Engine::load), and what the
// Python binding hands out as named arrays (docs/DESIGN.md section 6).
//
//   optex::EngineSnapshot s = engine.snapshot();   // between iterations
//   optex::Engine resumed = optex::Engine::from_snapshot(std::move(s));
//
// A snapshot made in memory is held to the checks a checkpoint file is held
// to (validate below): the engine's invariants (nothing non-finite, points
// and gradients within the magnitude bound, sizes that agree) hold for every
// engine, however it was built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/optimizers/optimizer_state.hpp"

namespace optex {

struct EngineSnapshot {
  Options options;
  // Every range with its hyperparameters and step offset; the sizes add up
  // to the iterate's dimension d.
  OptimizerRanges optimizer = Optimizer{};
  std::vector<float> iterate;  // x_t, d values
  OptimizerState state;        // S_t: the slots the optimizer keeps, d values each
  double lengthscale = 0.0;    // the one in use (lengthscale selection changes it)
  std::uint64_t rng = 0;       // the SplitMix64 state the next seeds come from
  std::int64_t iteration = 0;
  std::int64_t evaluations = 0;

  // The history ring, of capacity T0 = options.history: history_size pairs
  // in slots 0 .. history_size - 1, the next push at slot history_next, and
  // the cached statistics over all T0 slots (row-major T0 x T0; entries of
  // empty slots are not read). They are restored as they are, for a bit-exact
  // resume: nothing checks that they match the points.
  std::uint64_t history_size = 0;
  std::uint64_t history_next = 0;
  std::vector<float> points;              // history_size x d, in slot order
  std::vector<float> gradients;           // history_size x d
  std::vector<double> squared_distances;  // T0 x T0: ||x_i - x_j||^2
  std::vector<double> squared_norms;      // T0: ||x_i||^2
  std::vector<double> gradient_gram;      // T0 x T0: <g_i, g_j>

  // The adaptive strategy's state (AdaptiveSplit) and the length of the last
  // committed step (the trust region's unit).
  std::int32_t split_evaluations = 1;  // evaluations per point of the next round
  double split_noise = std::numeric_limits<double>::quiet_NaN();  // NaN: not measured yet
  std::int64_t split_rounds_since_measured = 0;
  double last_step_norm = 0.0;  // >= 0, or NaN where the backend does not measure it

  // The verified mode's window: the next round redoes the last round's
  // `window_carried` unverified steps with the gradients in history slots
  // window_first_slot, +1, ... (modulo T0). 0: the window starts afresh.
  std::int32_t window_carried = 0;
  std::uint64_t window_first_slot = 0;

  // Empties the history: no pairs, the next push at slot 0, statistics of
  // zero sized by options.history, as in a new engine. An engine built from
  // the snapshot then warms up again, with everything else as it was.
  void forget_history();
};

// The fields of an EngineSnapshot, as a refusal names them.
enum class SnapshotField {
  options,
  optimizer,    // the ranges' sizes, kinds and hyperparameters
  step_offset,  // one range's (InvalidSnapshot::index: the range)
  iterate,
  step,
  slot,  // one state slot (InvalidSnapshot::index: the slot)
  lengthscale,
  iteration,
  evaluations,
  history_size,
  history_next,
  points,
  gradients,
  squared_distances,
  squared_norms,
  gradient_gram,
  adaptive_split,  // split_evaluations, split_noise, split_rounds_since_measured
  last_step_norm,
  window,  // window_carried, window_first_slot
};

// What validate() throws: a std::invalid_argument whose message names the
// field and the first bad value, with where that is as data, for callers
// that name it their own way (the checkpoint reader adds the byte offset,
// the Python binding the dictionary key).
class InvalidSnapshot : public std::invalid_argument {
 public:
  InvalidSnapshot(SnapshotField field, const std::string& message, int index = -1,
                  std::optional<std::size_t> element = std::nullopt)
      : std::invalid_argument(message), field_(field), index_(index), element_(element) {}

  SnapshotField field() const noexcept { return field_; }
  // Which range (step_offset) or slot (slot) the field is; -1 for the others.
  int index() const noexcept { return index_; }
  // The position of the bad value in the field's array (row-major), when
  // one value is at fault rather than the field as a whole.
  std::optional<std::size_t> element() const noexcept { return element_; }

 private:
  SnapshotField field_;
  int index_;
  std::optional<std::size_t> element_;
};

// Checks everything an engine could be built from, without building it:
// the options and every range's hyperparameters validate, the ranges' sizes
// add up to the iterate's dimension d >= 1, every step offset is within the
// state's step; the iterate, history points and gradients are within
// magnitude_bound(d); the state keeps exactly the optimizer's slots, d values
// each, finite and non-negative where the optimizer says so
// (non_negative_slots); the step, counters and ring position are in range;
// the lengthscale is finite and positive; the cached statistics have their
// sizes, finite and (distances, norms) non-negative; the adaptive state is
// one a run can reach. Throws InvalidSnapshot at the first failure.
void validate(const EngineSnapshot& snapshot);

}  // namespace optex
