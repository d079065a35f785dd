// Checks of the sharded engine that every host communicator must pass. Each
// function runs on every rank of a world with that rank's communicator: W
// threads in test_sharded_engine.cpp, W processes under mpirun in
// test_sharded_engine_mpi.cpp.
//
// The reference is a whole (unsharded) Engine with the same options that
// every rank runs on the side, evaluating all N rows itself.
#pragma once

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "distributed/distributed_scenarios.hpp"
#include "optex/backend/block_pool.hpp"
#include "optex/sharded/sharded_engine.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace optex::test {

// d such that every rank but the first owns exactly one 4096-coordinate block
// (the last one partial): the ranks' partial sums, added in rank order, are
// then the whole engine's block sums in block order, bit for bit.
inline std::size_t OneBlockPerRankDim(int ranks) {
  return static_cast<std::size_t>(ranks) * kCoordinateBlock - 1000;
}
// Several blocks per rank: the sums differ from the whole engine's in the last bits.
inline constexpr std::size_t kManyBlocksDim = 7 * kCoordinateBlock + 123;
// The tolerance of a sharded run against the whole engine after 50 rounds,
// relative to the iterate's largest magnitude (measured: below 1e-6).
inline constexpr double kShardedTolerance = 1e-5;

inline Options ShardedOptions(int n, std::uint64_t seed) {
  Options options = WithN(n, seed);
  options.history = 12;
  options.lengthscale_selection = LengthscaleSelection::leave_one_out;
  return options;
}

// One round of a sharded engine: this rank's rows on the noisy quadratic,
// each with its rank's minibatch seed.
inline const IterationInfo& ShardedRound(ShardedEngine& engine) {
  NoisyQuadratic f;
  ShardedBatch& b = engine.ask();
  for (int i : b.rows()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
  return engine.tell(b);
}

inline std::vector<float> WholeIterate(ShardedEngine& engine) {
  std::vector<float> x(engine.dim());
  engine.gather_iterate(x);
  return x;
}

inline double LargestRelativeDifference(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[j]) - b[j]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[j])));
  }
  return diff / std::max(scale, 1e-30);
}

// A sharded run follows the whole engine for 50 rounds: bit for bit when
// `bit_for_bit` (W = 1, or one block per rank after the first), within
// kShardedTolerance otherwise; the random seeds and the counters always agree
// exactly, and every rank holds the same shared state (hash_interval = 1).
// `options`: ShardedOptions(4, 31) unless given (the adaptive strategy, say).
inline void CheckFollowsWholeEngine(Communicator& comm, std::size_t d, Optimizer optimizer,
                                    bool bit_for_bit, int data_parallel = 1, int rounds = 50,
                                    std::optional<Options> given = std::nullopt) {
  comm.set_timeout(kTestTimeout);
  const Options options = given.value_or(ShardedOptions(4, 31));
  const std::vector<float> x0 = UniformStart(d, 9);
  DistributedOptions dist;
  dist.data_parallel = data_parallel;
  dist.hash_interval = 1;
  ShardedEngine engine(x0, optimizer, options, comm, dist, true);
  Engine reference(x0, optimizer, options);
  double worst = 0.0;
  for (int t = 0; t < rounds; ++t) {
    const IterationInfo& info = ShardedRound(engine);
    Batch& ref_batch = reference.ask();
    EvaluateLikeAGroup(ref_batch, data_parallel);
    const IterationInfo& ref_info = reference.tell(ref_batch);
    ASSERT_EQ(engine.engine().rng_state(), reference.rng_state()) << "round " << t;
    ASSERT_EQ(info.committed_point, ref_info.committed_point) << "round " << t;
    ASSERT_EQ(info.committed_steps, ref_info.committed_steps) << "round " << t;
    const std::vector<float> x = WholeIterate(engine);
    if (bit_for_bit) {
      ASSERT_TRUE(SameBits(x, reference.iterate())) << "rank " << comm.rank() << ", round " << t;
      ASSERT_TRUE(SameBits(info.loss, ref_info.loss));
    }
    worst = std::max(worst, LargestRelativeDifference(x, reference.iterate()));
  }
  EXPECT_LE(worst, kShardedTolerance) << "W = " << comm.size() << ", d = " << d;
  if (comm.rank() == 0) {
    std::printf("sharded W=%d d=%zu D=%d: largest relative difference %.3g over %d rounds\n",
                comm.size(), d, data_parallel, worst, rounds);
  }
}

