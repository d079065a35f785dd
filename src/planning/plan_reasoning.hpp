// The planner's recommendation and the sentences that explain it: the reason,
// the assumption about the steps a round advances, the same-budget alternatives.
#pragma once

#include "optex/planning/plan.hpp"
#include "planning/plan_table.hpp"

namespace optex::detail {

// Fills every field of `out` but the request, the candidates and the plain
// step's, from the measured table.
void recommend(const Table& table, int evaluations, Plan& out);

}  // namespace optex::detail
