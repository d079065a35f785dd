// What a ShardedEngine is made of, for the two ways to make one: a new run
// (sharded_engine.cpp) and a checkpoint (sharded_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "optex/sharded/sharded_engine.hpp"

namespace optex {

struct ShardedEngine::Parts {
  std::optional<Engine> engine;             // this rank's slice
  OptimizerRanges optimizer = Optimizer{};  // over the whole vector
  std::unique_ptr<CommunicatorSums> sums;   // the slice engine's completions
  std::unique_ptr<CommunicationStats> stats;
};

namespace detail {
// What every rank of a sharded run holds whole and equal: the iteration and
// evaluations, the generator, the lengthscale and the T0 x T0 statistics.
std::uint64_t shared_state_hash(const Engine& engine);

// Refuses, on every rank, a configuration that some rank has no room for
// (std::invalid_argument naming the rank, the bytes needed and available);
// prints every rank's bytes on rank 0 unless `quiet`. Collective.
void check_shard_memory(const ShardMemory& memory, const CoordinateShard& shard, Device device,
                        Communicator& comm, bool quiet);
}  // namespace detail

}  // namespace optex
