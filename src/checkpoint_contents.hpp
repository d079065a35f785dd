// The payload of a checkpoint, read and checked before any engine is built
// (docs/DESIGN.md section 6). Private to the library: checkpoint.cpp frames
// it (magic, version, size, checksum) and builds the engine from it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "optex/optimizer_ranges.hpp"
#include "optex/optimizer_state.hpp"
#include "optex/options.hpp"
#include "serialization.hpp"

namespace optex::detail {

struct CheckpointContents {
  Options options;                           // as stored: load()'s arguments not applied
  std::optional<OptimizerRanges> optimizer;  // sized for the iterate
  std::vector<float> iterate;
  OptimizerState state;
  double lengthscale = 0.0;
  std::uint64_t rng = 0;
  std::int64_t iteration = 0;
  std::int64_t evaluations = 0;
  // The history: ring size and next slot, size x d points and gradients, and the
  // capacity x capacity (x 1 for the norms) cached statistics.
  std::uint64_t history_size = 0;
  std::uint64_t history_next = 0;
  std::vector<float> points;
  std::vector<float> gradients;
  std::vector<double> squared_distances;
  std::vector<double> squared_norms;
  std::vector<double> gradient_gram;
  // Format 4: the adaptive strategy's state and the last committed step's length.
  bool has_round_state = false;  // false for earlier formats: a fresh state
  std::int32_t split_evaluations = 1;
  double split_noise = 0.0;  // NaN before the first measurement
  std::int64_t split_rounds_since_measured = 0;
  double last_step_norm = 0.0;
};

// Reads the payload of format `version` to its end. Every count is checked
// against the bytes left before anything is allocated, every size against
// the options and the iterate, and every value: the options and
// hyperparameters validate, the iterate, history points and gradients are
// within magnitude_bound(d), the state's slots finite (and non-negative where
// the optimizer says so: its non_negative_slots), the counters, ring position,
// lengthscale and cached statistics in range. Throws std::runtime_error naming
// the field, its byte offset and the first bad value.
CheckpointContents read_contents(Reader& r, std::uint32_t version);

}  // namespace optex::detail
