// The shape rules of coordinate ranges.
#include "optex/engine/coordinate_range.hpp"

#include <stdexcept>
#include <string>

namespace optex {
namespace {

std::string describe(std::size_t r, const CoordinateRange& range) {
  return "range " + std::to_string(r) + " (offset " + std::to_string(range.offset) + ", size " +
         std::to_string(range.size) + ")";
}

}  // namespace

void check_coordinate_ranges(std::span<const CoordinateRange> ranges, std::size_t dim,
                             std::string_view what) {
  const std::string prefix = std::string(what) + ": ";
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const CoordinateRange& range = ranges[r];
    if (range.size == 0) {
      throw std::invalid_argument(prefix + describe(r, range) +
                                  " is empty (every range needs at least one coordinate)");
    }
    // Written without offset + size, which a huge size would wrap around.
    if (range.offset >= dim || range.size > dim - range.offset) {
      throw std::invalid_argument(prefix + describe(r, range) + " reaches past the dimension " +
                                  std::to_string(dim) + " (coordinates are 0 to " +
                                  std::to_string(dim - 1) + ")");
    }
    if (r == 0) continue;
    const CoordinateRange& before = ranges[r - 1];
    if (range.offset < before.offset) {
      throw std::invalid_argument(prefix + describe(r, range) + " starts before " +
                                  describe(r - 1, before) + " (ranges must be sorted by offset)");
    }
    if (range.offset < before.offset + before.size) {
      throw std::invalid_argument(prefix + describe(r, range) + " overlaps " +
                                  describe(r - 1, before) + " (ranges must be disjoint)");
    }
  }
}

}  // namespace optex
