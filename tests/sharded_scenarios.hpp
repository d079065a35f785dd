// Checks of the sharded engine that every host communicator must pass. Each
// function runs on every rank of a world with that rank's communicator: W
// threads in test_sharded_engine.cpp, W processes under mpirun in
// test_sharded_engine_mpi.cpp.
//
// The reference is a whole (unsharded) Engine with the same options that
// every rank runs on the side, evaluating all N rows itself.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed_scenarios.hpp"
#include "engine_equality.hpp"
#include "optex/block_pool.hpp"
#include "optex/sharded_engine.hpp"
#include "test_support.hpp"

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

// save, run on, and a load of the save resumes bit for bit; a save that
// fails on one rank leaves the previous checkpoint loadable; files that do
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

  // A second save goes to the other generation; make rank W-1's file of the
  // next one a directory, so that its save fails: every rank throws, and the
  // manifest still names the complete set of the second save.
  first.save(path);
  const std::vector<float> saved = WholeIterate(first);
  for (int t = 0; t < 2; ++t) ShardedRound(first);
  const std::string blocked = path + ".shard-" + std::to_string(comm.size() - 1) + "-of-" +
                              std::to_string(comm.size()) + ".a";
  if (comm.rank() == comm.size() - 1) {
    std::filesystem::remove(blocked);
    std::filesystem::create_directory(blocked);
  }
  comm.barrier();
  EXPECT_THROW(first.save(path), std::runtime_error) << "rank " << comm.rank();
  ShardedEngine old = ShardedEngine::load(path, comm);
  EXPECT_TRUE(SameBits(WholeIterate(old), saved));
  comm.barrier();
  if (comm.rank() == comm.size() - 1) std::filesystem::remove(blocked);

  // A slice file of another generation (another iteration) is refused.
  const std::string mine =
      path + ".shard-" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size());
  comm.barrier();
  first.save(path);  // generation a now, the b files are a save older
  comm.barrier();
  if (comm.rank() == 0)
    std::filesystem::copy_file(mine + ".b", mine + ".a",
                               std::filesystem::copy_options::overwrite_existing);
  comm.barrier();
  EXPECT_THROW(ShardedEngine::load(path, comm), std::runtime_error) << "rank " << comm.rank();
  EXPECT_THROW(ShardedEngine::load(path + ".missing", comm), std::runtime_error);
  comm.barrier();
  if (comm.rank() == 0) {
    std::filesystem::remove(path);
    for (int r = 0; r < comm.size(); ++r) {
      for (const char* g : {".a", ".b"}) {
        std::filesystem::remove(path + ".shard-" + std::to_string(r) + "-of-" +
                                std::to_string(comm.size()) + g);
      }
    }
  }
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
