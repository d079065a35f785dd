// Whether an engine can take a step from a state it is about to be built
// from (a checkpoint, a snapshot, a state_dict). Private to the library.
#pragma once

#include "optex/engine_snapshot.hpp"
#include "optex/optimizer_ranges.hpp"

namespace optex::detail {

// The check tell() makes before it commits a step, made on the snapshot's
// state with a zero gradient (a gradient every objective may return): the
// step lands on an iterate within `bound` (magnitude_bound of the whole
// dimension) and leaves every state slot finite. A state that fails it
// would make every later tell() refuse its commit, so no loader accepts it.
// `ranges` are the snapshot's, sized for its iterate. Throws
// InvalidSnapshot (SnapshotField::slot, or iterate for an optimizer
// without state) naming the first coordinate that cannot step.
void check_steppable(const EngineSnapshot& snapshot, const OptimizerRanges& ranges, float bound);

}  // namespace optex::detail
