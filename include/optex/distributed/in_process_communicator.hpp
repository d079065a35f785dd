// The in-process communicator: the W ranks of a world are W threads of one
// process (tests, and a single machine without MPI).
//
//   optex::InProcessWorld world(4);
//   std::vector<std::thread> threads;
//   for (int r = 0; r < 4; ++r)
//     threads.emplace_back([&world, comm = world.communicator(r)]() mutable { run(*comm); });
//
// Each rank's Communicator is used by exactly one thread, and each rank passes
// its own buffers. A collective copies straight from the other ranks' buffers
// (no intermediate copy); every rank gets identical bits from all_reduce.
// Beyond the interface's contract, this backend checks that the ranks called
// the same operation with matching sizes, root and ReduceOp, and names the
// ranks that did not arrive when a collective times out.
#pragma once

#include <memory>

#include "optex/distributed/communicator.hpp"

namespace optex {

namespace detail {
struct InProcessState;
}

class InProcessWorld {
 public:
  // Throws std::invalid_argument unless size >= 1.
  explicit InProcessWorld(int size);

  int size() const;

  // Rank `rank`'s communicator; once per rank (std::invalid_argument for a
  // rank out of [0, size) or one already handed out). The communicators keep
  // the world's shared state alive: the world object may go first.
  std::unique_ptr<Communicator> communicator(int rank);

 private:
  std::shared_ptr<detail::InProcessState> state_;
};

// A world of one rank (rank 0): single-process runs through the same code path.
std::unique_ptr<Communicator> local_communicator();

}  // namespace optex