// The same run twice gives the same bits, on every rank.
inline void CheckRepeatsBitForBit(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  const std::vector<float> x0 = UniformStart(kManyBlocksDim, 4);
  auto run = [&] {
    ShardedEngine engine(x0, Adam{.lr = 0.02}, ShardedOptions(5, 8), comm, {}, true);
    for (int t = 0; t < 12; ++t) ShardedRound(engine);
    return WholeIterate(engine);
  };
  const std::vector<float> first = run();
  EXPECT_TRUE(SameBits(first, run())) << "rank " << comm.rank();
  // Every rank gathered the same whole iterate.
  const std::uint64_t hash =
      fnv1a64(reinterpret_cast<const unsigned char*>(first.data()), first.size() * sizeof(float));
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::uint64_t>(&hash, 1), std::span<std::uint64_t>(all));
  for (std::uint64_t h : all) EXPECT_EQ(h, all[0]);
}

// The files of the sharded checkpoint at `path`: the manifest's name, then its
// slice files `<name>.shard-<r>-of-<W>.<token>` (any token), sorted.
inline std::vector<std::string> ShardFiles(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string prefix = p.filename().string() + ".shard-";
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(p.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix)) files.push_back(name);
  }
  std::ranges::sort(files);
  return files;
}

// Every file beside `path` that belongs to it (the manifest, its slices and
// anything else named `<name>.*`), with its bytes.
inline std::vector<std::pair<std::string, std::string>> CheckpointFiles(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string name = p.filename().string();
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : std::filesystem::directory_iterator(p.parent_path())) {
    const std::string file = entry.path().filename().string();
    if (file != name && !file.starts_with(name + ".")) continue;
    std::string bytes;
    if (entry.is_regular_file()) {
      std::ifstream in(entry.path(), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    files.emplace_back(file, std::move(bytes));
  }
  std::ranges::sort(files);
  return files;
}

inline void RemoveShardedCheckpoint(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  for (const std::string& file : ShardFiles(path)) std::filesystem::remove(dir + "/" + file);
  std::filesystem::remove_all(path);
}

// This rank's slice file of the checkpoint at `path` (the one its manifest
// names: the only one of this rank once a save has finished).
inline std::string MyShardFile(const std::string& path, const Communicator& comm) {
  const std::string prefix = std::filesystem::path(path).filename().string() + ".shard-" +
                             std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size()) +
                             ".";
  std::vector<std::string> mine;
  for (const std::string& file : ShardFiles(path)) {
    if (file.starts_with(prefix)) mine.push_back(file);
  }
  EXPECT_EQ(mine.size(), 1u) << "rank " << comm.rank();
  return mine.empty() ? std::string()
                      : std::filesystem::path(path).parent_path().string() + "/" + mine[0];
}

// While it lives, this process cannot write files larger than `bytes`: a write
// past them fails with EFBIG (SIGXFSZ ignored). Under mpirun that is one rank;
// in one process, every rank.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &previous_);
    rlimit limit = previous_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &previous_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit previous_{};
  void (*previous_handler_)(int) = nullptr;
};

