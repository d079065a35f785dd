#include "optex/distributed/point_split.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace optex {

PointRange point_range(int points, int groups, int group) {
  if (points < 1) {
    throw std::invalid_argument("points: must be >= 1, got " + std::to_string(points));
  }
  if (groups < 1) {
    throw std::invalid_argument("groups: must be >= 1, got " + std::to_string(groups));
  }
  if (group < 0 || group >= groups) {
    throw std::out_of_range("group: " + std::to_string(group) + " is outside [0, " +
                            std::to_string(groups) + ")");
  }
  const int base = points / groups;
  const int extra = points % groups;
  const int first = group * base + std::min(group, extra);
  return {first, base + (group < extra ? 1 : 0)};
}

}  // namespace optex
