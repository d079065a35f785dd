// The sharded engine on W threads (in-process communicator): its slices, its
// refusals, and the scenarios every communicator runs (sharded_scenarios.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "optex/in_process_communicator.hpp"
#include "run_on_ranks.hpp"
#include "sharded_scenarios.hpp"
#include "throws_with.hpp"

namespace optex::test {
namespace {

TEST(ShardOf, SlicesAreWholeBlocksCoveringTheVectorInOrder) {
  for (std::size_t d : {std::size_t{4096}, std::size_t{10000}, kManyBlocksDim}) {
    for (int w = 1; w <= static_cast<int>(block_count(d)) && w <= 5; ++w) {
      std::size_t next = 0;
      for (int r = 0; r < w; ++r) {
        const CoordinateShard s = shard_of(d, w, r);
        EXPECT_EQ(s.offset, next);
        EXPECT_EQ(s.offset % kCoordinateBlock, 0u);
        EXPECT_GT(s.size, 0u);
        EXPECT_EQ(s.dim, d);
        EXPECT_TRUE(s.is_whole());  // no sums attached yet
        next += s.size;
      }
      EXPECT_EQ(next, d) << "d = " << d << ", W = " << w;
      // Uneven: the first ranks hold one block more.
      EXPECT_GE(shard_of(d, w, 0).size, shard_of(d, w, w - 1).size);
    }
  }
}

TEST(ShardOf, RefusesMoreRanksThanBlocksAndBadRanks) {
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { (void)shard_of(8000, 3, 0); },
                                                {"fewer than the 3 ranks"}));
  EXPECT_THROW(shard_of(8000, 0, 0), std::invalid_argument);
  EXPECT_THROW(shard_of(8000, 2, 2), std::invalid_argument);
  EXPECT_THROW(shard_of(8000, 2, -1), std::invalid_argument);
}

TEST(SliceRanges, CutsEveryRangeToTheSliceKeepingItsHyperparameters) {
  const OptimizerRanges whole{
      {10, Adam{.lr = 0.1}}, {20, Adam{.lr = 0.2}, 3}, {5, Adam{.lr = 0.3}}};
  const OptimizerRanges part = slice_ranges(whole, 8, 25);  // [8, 33)
  ASSERT_EQ(part.count(), 3u);
  EXPECT_EQ(part[0].size, 2u);
  EXPECT_EQ(part[1].size, 20u);
  EXPECT_EQ(part[1].step_offset, 3);
  EXPECT_EQ(part[2].size, 3u);
  EXPECT_EQ(std::get<Adam>(part[2].optimizer).lr, 0.3);
  EXPECT_THROW(slice_ranges(whole, 30, 10), std::invalid_argument);
  EXPECT_THROW(slice_ranges(whole, 0, 0), std::invalid_argument);
  // One optimizer for every coordinate stays one.
  EXPECT_TRUE(slice_ranges(OptimizerRanges(Adam{}), 4096, 100).covers_any_dimension());
}

// Sums that are already complete (one slice), failing at the call numbered
// `fail_at` (counted from the last reset).
class FailingSums final : public ShardSums {
 public:
  void sum(std::span<double>) override { count(); }
  void all(std::span<char>) override { count(); }
  void reset(int fail_at) {
    calls_ = 0;
    fail_at_ = fail_at;
  }
  int calls() const { return calls_; }

 private:
  void count() {
    if (calls_++ == fail_at_) throw CommunicatorError("sums: simulated failure");
  }
  int calls_ = 0;
  int fail_at_ = -1;
};