// save, run on, and a load of the save resumes bit for bit; a save replaces
// the previous set (its files are gone); a save that fails on one rank leaves
// the previous checkpoint loadable and removes what it wrote; files that do
// not belong are refused on every rank.
inline void CheckShardedCheckpoint(Communicator& comm, const std::string& path) {
  comm.set_timeout(kTestTimeout);
  const Options options = ShardedOptions(4, 12);
  const std::vector<float> x0 = UniformStart(kManyBlocksDim, 2);
  const OptimizerRanges ranges{{5000, adamw(0.02, 0.01)},
                               {kManyBlocksDim - 5000, adamw(0.01, 0.0)}};
  ShardedEngine first(x0, ranges, options, comm, {}, true);
  for (int t = 0; t < 5; ++t) ShardedRound(first);
  first.save(path);
  for (int t = 0; t < 5; ++t) ShardedRound(first);

  ShardedEngine resumed = ShardedEngine::load(path, comm);
  EXPECT_TRUE(
      std::ranges::equal(resumed.optimizer_ranges().ranges(), first.optimizer_ranges().ranges()));
  for (int t = 0; t < 5; ++t) ShardedRound(resumed);
  EXPECT_TRUE(SameEngine(resumed.engine(), first.engine())) << "rank " << comm.rank();
  EXPECT_TRUE(SameBits(WholeIterate(resumed), WholeIterate(first)));

  // A second save replaces the first: one file per rank, under a new token.
  const std::string older = MyShardFile(path, comm);
  const std::string kept = path + ".older-" + std::to_string(comm.rank());
  std::filesystem::copy_file(older, kept);
  comm.barrier();
  first.save(path);
  comm.barrier();
  EXPECT_EQ(ShardFiles(path).size(), static_cast<std::size_t>(comm.size()))
      << "rank " << comm.rank();
  EXPECT_NE(MyShardFile(path, comm), older);
  EXPECT_FALSE(std::filesystem::exists(older));
  const std::vector<float> saved = WholeIterate(first);
  for (int t = 0; t < 2; ++t) ShardedRound(first);

  // A save that fails on rank W-1 (no room for its slice file: under mpirun
  // that rank alone, in one process every rank): every rank throws, the files
  // are as they were, and the second save still loads.
  comm.barrier();
  const std::vector<std::string> before = ShardFiles(path);
  {
    std::optional<FileSizeLimit> full;
    if (comm.rank() == comm.size() - 1) full.emplace(4096);
    comm.barrier();
    EXPECT_THROW(first.save(path), std::runtime_error) << "rank " << comm.rank();
    comm.barrier();
  }
  EXPECT_EQ(ShardFiles(path), before) << "rank " << comm.rank();
  {
    ShardedEngine old = ShardedEngine::load(path, comm);
    EXPECT_TRUE(SameBits(WholeIterate(old), saved));
  }

  // A slice file of another save (another iteration) is refused on every rank.
  comm.barrier();
  if (comm.rank() == 0) {
    std::filesystem::copy_file(kept, MyShardFile(path, comm),
                               std::filesystem::copy_options::overwrite_existing);
  }
  comm.barrier();
  EXPECT_THROW(ShardedEngine::load(path, comm), std::runtime_error) << "rank " << comm.rank();
  EXPECT_THROW(ShardedEngine::load(path + ".missing", comm), std::runtime_error);
  comm.barrier();
  std::filesystem::remove(kept);
  comm.barrier();
  if (comm.rank() == 0) RemoveShardedCheckpoint(path);
  comm.barrier();
}

// A rank that fails its row makes every rank throw RankFailure (abort) or
// drop the row everywhere (drop); the engine goes on after either.
inline void CheckShardedFailures(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  const std::vector<float> x0 = UniformStart(kManyBlocksDim, 6);
  for (OnFailure mode : {OnFailure::abort, OnFailure::drop}) {
    DistributedOptions dist;
    dist.on_failure = mode;
    ShardedEngine engine(x0, Adam{.lr = 0.02}, ShardedOptions(4, 3), comm, dist, true);
    ShardedRound(engine);
    ShardedBatch& b = engine.ask();
    NoisyQuadratic f;
    for (int i : b.rows()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
    const int failing = comm.size() - 1;
    if (comm.rank() == failing) engine.fail(b.rows().first, "simulated evaluation error");
    if (mode == OnFailure::abort) {
      try {
        engine.tell(b);
        ADD_FAILURE() << "rank " << comm.rank() << ": tell did not throw";
      } catch (const RankFailure& e) {
        EXPECT_EQ(e.rank(), failing);
        EXPECT_NE(std::string(e.what()).find("simulated evaluation error"), std::string::npos);
      }
      EXPECT_EQ(engine.engine().iteration(), 1);
      engine.tell(b);  // the batch is still pending; nothing failed this time
    } else {
      EXPECT_GE(engine.tell(b).dropped, 1);
    }
    EXPECT_EQ(engine.engine().iteration(), 2);
  }
}

}  // namespace optex::test
