// validate(EngineSnapshot): the checks every engine state must pass before an
// engine is built from it, whether it comes from a checkpoint file or from
// memory (docs/DESIGN.md section 6).
#include <cmath>
#include <cstddef>
#include <functional>
#include <sstream>
#include <string>

#include "engine/steppable_state.hpp"
#include "optex/engine/adaptive_split.hpp"
#include "optex/engine/engine_snapshot.hpp"
#include "optex/engine/magnitude_bound.hpp"

namespace optex {
namespace {

template <class T>
std::string show(T v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Refuses the first element of `values` that is not `ok`, naming it with
// `name(i)` and saying what it must be.
template <class T, class Ok>
void check_values(SnapshotField field, const std::vector<T>& values,
                  const std::function<std::string(std::size_t)>& name, Ok ok,
                  const std::string& requirement, int index = -1) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!ok(values[i])) {
      throw InvalidSnapshot(field, name(i) + " is " + show(values[i]) + " (" + requirement + ")",
                            index, i);
    }
  }
}

// "<what> 3, element 17" for element i of rows of length d.
std::function<std::string(std::size_t)> row_element(std::string what, std::size_t d) {
  return [what = std::move(what), d](std::size_t i) {
    return what + " " + std::to_string(i / d) + ", element " + std::to_string(i % d);
  };
}
// "<what> (3, 5)" for element i of an n x n matrix.
std::function<std::string(std::size_t)> matrix_entry(std::string what, std::size_t n) {
  return [what = std::move(what), n](std::size_t i) {
    return what + " (" + std::to_string(i / n) + ", " + std::to_string(i % n) + ")";
  };
}

void require_size(SnapshotField field, const std::string& name, std::size_t size,
                  std::size_t expected, const std::string& because) {
  if (size != expected) {
    throw InvalidSnapshot(field, name + " holds " + std::to_string(size) + " values, expected " +
                                     std::to_string(expected) + " (" + because + ")");
  }
}

void require_non_negative(SnapshotField field, const std::string& name, std::int64_t value) {
  if (value < 0) {
    throw InvalidSnapshot(field, name + " is " + std::to_string(value) + " (must be >= 0)");
  }
}

bool finite(double v) { return std::isfinite(v); }
bool finite_non_negative(double v) { return std::isfinite(v) && v >= 0.0; }

// The state keeps exactly the slots of the optimizer, d values each, finite,
// and not negative where the range's optimizer declares a second moment.
void check_state(const EngineSnapshot& s, const OptimizerRanges& ranges, std::size_t d) {
  require_non_negative(SnapshotField::step, "optimizer state step", s.state.step);
  for (std::size_t r = 0; r < ranges.count(); ++r) {
    if (ranges[r].step_offset > s.state.step) {
      throw InvalidSnapshot(
          SnapshotField::step_offset,
          "optimizer range " + std::to_string(r) + " step_offset is " +
              std::to_string(ranges[r].step_offset) + ", beyond the optimizer state's step " +
              std::to_string(s.state.step) + " (a range joins at a step the state has reached)",
          static_cast<int>(r));
    }
  }
  const StateSlots kept = ranges.state_slots();
  for (int j = 0; j < kMaxStateSlots; ++j) {
    const std::size_t have = s.state.slots[static_cast<std::size_t>(j)].size();
    const std::size_t want = kept.uses(j) ? d : 0;
    if (have != want) {
      const std::string label = "slot " + std::to_string(j);
      const std::string name = slot_name(ranges.front(), j);
      throw InvalidSnapshot(
          SnapshotField::slot,
          "optimizer state " + label + (name == label ? "" : " (" + name + ")") + " holds " +
              std::to_string(have) + " values, expected " + std::to_string(want) +
              (kept.uses(j) ? " (the optimizer keeps it, one value per coordinate)"
                            : " (the optimizer does not keep it)"),
          j);
    }
  }
  std::size_t begin = 0;
  for (const OptimizerRange& range : ranges.ranges()) {
    for (int j = 0; j < kMaxStateSlots; ++j) {
      const std::vector<float>& slot = s.state.slots[static_cast<std::size_t>(j)];
      if (slot.empty()) continue;
      const bool non_negative = slot_is_non_negative(range.optimizer, j);
      for (std::size_t i = begin; i < begin + range.size; ++i) {
        const float v = slot[i];
        if (!std::isfinite(v) || (non_negative && v < 0.0f)) {
          throw InvalidSnapshot(SnapshotField::slot,
                                "optimizer state " + slot_name(range.optimizer, j) + " (slot " +
                                    std::to_string(j) + "), element " + std::to_string(i) + " is " +
                                    show(v) + " (must be finite" +
                                    (non_negative ? " and >= 0: a second moment" : "") + ")",
                                j, i);
        }
      }
    }
    begin += range.size;
  }
}

