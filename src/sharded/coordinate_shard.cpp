#include "optex/sharded/coordinate_shard.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "optex/backend/block_pool.hpp"

namespace optex {

CoordinateShard shard_of(std::size_t d, int ranks, int rank) {
  if (ranks < 1) throw std::invalid_argument("ranks: must be >= 1, got " + std::to_string(ranks));
  if (rank < 0 || rank >= ranks) {
    throw std::invalid_argument("rank: " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(ranks) + ")");
  }
  const std::size_t blocks = block_count(d);
  const auto w = static_cast<std::size_t>(ranks);
  if (blocks < w) {
    throw std::invalid_argument("sharded state: dimension " + std::to_string(d) + " has " +
                                std::to_string(blocks) + " blocks of " +
                                std::to_string(kCoordinateBlock) + " coordinates, fewer than the " +
                                std::to_string(ranks) +
                                " ranks (each rank owns at least one block); use fewer ranks "
                                "or the replicated DistributedEngine");
  }
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t base = blocks / w;
  const std::size_t extra = blocks % w;
  const std::size_t first_block = r * base + (r < extra ? r : extra);
  const std::size_t own_blocks = base + (r < extra ? 1 : 0);
  const std::size_t offset = first_block * kCoordinateBlock;
  const std::size_t end = std::min(d, (first_block + own_blocks) * kCoordinateBlock);
  return {d, offset, end - offset, nullptr};
}

}  // namespace optex