// A completion that fails anywhere in tell() (a peer that died) leaves the
// slice engine exactly as it was: the retried tell() gives the same bits as a
// twin that never failed.
TEST(ShardedEngine, AFailedCompletionInTellChangesNothing) {
  const std::size_t d = 2 * kCoordinateBlock + 5;
  const std::vector<float> x0 = UniformStart(d, 3);
  const Options options = ShardedOptions(3, 9);
  FailingSums sums;
  const CoordinateShard shard{d, 0, d, &sums};
  Engine slice(x0, Adam{.lr = 0.02}, options, shard);
  Engine twin(x0, Adam{.lr = 0.02}, options);
  NoisyQuadratic f;
  const auto evaluate = [&](Batch& b) {
    for (int i = 0; i < b.size(); ++i)
      b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
  };
  for (int t = 0; t < 8; ++t) {
    sums.reset(-1);
    Batch& b = slice.ask();
    evaluate(b);
    sums.reset(-1);
    slice.tell(b);  // count the completions of one tell
    const int calls = sums.calls();
    ASSERT_GT(calls, 2);
    Batch& tb = twin.ask();
    evaluate(tb);
    twin.tell(tb);
    ASSERT_TRUE(SameEngine(slice, twin)) << "round " << t;
    // The next round: fail each completion of its tell once, then succeed.
    sums.reset(-1);
    Batch& next = slice.ask();
    evaluate(next);
    for (int k = 0; k < calls; ++k) {
      sums.reset(k);
      EXPECT_THROW(slice.tell(next), CommunicatorError) << "round " << t << ", completion " << k;
      EXPECT_TRUE(slice.pending());
      EXPECT_EQ(slice.iteration(), twin.iteration());
    }
    sums.reset(-1);
    slice.tell(next);
    Batch& tnext = twin.ask();
    evaluate(tnext);
    twin.tell(tnext);
    ASSERT_TRUE(SameEngine(slice, twin)) << "round " << t << " after the failures";
  }
}

TEST(ShardedEngine, FollowsTheWholeEngineBitForBitWithOneBlockPerRank) {
  for (int w : {1, 2, 3, 4}) {
    RunOnRanks(w, [&](Communicator& comm) {
      CheckFollowsWholeEngine(comm, OneBlockPerRankDim(w), Adam{.lr = 0.02}, true);
    });
  }
}

TEST(ShardedEngine, FollowsTheWholeEngineWithinToleranceWithUnevenSlices) {
  for (int w : {2, 3, 4}) {
    RunOnRanks(w, [&](Communicator& comm) {
      CheckFollowsWholeEngine(comm, kManyBlocksDim, Sgd{.lr = 0.05, .momentum = 0.9}, false);
    });
  }
}

TEST(ShardedEngine, HybridGroupsAverageTheirMinibatchesLikeOneProcess) {
  RunOnRanks(4, [&](Communicator& comm) {
    CheckFollowsWholeEngine(comm, OneBlockPerRankDim(4), Adam{.lr = 0.02}, true, 2, 20);
  });
}

// The adaptive strategy's chain and its noise measurement (sums over
// coordinates) on slices: the same splits, the same bits.
TEST(ShardedEngine, AdaptiveStrategyFollowsTheWholeEngineBitForBit) {
  Options adaptive = Options::adaptive(4);
  adaptive.seed = 5;
  adaptive.history = 12;
  RunOnRanks(3, [&](Communicator& comm) {
    CheckFollowsWholeEngine(comm, OneBlockPerRankDim(3), Adam{.lr = 0.02}, true, 1, 30, adaptive);
  });
}

TEST(ShardedEngine, RepeatsBitForBitOnEveryRank) {
  RunOnRanks(3, [](Communicator& comm) { CheckRepeatsBitForBit(comm); });
}

TEST(ShardedEngine, CheckpointsResumeBitForBitAndSurviveAFailedSave) {
  for (int w : {1, 3}) {
    const std::string path =
        ::testing::TempDir() + "optex_sharded_" + std::to_string(w) + "_" +
        std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + ".ckpt";
    RunOnRanks(w, [&](Communicator& comm) { CheckShardedCheckpoint(comm, path); });
  }
}