// The ring's position and every array's size, then the values.
void check_history(const EngineSnapshot& s, std::size_t d) {
  const auto cap = static_cast<std::size_t>(s.options.history);
  if (s.history_size > cap) {
    throw InvalidSnapshot(SnapshotField::history_size,
                          "history size is " + std::to_string(s.history_size) +
                              ", more than the capacity " + std::to_string(cap) +
                              " (options.history)");
  }
  if (s.history_next >= cap || (s.history_size < cap && s.history_next != s.history_size)) {
    throw InvalidSnapshot(SnapshotField::history_next,
                          "history next slot " + std::to_string(s.history_next) +
                              " is inconsistent with " + std::to_string(s.history_size) +
                              " pairs in a ring of " + std::to_string(cap) +
                              " (the ring fills from slot 0; the next slot is the size until "
                              "it is full)");
  }
  const auto size = static_cast<std::size_t>(s.history_size);
  require_size(SnapshotField::points, "history points", s.points.size(), size * d, "size x d");
  require_size(SnapshotField::gradients, "history gradients", s.gradients.size(), size * d,
               "size x d");
  require_size(SnapshotField::squared_distances, "history squared distances",
               s.squared_distances.size(), cap * cap, "capacity x capacity");
  require_size(SnapshotField::squared_norms, "history squared norms", s.squared_norms.size(), cap,
               "capacity");
  require_size(SnapshotField::gradient_gram, "history gradient inner products",
               s.gradient_gram.size(), cap * cap, "capacity x capacity");

  const std::string bounded = "must be finite and at most " + show(magnitude_bound(d)) +
                              " in magnitude for d = " + std::to_string(d);
  const auto within = [bound = magnitude_bound(d)](float v) { return within_bound(v, bound); };
  check_values(SnapshotField::points, s.points, row_element("history point", d), within, bounded);
  check_values(SnapshotField::gradients, s.gradients, row_element("history gradient", d), within,
               bounded);
  check_values(SnapshotField::squared_distances, s.squared_distances,
               matrix_entry("history squared distance", cap), finite_non_negative,
               "must be finite and >= 0");
  check_values(
      SnapshotField::squared_norms, s.squared_norms,
      [](std::size_t i) { return "history squared norm " + std::to_string(i); },
      finite_non_negative, "must be finite and >= 0");
  check_values(SnapshotField::gradient_gram, s.gradient_gram,
               matrix_entry("history gradient inner product", cap), finite, "must be finite");
}

void check_round_state(const EngineSnapshot& s) {
  try {
    AdaptiveSplit(s.options.parallelism, s.options.evaluations_per_point)
        .restore(s.split_evaluations, s.split_noise, s.split_rounds_since_measured);
  } catch (const std::invalid_argument& e) {
    throw InvalidSnapshot(SnapshotField::adaptive_split, e.what());
  }
  // The window redoes steps with gradients the history holds.
  const std::int64_t carried = s.window_carried;
  const bool none = carried == 0 && s.window_first_slot == 0;
  if (!none &&
      (s.options.mode != Mode::verified || carried <= 0 || carried >= s.options.parallelism ||
       static_cast<std::uint64_t>(carried) > s.history_size ||
       s.window_first_slot >= static_cast<std::uint64_t>(s.options.history))) {
    throw InvalidSnapshot(SnapshotField::window,
                          "verified window of " + std::to_string(carried) +
                              " steps from history slot " + std::to_string(s.window_first_slot) +
                              " (must be 0 steps from slot 0, or in the verified mode [1, "
                              "parallelism) steps within the " +
                              std::to_string(s.history_size) + " pairs of the history)");
  }
  const double norm = s.last_step_norm;
  if (!((std::isfinite(norm) && norm >= 0.0) || std::isnan(norm))) {
    throw InvalidSnapshot(SnapshotField::last_step_norm, "last step length is " + show(norm) +
                                                             " (must be >= 0 and finite, or NaN)");
  }
}

}  // namespace

void validate(const EngineSnapshot& s) {
  // The options first: they bound the sizes everything else is checked against.
  try {
    s.options.validate();
  } catch (const std::invalid_argument& e) {
    throw InvalidSnapshot(SnapshotField::options, std::string("options: ") + e.what());
  }
  const std::size_t d = s.iterate.size();
  if (d == 0) {
    throw InvalidSnapshot(SnapshotField::iterate, "iterate is empty (the dimension must be >= 1)");
  }
  const OptimizerRanges ranges = [&] {
    try {
      return s.optimizer.for_dimension(d);
    } catch (const std::invalid_argument& e) {
      const std::string why = e.what();
      throw InvalidSnapshot(SnapshotField::optimizer,
                            why.starts_with("optimizer") ? why : "optimizer: " + why);
    }
  }();
  check_values(
      SnapshotField::iterate, s.iterate,
      [](std::size_t i) { return "iterate element " + std::to_string(i); },
      [bound = magnitude_bound(d)](float v) { return within_bound(v, bound); },
      "must be finite and at most " + show(magnitude_bound(d)) +
          " in magnitude for d = " + std::to_string(d));
  check_state(s, ranges, d);
  if (!(std::isfinite(s.lengthscale) && s.lengthscale > 0.0)) {
    throw InvalidSnapshot(SnapshotField::lengthscale,
                          "lengthscale is " + show(s.lengthscale) + " (must be finite and > 0)");
  }
  require_non_negative(SnapshotField::iteration, "iteration", s.iteration);
  require_non_negative(SnapshotField::evaluations, "evaluations", s.evaluations);
  check_history(s, d);
  check_round_state(s);
  // Last: every value is in range on its own; whether the state can take a
  // step is a property of all of them together.
  detail::check_steppable(s, ranges, magnitude_bound(d));
}

}  // namespace optex
