// A slice of the coordinates of a d-vector whose other slices live elsewhere:
// the sharded distributed engine (sharded_engine.hpp) gives each rank one.
//
// Everything the engine computes coordinate by coordinate (a proxy step, the
// GP mean, the optimizer update) works on a slice alone. What sums over all
// coordinates (distances, inner products, norms) is computed as a partial sum
// over the slice and completed by ShardSums across the slices; what asks
// whether every coordinate is finite is a flag completed the same way. An
// engine given a CoordinateShard does exactly that (DESIGN.md section 3,
// "Sharded state").
#pragma once

#include <cstddef>
#include <span>

namespace optex {

// Completes partial results across the slices. Every slice calls each
// operation in the same order with the same sizes (a collective).
//
// A slice engine checks what it can of each completion before it uses it
// (src/sharded/completed_sums.hpp, DESIGN.md section 6): squared distances and norms
// not negative (and finite where every partial is), flags 0 or 1 and 0 where
// its own is 0, a point's distance to itself 0, the same partials completed
// to the same bits, and the values of one call consistent with each other
// (Cauchy-Schwarz, the triangle inequality, two passes' results of one
// quantity within a relative 1e-2). A completion that fails throws
// std::runtime_error ("shard: the sums completed ...; the ShardSums is
// faulty") and leaves the engine unchanged.
class ShardSums {
 public:
  virtual ~ShardSums() = default;
  // In place: each value becomes the sum of its partials over every slice,
  // added in slice order, so that every slice receives the same bits.
  virtual void sum(std::span<double> partials) = 0;
  // In place: each flag becomes 1 where it is nonzero on every slice, else 0.
  virtual void all(std::span<char> flags) = 0;
};

struct CoordinateShard {
  std::size_t dim = 0;        // d: the whole vector's dimension
  std::size_t offset = 0;     // the slice's first coordinate
  std::size_t size = 0;       // its coordinates
  ShardSums* sums = nullptr;  // nullptr: the slice is the whole vector

  // The whole vector of dimension d (no other slices).
  static CoordinateShard whole(std::size_t d) { return {d, 0, d, nullptr}; }
  bool is_whole() const { return sums == nullptr; }
};

// Rank `rank`'s slice when `ranks` ranks share dimension d: contiguous runs of
// whole coordinate blocks (block_pool.hpp's kCoordinateBlock), the first
// ranks one block more, so that a slice's passes cut the same blocks as the
// whole vector's. `sums` is left empty. Throws std::invalid_argument when
// some rank would get no block (d too small to shard over `ranks`) or for
// ranks < 1 or rank outside [0, ranks).
CoordinateShard shard_of(std::size_t d, int ranks, int rank);

// Partial sums completed over the slices as ShardSums does; a whole vector's
// are already complete. The engine's helpers for an optional ShardSums.
inline void complete_sums(ShardSums* sums, std::span<double> partials) {
  if (sums != nullptr && !partials.empty()) sums->sum(partials);
}
inline bool on_every_slice(ShardSums* sums, bool mine) {
  if (sums == nullptr) return mine;
  char flag = mine ? 1 : 0;
  sums->all({&flag, 1});
  return flag != 0;
}
inline void complete_flags(ShardSums* sums, std::span<char> flags) {
  if (sums != nullptr && !flags.empty()) sums->all(flags);
}

}  // namespace optex
