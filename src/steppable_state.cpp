// check_steppable: a trial step from a state about to be loaded, block by
// block on copies, so that it needs no memory of the state's size.
#include "steppable_state.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "optex/block_pool.hpp"
#include "optex/magnitude_bound.hpp"
#include "optex/optimizer.hpp"

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
  OptimizerState state;
  for (std::size_t begin = 0; begin < d; begin += kTrialBlock) {
    const std::size_t n = std::min(kTrialBlock, d - begin);
    x.assign(s.iterate.begin() + static_cast<std::ptrdiff_t>(begin),
             s.iterate.begin() + static_cast<std::ptrdiff_t>(begin + n));
    g.assign(n, 0.0f);
    state.step = s.state.step;
    for (std::size_t j = 0; j < kMaxStateSlots; ++j) {
      const std::vector<float>& slot = s.state.slots[j];
      if (slot.empty()) {
        state.slots[j].clear();
      } else {
        state.slots[j].assign(slot.begin() + static_cast<std::ptrdiff_t>(begin),
                              slot.begin() + static_cast<std::ptrdiff_t>(begin + n));
      }
    }
    apply_step(slice_ranges(ranges, begin, n), x, state, g);
    for (std::size_t i = 0; i < n; ++i) {
      bool slots_finite = true;
      for (const std::vector<float>& slot : state.slots) {
        slots_finite = slots_finite && (slot.empty() || std::isfinite(slot[i]));
      }
      if (within_bound(x[i], bound) && slots_finite) continue;
      const int j = blamed_slot(state, i);
      const std::string why =
          "cannot take a step: from this state a step with a zero gradient moves coordinate " +
          std::to_string(begin + i) + " to " + show(x[i]) +
          (slots_finite ? "" : " with a non-finite optimizer state") +
          " (tell() commits only steps that stay finite and within " + show(bound) +
          "; the optimizer state or the iterate is out of the range a run can reach)";
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
