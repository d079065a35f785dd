// all_reduce's reduction on the host, in rank order, shared by the in-process,
// MPI and NCCL backends: every rank folds the gathered values alike, so all get the same bits.
#pragma once

#include <cstddef>
#include <span>

#include "optex/distributed/communicator.hpp"

namespace optex::detail {

// One step of all_reduce's rank-order fold: every backend folds with it, so all
// give the same bits (NaN included).
inline double combine(double so_far, double next, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return so_far + next;
    case ReduceOp::min:
      return next < so_far ? next : so_far;
    case ReduceOp::max:
      return next > so_far ? next : so_far;
  }
  return so_far;
}

// values[i] := every rank's value i folded in rank order, from `everyone`:
// the `ranks` ranks' values.size() values, one rank after the other.
inline void reduce_in_rank_order(std::span<const double> everyone, std::size_t ranks,
                                 std::span<double> values, ReduceOp op) {
  const std::size_t n = values.size();
  for (std::size_t i = 0; i < n; ++i) {
    double result = everyone[i];
    for (std::size_t r = 1; r < ranks; ++r) result = combine(result, everyone[r * n + i], op);
    values[i] = result;
  }
}

}  // namespace optex::detail
