// The threads that run the memory-bound passes over d-vectors.
//
// A pass over [0, d) is cut into blocks of kCoordinateBlock coordinates.
// Block boundaries depend on d only, never on the thread count: each thread
// takes a contiguous run of whole blocks, and a pass that reduces keeps one
// partial per block and adds them up in block order on the calling thread.
// So every result is the same bit for bit on 1 thread or 64 (DESIGN.md,
// "Threads").
//
// A pool is used by one engine at a time: a round's passes run one after the
// other, and between them (while the N points are evaluated) its workers
// sleep on a condition variable, leaving every core to the objective.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "optex/util/thread_pool.hpp"

namespace optex {

// Coordinates per block: 16 KiB of floats, so a block of a few rows and the
// query stays in L2 while every kernel of a fused pass reads it.
inline constexpr std::size_t kCoordinateBlock = 4096;

// The largest thread count Options::threads and BlockPool accept.
inline constexpr int kMaxThreads = 1024;

// The cores this process may run on (its CPU affinity mask), at least 1.
int available_cores();

class BlockPool {
 public:
  // `threads` in [0, kMaxThreads]; 0 means available_cores(). Else
  // std::invalid_argument. One thread runs every pass on the caller. The
  // workers start at the first pass large enough to use them, so an engine
  // on a small problem never starts any; in a process forked after they
  // started (where they do not exist) every pass runs on the caller. Threads
  // only make a pass faster: when the OS refuses to start them, every pass
  // runs on the caller instead, with the same results.
  explicit BlockPool(int threads = 1);
  // Starts its workers with `start` (tests: a starter that fails).
  BlockPool(int threads, detail::ThreadStarter start);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int threads() const { return threads_; }

  // Calls body(first, last) for disjoint runs [first, last) of block indices
  // that cover [0, blocks), possibly at once on several threads, and returns
  // when all have finished (rethrowing the first one's exception). A pass
  // that moves fewer than about 1 MiB per thread uses fewer threads:
  // `bytes_per_block` is what one block of the pass reads and writes.
  void for_blocks(std::size_t blocks, std::size_t bytes_per_block,
                  const std::function<void(std::size_t first, std::size_t last)>& body) const;

  // A one-thread pool, for callers that have no pool of their own.
  static const BlockPool& serial();

 private:
  int threads_;
  mutable std::unique_ptr<ThreadPool> pool_;  // started by the first pass that needs it
  mutable int owner_pid_ = 0;                 // the process that started it
  mutable bool start_failed_ = false;         // the OS refused a worker: run on the caller
  detail::ThreadStarter start_;               // empty: std::thread
};

// How many blocks cover `n` coordinates.
inline std::size_t block_count(std::size_t n) {
  return (n + kCoordinateBlock - 1) / kCoordinateBlock;
}

}  // namespace optex