// Every way a manifest can be wrong is refused on every rank, naming the
// problem, and the ranks' paths must agree before anything is written.
TEST(ShardedEngine, BadManifestsAndPathsAreRefusedOnEveryRank) {
  const std::string path = ::testing::TempDir() + "optex_sharded_manifest_" +
                           std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  RunOnRanks(2, [&](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    ShardedEngine engine(UniformStart(kManyBlocksDim, 5), Adam{}, ShardedOptions(2, 2), comm, {},
                         true);
    ShardedRound(engine);
    engine.save(path);
    std::string good;
    if (comm.rank() == 0) {
      std::ifstream in(path);
      good.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto replace = [&](std::string_view from, std::string_view to) {
      std::string text = good;
      const auto at = text.find(from);
      if (at != std::string::npos) text.replace(at, from.size(), to);
      return text;
    };
    const std::pair<std::string, std::string> cases[] = {
        {good.substr(0, good.size() / 2), "truncated"},
        {"", "not a sharded optex checkpoint"},
        {replace("ranks 2", "ranks 3"), "line"},
        {replace("generation", "generation c #"), "generation"},
        {replace("dim " + std::to_string(kManyBlocksDim), "dim 99999999999999999999"), "dim"},
        {good + "tag 2 7\n", "unexpected text"},
        {replace("optex sharded checkpoint 1", "optex sharded checkpoint 9"),
         "not a sharded optex checkpoint"},
    };
    for (const auto& [text, needle] : cases) {
      if (comm.rank() == 0) std::ofstream(path, std::ios::trunc) << text;
      comm.barrier();
      EXPECT_TRUE(
          ThrowsWith<std::runtime_error>([&] { (void)ShardedEngine::load(path, comm); }, {needle}))
          << "case " << needle << ", rank " << comm.rank();
      comm.barrier();
    }
    // A directory where the manifest should be: refused, and left as it is.
    if (comm.rank() == 0) {
      std::filesystem::remove(path);
      std::filesystem::create_directory(path);
    }
    comm.barrier();
    EXPECT_THROW((void)ShardedEngine::load(path, comm), std::runtime_error);
    EXPECT_THROW(engine.save(path), std::runtime_error);
    comm.barrier();
    EXPECT_TRUE(std::filesystem::is_directory(path));
    // Ranks that pass different paths: refused before anything is written.
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] { engine.save(path + ".rank" + std::to_string(comm.rank())); }, {"different paths"}));
    EXPECT_FALSE(std::filesystem::exists(path + ".rank0"));
    comm.barrier();
    if (comm.rank() == 0) {
      std::filesystem::remove_all(path);
      for (const char* file :
           {".shard-0-of-2.a", ".shard-1-of-2.a", ".shard-0-of-2.b", ".shard-1-of-2.b"}) {
        std::filesystem::remove(path + file);
      }
    }
  });
}

TEST(ShardedEngine, AFailedRowIsReportedToEveryRank) {
  RunOnRanks(3, [](Communicator& comm) { CheckShardedFailures(comm); });
}

TEST(ShardedEngine, ARankThatStopsMakesTheOthersTimeOutInsteadOfHanging) {
  RunOnRanks(3, [](Communicator& comm) {
    comm.set_timeout(std::chrono::seconds(2));
    ShardedEngine engine(UniformStart(kManyBlocksDim, 1), Adam{}, ShardedOptions(3, 1), comm, {},
                         true);
    ShardedRound(engine);
    if (comm.rank() == 1) return;  // stops calling the engine
    EXPECT_THROW(ShardedRound(engine), CommunicatorError) << "rank " << comm.rank();
  });
}

