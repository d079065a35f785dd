#include "optex/backend/block_pool.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "optex/util/thread_pool.hpp"

namespace optex {
namespace {

// Below this a thread's wake-up (a few microseconds) is not paid back.
constexpr std::size_t kMinBytesPerThread = std::size_t{1} << 20;

}  // namespace

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(std::min<unsigned>(n, kMaxThreads)) : 1;
}

BlockPool::BlockPool(int threads) : BlockPool(threads, detail::ThreadStarter{}) {}

BlockPool::BlockPool(int threads, detail::ThreadStarter start) : start_(std::move(start)) {
  if (threads < 0 || threads > kMaxThreads) {
    throw std::invalid_argument("threads: must be in [0, " + std::to_string(kMaxThreads) +
                                "] (0: every core), got " + std::to_string(threads));
  }
  threads_ = threads == 0 ? std::min(available_cores(), kMaxThreads) : threads;
}

BlockPool::~BlockPool() = default;

const BlockPool& BlockPool::serial() {
  static const BlockPool pool(1);
  return pool;
}

void BlockPool::for_blocks(std::size_t blocks, std::size_t bytes_per_block,
                           const std::function<void(std::size_t, std::size_t)>& body) const {
  if (blocks == 0) return;
  const std::size_t bytes = blocks * std::max<std::size_t>(bytes_per_block, 1);
  const std::size_t worth = std::max<std::size_t>(bytes / kMinBytesPerThread, 1);
  const std::size_t tasks = std::min({static_cast<std::size_t>(threads_), worth, blocks});
  if (tasks > 1 && !pool_ && !start_failed_) {
    try {
      pool_ = start_ ? std::make_unique<ThreadPool>(threads_, start_)
                     : std::make_unique<ThreadPool>(threads_);
      owner_pid_ = static_cast<int>(getpid());
    } catch (const std::system_error&) {
      start_failed_ = true;  // the ThreadPool has joined the ones it started
    }
  }
  if (tasks <= 1 || !pool_ || owner_pid_ != static_cast<int>(getpid())) {
    body(0, blocks);
    return;
  }
  // Contiguous runs of nearly equal length: each thread streams its own part.
  pool_->parallel_for(static_cast<int>(tasks), [&](int t) {
    const std::size_t first = blocks * static_cast<std::size_t>(t) / tasks;
    const std::size_t last = blocks * static_cast<std::size_t>(t + 1) / tasks;
    body(first, last);
  });
}

}  // namespace optex
