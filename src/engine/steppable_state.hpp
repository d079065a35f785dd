// Whether an engine can take a step from a state it is about to be built
// from (a checkpoint, a snapshot, a state_dict). Private to the library.
#pragma once

#include "optex/engine/engine_snapshot.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::detail {

// The check tell() makes before it commits a step, made on the snapshot's
// state: some gradient within the bound takes a step that lands on an
// iterate within `bound` (magnitude_bound of the whole dimension) and leaves
// every state slot finite. The steps are coordinatewise, so it tries, for
// each coordinate, the gradient entries 1, -1 and 0. A state that fails it
// would make every later tell() refuse its commit, so no loader accepts it,
// where the state is to blame: where a zero state at the same iterate and
// step would pass (hyperparameters no state can step with, which the
// constructor accepts too, do not make a checkpoint unloadable).
// `ranges` are the snapshot's, sized for its iterate. Throws InvalidSnapshot
// (SnapshotField::slot, or iterate for an optimizer without state) naming
// the first coordinate that cannot step.
void check_steppable(const EngineSnapshot& snapshot, const OptimizerRanges& ranges, float bound);

}  // namespace optex::detail
