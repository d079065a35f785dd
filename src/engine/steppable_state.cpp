// check_steppable: trial steps from a state about to be loaded, block by
// block on copies, so that they need no memory of the state's size.
#include "engine/steppable_state.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/optimizers/optimizer.hpp"

namespace optex::detail {
namespace {

// Coordinates per trial block: large enough that the per-block setup is
// noise, small enough to stay in cache.
constexpr std::size_t kTrialBlock = 4 * kCoordinateBlock;

std::string show(float v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The slot to blame for coordinate i: the first one the step left
// non-finite, else the first one kept (the step's size comes from them).
int blamed_slot(const OptimizerState& after, std::size_t i) {
  int first = -1;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    const std::vector<float>& slot = after.slots[static_cast<std::size_t>(j)];
    if (slot.empty()) continue;
    if (!std::isfinite(slot[i])) return j;
    if (first < 0) first = j;
  }
  return first;
}

}  // namespace

void check_steppable(const EngineSnapshot& s, const OptimizerRanges& ranges, float bound) {
  const std::size_t d = s.iterate.size();
  std::vector<float> x, g;
  std::vector<char> can_step;
  OptimizerState state;
  // One trial step on copies of coordinates [begin, begin + n), with every
  // gradient entry `witness`; marks the coordinates that land where tell()
  // commits.
  const auto trial = [&](std::size_t begin, std::size_t n, float witness, bool zero_state) {
    x.assign(s.iterate.begin() + static_cast<std::ptrdiff_t>(begin),
             s.iterate.begin() + static_cast<std::ptrdiff_t>(begin + n));
    g.assign(n, witness);
    state.step = s.state.step;
    for (std::size_t j = 0; j < kMaxStateSlots; ++j) {
      const std::vector<float>& slot = s.state.slots[j];
      if (slot.empty()) {
        state.slots[j].clear();
      } else if (zero_state) {
        state.slots[j].assign(n, 0.0f);
      } else {
        state.slots[j].assign(slot.begin() + static_cast<std::ptrdiff_t>(begin),
                              slot.begin() + static_cast<std::ptrdiff_t>(begin + n));
      }
    }
    apply_step(slice_ranges(ranges, begin, n), x, state, g);
    for (std::size_t i = 0; i < n; ++i) {
      bool ok = within_bound(x[i], bound);
      for (const std::vector<float>& slot : state.slots)
        ok = ok && (slot.empty() || std::isfinite(slot[i]));
      if (ok) can_step[i] = 1;
    }
  };
  for (std::size_t begin = 0; begin < d; begin += kTrialBlock) {
    const std::size_t n = std::min(kTrialBlock, d - begin);
    can_step.assign(n, 0);
    // The steps are coordinatewise, so a gradient that commits exists if each
    // coordinate commits with one of the witnesses. Zero alone is not enough:
    // Adam with eps = 0 steps 0 / 0 from a zero gradient, and fine from 1.
    for (const float witness : {1.0f, -1.0f, 0.0f}) trial(begin, n, witness, false);
    if (std::all_of(can_step.begin(), can_step.end(), [](char ok) { return ok != 0; })) continue;
    // The state is to blame only where a zero state at the same iterate and
    // step could step: hyperparameters no state can step with (an lr of 1e38,
    // which the constructor takes too) leave a checkpoint loadable, as stuck
    // as the run that saved it.
    const std::vector<char> with_state = can_step;
    for (const float witness : {1.0f, -1.0f, 0.0f}) trial(begin, n, witness, true);
    const std::vector<char> with_zero_state = can_step;
    trial(begin, n, 0.0f, false);  // names what went wrong
    for (std::size_t i = 0; i < n; ++i) {
      if (with_state[i] || !with_zero_state[i]) continue;
      bool slots_finite = true;
      for (const std::vector<float>& slot : state.slots) {
        slots_finite = slots_finite && (slot.empty() || std::isfinite(slot[i]));
      }
      const int j = blamed_slot(state, i);
      const std::string why =
          "cannot take a step: from this state a step moves coordinate " +
          std::to_string(begin + i) + " to " + show(x[i]) +
          (slots_finite ? "" : " with a non-finite optimizer state") +
          " with a zero gradient, and out of range with gradients of +-1 too (tell() commits only "
          "steps that stay finite and within " +
          show(bound) + "; the optimizer state or the iterate is out of the range a run can reach)";
      if (j < 0) throw InvalidSnapshot(SnapshotField::iterate, "iterate " + why, -1, begin + i);
      throw InvalidSnapshot(SnapshotField::slot,
                            "optimizer state " + slot_name(ranges.front(), j) + " (slot " +
                                std::to_string(j) + "), element " + std::to_string(begin + i) +
                                ": " + why,
                            j, begin + i);
    }
  }
}

}  // namespace optex::detail
