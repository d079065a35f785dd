// How the N points of a round are split over G groups of workers: contiguous
// blocks, group g gets N / G points and the first N % G groups one more.
//
//   for (int i : optex::point_range(n, groups, g)) evaluate(i);
//
// DistributedEngine uses it for its groups of ranks, and the Python
// optex.torch integration (through optex.point_range) for torch.distributed,
// so every implementation agrees on which worker evaluates which point.
#pragma once

namespace optex {

// The points first, first + 1, ..., first + count - 1. Iterable:
// for (int i : range).
struct PointRange {
  int first = 0;
  int count = 0;
  struct Iterator {
    int i;
    int operator*() const { return i; }
    Iterator& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return i != o.i; }
  };
  Iterator begin() const { return {first}; }
  Iterator end() const { return {first + count}; }
  bool contains(int i) const { return i >= first && i < first + count; }
};

// The points of group `group` among `groups` when `points` points are split.
// The larger blocks come first, so group 0's count is the largest. More
// groups than points is allowed: the last groups then get no point.
// Throws std::invalid_argument for points < 1 or groups < 1 and
// std::out_of_range for a group outside [0, groups), naming the argument and
// its value.
PointRange point_range(int points, int groups, int group);

}  // namespace optex
