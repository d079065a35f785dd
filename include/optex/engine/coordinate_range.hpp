// A contiguous run of coordinates of x: what Engine::tell's `unchanged`
// argument names, the coordinates a commit leaves exactly as they were.
//
// torch.optim skips a parameter whose gradient is None: its value and its
// optimizer state stay as they were. An OptEx round moves every coordinate
// (momentum, weight decay) even where every true gradient is zero, so a caller
// that finds out after the evaluations that some parameters took no part in
// them names their coordinates here:
//
//   const optex::CoordinateRange unused[] = {{.offset = 120, .size = 30}};
//   engine.tell(batch, unused);
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace optex {

struct CoordinateRange {
  std::size_t offset = 0;  // the first coordinate
  std::size_t size = 0;    // how many coordinates, from offset on

  friend bool operator==(const CoordinateRange&, const CoordinateRange&) = default;
};

// Throws std::invalid_argument, naming `what`, the range's index, offset and
// size and the problem, unless every range is non-empty and lies within
// [0, dim), and the ranges are sorted by offset and disjoint. An empty list
// is valid.
void check_coordinate_ranges(std::span<const CoordinateRange> ranges, std::size_t dim,
                             std::string_view what);

}  // namespace optex
