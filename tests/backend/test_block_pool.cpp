// BlockPool: every block exactly once, on several threads when the pass is
// large enough, exceptions carried to the caller, hostile thread counts
// refused, and a forked child that still gets its passes done.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "optex/backend/block_pool.hpp"

namespace {

// Bytes per block that make every block worth a thread of its own.
constexpr std::size_t kBigBlock = std::size_t{1} << 20;

TEST(BlockPool, CoversEveryBlockExactlyOnceAtEveryThreadCount) {
  for (int threads : {1, 2, 3, 7}) {
    optex::BlockPool pool(threads);
    for (std::size_t blocks : {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{64}}) {
      std::vector<std::atomic<int>> seen(blocks);
      pool.for_blocks(blocks, kBigBlock, [&](std::size_t first, std::size_t last) {
        ASSERT_LT(first, last);
        ASSERT_LE(last, blocks);
        for (std::size_t b = first; b < last; ++b) seen[b].fetch_add(1);
      });
      for (std::size_t b = 0; b < blocks; ++b)
        EXPECT_EQ(seen[b].load(), 1) << threads << " threads, block " << b << " of " << blocks;
    }
  }
}

TEST(BlockPool, ALargePassIsOneRunPerThreadASmallOneRunsOnTheCaller) {
  optex::BlockPool pool(3);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  const auto record = [&](std::size_t first, std::size_t last) {
    std::lock_guard lock(mutex);
    ids.insert(std::this_thread::get_id());
    runs.emplace_back(first, last);
  };
  pool.for_blocks(30, kBigBlock, record);
  EXPECT_EQ(runs.size(), 3u);  // contiguous runs, one per thread
  runs.clear();
  ids.clear();
  pool.for_blocks(30, 16, record);  // 480 bytes in all: not worth a thread
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], std::make_pair(std::size_t{0}, std::size_t{30}));
  EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
}

TEST(BlockPool, RethrowsABodysExceptionAndStaysUsable) {
  optex::BlockPool pool(2);
  EXPECT_THROW(pool.for_blocks(8, kBigBlock,
                               [](std::size_t first, std::size_t) {
                                 if (first == 0) throw std::runtime_error("first run");
                               }),
               std::runtime_error);
  std::atomic<std::size_t> covered{0};
  pool.for_blocks(8, kBigBlock,
                  [&](std::size_t first, std::size_t last) { covered += last - first; });
  EXPECT_EQ(covered.load(), 8u);
}

TEST(BlockPool, RefusesThreadCountsOutsideItsRangeNamingThem) {
  for (int threads : {-1, optex::kMaxThreads + 1, 1 << 30}) {
    try {
      optex::BlockPool pool(threads);
      ADD_FAILURE() << threads << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("threads"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(threads)), std::string::npos);
    }
  }
}

TEST(BlockPool, WhenTheOSRefusesAWorkerEveryPassRunsOnTheCaller) {
  std::atomic<int> attempts{0};
  const optex::detail::ThreadStarter refuse = [&](int index, std::function<void()> work) {
    ++attempts;
    if (index == 1) throw std::system_error(EAGAIN, std::generic_category());
    return std::thread(std::move(work));
  };
  optex::BlockPool pool(3, refuse);
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    pool.for_blocks(12, kBigBlock,
                    [&](std::size_t first, std::size_t last) { runs.emplace_back(first, last); });
    ASSERT_EQ(runs.size(), 1u) << "pass " << pass;  // the caller alone, in one run
    EXPECT_EQ(runs[0], std::make_pair(std::size_t{0}, std::size_t{12}));
  }
  EXPECT_EQ(attempts.load(), 2);  // tried once, not at every pass
}

TEST(BlockPool, ZeroMeansEveryCoreThisProcessMayUse) {
  EXPECT_GE(optex::available_cores(), 1);
  EXPECT_EQ(optex::BlockPool(0).threads(), optex::available_cores());
  EXPECT_EQ(optex::BlockPool::serial().threads(), 1);
}

TEST(BlockPool, AChildForkedAfterTheWorkersStartedStillFinishesItsPasses) {
  optex::BlockPool pool(2);
  std::atomic<std::size_t> covered{0};
  pool.for_blocks(8, kBigBlock,
                  [&](std::size_t first, std::size_t last) { covered += last - first; });
  ASSERT_EQ(covered.load(), 8u);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);  // a child waiting for workers it does not have would hang: fail instead
    std::size_t done = 0;
    pool.for_blocks(8, kBigBlock,
                    [&](std::size_t first, std::size_t last) { done += last - first; });
    _exit(done == 8 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
