// What Engine::tell does with an inadmissible row (a gradient that is not
// finite or exceeds magnitude_bound(d), or a loss that is not finite), and
// the error it throws when it refuses such rows (DESIGN.md section 2).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace optex {

enum class NonfiniteRows {
  // The commit keeps inadmissible rows out of the history and steps from an
  // admissible point (the default).
  drop,
  // Any inadmissible row refuses the whole tell with RefusedRowsError; the
  // engine is unchanged and the batch stays pending.
  refuse,
};

// Thrown by Engine::tell(..., NonfiniteRows::refuse) when some rows are
// inadmissible. rows(): their indices in the batch the caller filled (the
// evaluation rows when a point has several), ascending, never empty. The
// check that found them is the commit's own: one pass over the rows.
class RefusedRowsError : public std::invalid_argument {
 public:
  RefusedRowsError(std::vector<int> rows, std::int64_t iteration, float bound);
  const std::vector<int>& rows() const noexcept { return rows_; }

 private:
  std::vector<int> rows_;
};

}  // namespace optex
