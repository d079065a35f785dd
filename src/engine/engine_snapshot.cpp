// Taking an engine's whole state as an EngineSnapshot, and building an engine
// that continues it (engine_snapshot.hpp). Checkpoints go through here too:
// save() serialises a snapshot, load() builds from the one it read.
#include "optex/engine/engine_snapshot.hpp"

#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/resumed_options.hpp"
#include "engine/steppable_state.hpp"
#include "optex/backend/engine_backend.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/magnitude_bound.hpp"

namespace optex {
namespace {

// The same ranges at step offset 0: what a new engine, whose state is at
// step 0, accepts before the snapshot's state replaces its own.
OptimizerRanges without_step_offsets(const OptimizerRanges& ranges) {
  std::vector<OptimizerRange> zeroed(ranges.ranges().begin(), ranges.ranges().end());
  for (OptimizerRange& range : zeroed) range.step_offset = 0;
  return OptimizerRanges(std::move(zeroed));
}

}  // namespace

void EngineSnapshot::forget_history() {
  const auto cap = static_cast<std::size_t>(options.history > 0 ? options.history : 0);
  history_size = 0;
  history_next = 0;
  points.clear();
  gradients.clear();
  squared_distances.assign(cap * cap, 0.0);
  squared_norms.assign(cap, 0.0);
  gradient_gram.assign(cap * cap, 0.0);
  window_carried = 0;  // its gradients went with the history
  window_first_slot = 0;
}

// Reads and writes every member of an engine and its history.
struct SnapshotAccess {
  static EngineSnapshot take(const Engine& e, bool with_history) {
    EngineSnapshot s;
    s.options = e.options_;
    s.optimizer = e.optimizer_;
    const std::span<const float> x = e.iterate();  // host copies on a device engine
    s.iterate.assign(x.begin(), x.end());
    s.state = e.optimizer_state();
    s.lengthscale = e.lengthscale_;
    s.rng = e.rng_.state();
    s.iteration = e.iteration_;
    s.evaluations = e.evaluations_;
    if (with_history) {
      const GradientHistory& h = e.history();
      s.history_size = h.size_;
      s.history_next = h.next_;
      s.points.assign(h.points_.begin(),
                      h.points_.begin() + static_cast<std::ptrdiff_t>(h.size_ * h.dim_));
      s.gradients.assign(h.gradients_.begin(),
                         h.gradients_.begin() + static_cast<std::ptrdiff_t>(h.size_ * h.dim_));
      s.squared_distances = h.squared_distances_;
      s.squared_norms = h.squared_norms_;
      s.gradient_gram = h.gradient_gram_;
    } else {
      s.forget_history();
    }
    s.split_evaluations = e.split_rule_.evaluations_per_point();
    s.split_noise = e.split_rule_.noise();
    s.split_rounds_since_measured = e.split_rule_.rounds_since_measured();
    s.last_step_norm = e.last_step_norm_;
    s.window_carried = e.window_carried_;
    s.window_first_slot = e.window_first_slot_;
    return s;
  }

  // An engine with the snapshot's state, which validate() has accepted, on
  // the options it resumes with (resumed_options).
  static Engine build(EngineSnapshot s, const Options& options, const CoordinateShard& shard) {
    const std::size_t d = s.iterate.size();
    const auto cap = static_cast<std::size_t>(options.history);
    const OptimizerRanges ranges = s.optimizer.for_dimension(d);
    Engine e = [&] {
      try {
        return Engine(s.iterate, without_step_offsets(ranges), options, shard);
      } catch (const std::bad_alloc&) {
        throw std::runtime_error("an engine of parallelism " + std::to_string(options.parallelism) +
                                 ", history " + std::to_string(cap) + " and dimension " +
                                 std::to_string(d) + " does not fit in memory");
      }
    }();
    GradientHistory h(cap, d);
    std::copy(s.points.begin(), s.points.end(), h.points_.begin());
    std::copy(s.gradients.begin(), s.gradients.end(), h.gradients_.begin());
    h.squared_distances_ = std::move(s.squared_distances);
    h.squared_norms_ = std::move(s.squared_norms);
    h.gradient_gram_ = std::move(s.gradient_gram);
    h.size_ = static_cast<std::size_t>(s.history_size);
    h.next_ = static_cast<std::size_t>(s.history_next);
    e.backend_->restore(s.state, h);
    // The state's step is the snapshot's now: the ranges join where they did.
    e.backend_->set_optimizer(ranges);
    e.optimizer_ = ranges;
    e.lengthscale_ = s.lengthscale;
    e.rng_.set_state(s.rng);
    e.iteration_ = s.iteration;
    e.evaluations_ = s.evaluations;
    e.split_rule_.restore(s.split_evaluations, s.split_noise, s.split_rounds_since_measured);
    e.last_step_norm_ = s.last_step_norm;
    e.window_carried_ = s.window_carried;
    e.window_first_slot_ = static_cast<std::size_t>(s.window_first_slot);
    return e;
  }
};

EngineSnapshot Engine::snapshot(bool with_history) const {
  if (pending_) {
    throw std::runtime_error(
        "snapshot: a batch is pending (ask() without tell()); take it before ask() or after "
        "tell()");
  }
  return SnapshotAccess::take(*this, with_history);
}

Engine Engine::from_snapshot(EngineSnapshot snapshot, std::optional<Device> device,
                             std::optional<Precision> history_precision) {
  detail::check_resume_arguments(device, history_precision);
  validate(snapshot);
  const Options options = detail::resumed_options(snapshot.options, device, history_precision);
  if (const std::string why = detail::unavailable_device(options); !why.empty()) {
    throw InvalidSnapshot(SnapshotField::options,
                          "options.device: " + why + "; pass a device to resume elsewhere");
  }
  const CoordinateShard whole = CoordinateShard::whole(snapshot.iterate.size());
  return SnapshotAccess::build(std::move(snapshot), options, whole);
}

Engine Engine::from_snapshot(EngineSnapshot snapshot, const CoordinateShard& shard) {
  validate(snapshot);
  if (const std::string why = detail::unavailable_device(snapshot.options); !why.empty()) {
    throw InvalidSnapshot(SnapshotField::options, "options.device: " + why);
  }
  // validate() bounds the values by the slice's dimension; the engine needs the whole one's.
  const float bound = magnitude_bound(shard.dim);
  if (!all_within_bound(snapshot.points, bound) || !all_within_bound(snapshot.gradients, bound)) {
    throw InvalidSnapshot(SnapshotField::points,
                          "points, gradients: a value above " + std::to_string(bound) +
                              ", the magnitude bound for dimension " + std::to_string(shard.dim));
  }
  detail::check_steppable(snapshot, snapshot.optimizer.for_dimension(snapshot.iterate.size()),
                          bound);
  const Options options = snapshot.options;
  return SnapshotAccess::build(std::move(snapshot), options, shard);
}

Engine Engine::from_validated_snapshot(EngineSnapshot snapshot, const Options& options) {
  const CoordinateShard whole = CoordinateShard::whole(snapshot.iterate.size());
  return SnapshotAccess::build(std::move(snapshot), options, whole);
}

}  // namespace optex