TEST(ShardedEngine, RefusesOnEveryRankWhatItCannotRun) {
  RunOnRanks(2, [](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    const std::vector<float> small = UniformStart(5000, 1);  // 2 blocks
    Options target = ShardedOptions(2, 1);
    target.proxy = Proxy::target;
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] {
          (void)ShardedEngine(UniformStart(kManyBlocksDim, 1), Adam{}, target, comm, {}, true);
        },
        {"Proxy::target"}));
    // Far more history than the machine has memory: refused before allocation.
    Options huge = ShardedOptions(2, 1);
    huge.history = 4096;
    const std::vector<float> large(25'000'000, 0.5f);  // 400 GB of history per rank
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] { (void)ShardedEngine(large, Adam{}, huge, comm, {}, true); },
        {"needs", "bytes", "available"}));
    // A GPU engine with host rows: the exchanges would move rows that are not there.
    Options on_gpu = ShardedOptions(2, 1);
    on_gpu.device = Device::cuda(0);
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] {
          (void)ShardedEngine(UniformStart(kManyBlocksDim, 1), Adam{}, on_gpu, comm, {}, true);
        },
        {"device", "cuda:0"}));
    // Another dimension on one rank.
    const std::vector<float> x0 = UniformStart(comm.rank() == 0 ? kManyBlocksDim : 9000, 1);
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] { (void)ShardedEngine(x0, Adam{}, ShardedOptions(2, 1), comm, {}, true); },
        {"dimension"}));
    // Non-finite start, seen by the rank that owns the coordinate.
    std::vector<float> bad = UniformStart(kManyBlocksDim, 1);
    bad[kManyBlocksDim - 1] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(ShardedEngine(bad, Adam{}, ShardedOptions(2, 1), comm, {}, true),
                 std::invalid_argument);
    // Two ranks with one block each are fine; three would not be.
    EXPECT_NO_THROW(ShardedEngine(small, Adam{}, ShardedOptions(2, 1), comm, {}, true));
  });
  RunOnRanks(3, [](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] {
          (void)ShardedEngine(UniformStart(5000, 1), Adam{}, ShardedOptions(3, 1), comm, {}, true);
        },
        {"blocks"}));
  });
}

TEST(ShardedEngine, PerRankMemoryFallsAsOneOverW) {
  const Options options = ShardedOptions(4, 1);
  const std::size_t d = 64 * kCoordinateBlock;
  const ShardMemory one = shard_memory(d, 1, 0, options, Adam{});
  for (int w : {2, 4, 8}) {
    const ShardMemory m = shard_memory(d, w, 0, options, Adam{});
    EXPECT_EQ(m.history * static_cast<std::size_t>(w), one.history);
    EXPECT_EQ(m.optimizer * static_cast<std::size_t>(w), one.optimizer);
  }
  EXPECT_EQ(one.history, 2u * 12u * d * sizeof(float));
}

TEST(ShardedEngine, UnchangedRangesAcrossSlicesKeepTheirCoordinates) {
  RunOnRanks(2, [](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    ShardedEngine engine(UniformStart(kManyBlocksDim, 3), Adam{.lr = 0.05}, ShardedOptions(2, 4),
                         comm, {}, true);
    ShardedRound(engine);
    const std::vector<float> before = WholeIterate(engine);
    // A range that straddles the two slices.
    const std::size_t straddle =
        engine.shard().offset == 0 ? engine.shard().size - 10 : engine.shard().offset - 10;
    std::size_t first = straddle;
    comm.broadcast(std::span<std::size_t>(&first, 1), 0);
    const CoordinateRange kept{first, 20};
    NoisyQuadratic f;
    ShardedBatch& b = engine.ask();
    for (int i : b.rows()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
    engine.tell(b, {&kept, 1});
    const std::vector<float> after = WholeIterate(engine);
    for (std::size_t j = first; j < first + 20; ++j) EXPECT_EQ(after[j], before[j]) << j;
    EXPECT_NE(after[first + 30], before[first + 30]);
    // A range past the end is refused on every rank, and the batch stays pending.
    const CoordinateRange outside{kManyBlocksDim - 5, 10};
    ShardedBatch& c = engine.ask();
    for (int i : c.rows()) c.loss(i) = f.EvaluateWithGradient(c.point(i), c.grad(i), c.seed(i));
    EXPECT_THROW(engine.tell(c, {&outside, 1}), std::invalid_argument);
    EXPECT_TRUE(engine.engine().pending());
    engine.tell(c);
  });
}

}  // namespace
}  // namespace optex::test
