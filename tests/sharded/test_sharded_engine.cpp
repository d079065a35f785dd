// The sharded engine on W threads (in-process communicator): its slices, its
// refusals, and the scenarios every communicator runs (sharded_scenarios.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <barrier>
#include <cctype>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distributed/run_on_ranks.hpp"
#include "optex/distributed/in_process_communicator.hpp"
#include "sharded/sharded_scenarios.hpp"
#include "support/throws_with.hpp"

namespace optex::test {
namespace {

// A path in the test's temporary directory, its own per test and process.
std::string TempPath(const std::string& prefix) {
  return ::testing::TempDir() + prefix + std::to_string(::getpid()) + "_" +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Both engines hold the same slice bit for bit (the history and its
// statistics included) and the same whole ranges.
::testing::AssertionResult SameShardedEngine(const ShardedEngine& a, const ShardedEngine& b) {
  if (!(a.optimizer_ranges() == b.optimizer_ranges())) {
    return ::testing::AssertionFailure() << "whole optimizer ranges differ";
  }
  if (a.shard().offset != b.shard().offset || a.shard().size != b.shard().size) {
    return ::testing::AssertionFailure() << "slices differ";
  }
  return SameEngine(a.engine(), b.engine());
}

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

// The verified mode on slices: the replay's disagreements are sums over
// coordinates, completed across the slices, so every slice commits the steps
// the whole engine commits, bit for bit.
TEST(ShardedEngine, VerifiedModeFollowsTheWholeEngineBitForBit) {
  for (const double tolerance : {0.0, 1e-4}) {
    Options verified = Options::verified(4, tolerance);
    verified.seed = 5;
    verified.history = 12;
    RunOnRanks(3, [&](Communicator& comm) {
      CheckFollowsWholeEngine(comm, OneBlockPerRankDim(3), Adam{.lr = 0.02}, true, 1, 30, verified);
    });
  }
}

TEST(ShardedEngine, RepeatsBitForBitOnEveryRank) {
  RunOnRanks(3, [](Communicator& comm) { CheckRepeatsBitForBit(comm); });
}

TEST(ShardedEngine, CheckpointsResumeBitForBitAndSurviveAFailedSave) {
  for (int w : {1, 3}) {
    const std::string path = TempPath("optex_sharded_" + std::to_string(w) + "_") + ".ckpt";
    RunOnRanks(w, [&](Communicator& comm) { CheckShardedCheckpoint(comm, path); });
  }
}

// Every way a manifest can be wrong is refused on every rank, naming the
// problem, and the ranks' paths must agree before anything is written.
TEST(ShardedEngine, BadManifestsAndPathsAreRefusedOnEveryRank) {
  const std::string path = TempPath("optex_sharded_manifest_");
  RunOnRanks(2, [&](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    ShardedEngine engine(UniformStart(kManyBlocksDim, 5), Adam{}, ShardedOptions(2, 2), comm, {},
                         true);
    ShardedRound(engine);
    engine.save(path);
    std::string good;
    if (comm.rank() == 0) good = ReadFile(path);
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
        {replace("token ", "token c #"), "token"},
        {replace("ranks 2", "ranks 2 junk"), "line 2: ranks: 2 values, expected 1"},
        {replace("dim " + std::to_string(kManyBlocksDim), "dim 99999999999999999999"), "dim"},
        {replace("dim " + std::to_string(kManyBlocksDim),
                 "dim " + std::to_string(kManyBlocksDim) + ".9"),
         "line 3: dim"},
        {replace("ranks 2", "ranks +2"), "not a number"},
        {replace("ranks 2", "ranks 02"), "not a number"},
        {replace("iteration 1", "iteration -1"), "not a number"},
        {replace("iteration 1", "iteration 1 "), "single spaces"},
        {replace("\ncheck ", "\ncheck  "), "single spaces"},
        {good + "tag 2 7\n", "unexpected text"},
        {good + " ", "unexpected text"},
        {replace("optex sharded checkpoint 2", "optex sharded checkpoint 9"),
         "not a sharded optex checkpoint"},
        // The sizes of the ranges, changed on a slice boundary: the checksum.
        {replace("ranges 1 " + std::to_string(kManyBlocksDim),
                 "ranges 2 16384 " + std::to_string(kManyBlocksDim - 16384)),
         "check"},
    };
    for (const auto& [text, needle] : cases) {
      if (comm.rank() == 0) WriteFile(path, text);
      comm.barrier();
      EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { (void)ShardedEngine::load(path, comm); },
                                                 {needle, path}))
          << "case " << needle << ", rank " << comm.rank();
      comm.barrier();
    }
    // A directory where the manifest should be: refused, and left as it is;
    // the save that could not replace it leaves none of its slice files.
    if (comm.rank() == 0) {
      std::filesystem::remove(path);
      std::filesystem::create_directory(path);
    }
    comm.barrier();
    const std::vector<std::string> before = ShardFiles(path);
    EXPECT_THROW((void)ShardedEngine::load(path, comm), std::runtime_error);
    EXPECT_THROW(engine.save(path), std::runtime_error);
    comm.barrier();
    EXPECT_TRUE(std::filesystem::is_directory(path));
    EXPECT_EQ(ShardFiles(path), before);
    // Ranks that pass different paths: refused before anything is written.
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] { engine.save(path + ".rank" + std::to_string(comm.rank())); }, {"different paths"}));
    EXPECT_FALSE(std::filesystem::exists(path + ".rank0"));
    comm.barrier();
    if (comm.rank() == 0) RemoveShardedCheckpoint(path);
  });
}

// Two jobs (two worlds of ranks running different engines) save to one path
// at the same time, again and again. Each save is atomic as a set: whichever
// manifest lands last names a complete set of its own job's slices, which
// loads and equals that job's engine bit for bit, on every rank; and the sets
// replaced are removed (one set is left).
TEST(ShardedEngine, ConcurrentSavesToOnePathEachLandWhole) {
  constexpr int kRanks = 2;
  constexpr int kTrials = 50;
  const std::string path = TempPath("optex_sharded_concurrent_");
  std::barrier sync(2 * kRanks);
  std::array<std::array<const ShardedEngine*, kRanks>, 2> engines{};
  std::array<std::atomic<int>, 2> wins{};
  const auto job = [&](int j) {
    RunOnRanks(kRanks, [&](Communicator& comm) {
      comm.set_timeout(kTestTimeout);
      const auto r = static_cast<std::size_t>(comm.rank());
      // A rank that fails leaves the barrier, so that no thread waits for it.
      struct Leave {
        std::barrier<>& sync;
        bool done = false;
        ~Leave() {
          if (!done) sync.arrive_and_drop();
        }
      } leave{sync};
      ShardedEngine engine(UniformStart(kManyBlocksDim, 10 + j), Adam{.lr = 0.02},
                           ShardedOptions(3, static_cast<std::uint64_t>(20 + j)), comm, {}, true);
      engines[static_cast<std::size_t>(j)][r] = &engine;
      for (int t = 0; t < kTrials; ++t) {
        ShardedRound(engine);
        sync.arrive_and_wait();
        try {
          engine.save(path);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "trial " << t << ", job " << j << ", rank " << r << ": " << e.what();
        }
        sync.arrive_and_wait();
        int match = -1;
        try {
          const ShardedEngine loaded = ShardedEngine::load(path, comm);
          for (int k : {0, 1}) {
            if (SameShardedEngine(loaded, *engines[static_cast<std::size_t>(k)][r])) match = k;
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << "trial " << t << ", job " << j << ", rank " << r << ": " << e.what();
        }
        EXPECT_NE(match, -1) << "trial " << t << ", job " << j << ", rank " << r
                             << ": the checkpoint equals neither job's engine";
        // Every rank holds a slice of the same job's engine.
        std::array<int, kRanks> all{};
        comm.all_gather(std::span<const int>(&match, 1), std::span<int>(all));
        for (int m : all) EXPECT_EQ(m, all[0]) << "trial " << t << ": a mixed set";
        if (j == 0 && r == 0) {
          EXPECT_EQ(ShardFiles(path).size(), static_cast<std::size_t>(kRanks)) << "trial " << t;
          if (match >= 0) ++wins[static_cast<std::size_t>(match)];
        }
        sync.arrive_and_wait();
      }
      leave.done = true;
    });
  };
  std::thread first(job, 0);
  std::thread second(job, 1);
  first.join();
  second.join();
  std::printf("concurrent sharded saves: job 0 landed last %d times, job 1 %d times of %d\n",
              wins[0].load(), wins[1].load(), kTrials);
  RemoveShardedCheckpoint(path);
}

// Loads while another job saves to the same path again and again: a save
// removes the set it replaced, so a load may find the files of the manifest it
// read gone; it then reads the new manifest. Every load succeeds and equals
// the saved engine (the saver's state does not change, only its tokens).
TEST(ShardedEngine, LoadsWhileAnotherJobSavesReadAWholeSet) {
  constexpr int kRanks = 2;
  constexpr int kSaves = 40;
  const std::string path = TempPath("optex_sharded_load_while_saving_");
  std::atomic<const ShardedEngine*> saver_engines[kRanks] = {};
  std::atomic<int> ready{0};
  std::atomic<bool> saving{true};
  std::atomic<int> loads{0};
  std::thread saver([&] {
    RunOnRanks(kRanks, [&](Communicator& comm) {
      comm.set_timeout(kTestTimeout);
      ShardedEngine engine(UniformStart(kManyBlocksDim, 4), Adam{.lr = 0.02}, ShardedOptions(2, 9),
                           comm, {}, true);
      ShardedRound(engine);
      engine.save(path);
      saver_engines[comm.rank()] = &engine;
      comm.barrier();
      ++ready;
      for (int k = 0; k < kSaves; ++k) {
        engine.save(path);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      comm.barrier();
      if (comm.rank() == 0) saving = false;
      // Stay until the loader is done with the engine.
      while (ready.load() < 2 * kRanks + 1) std::this_thread::yield();
    });
  });
  RunOnRanks(kRanks, [&](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    while (ready.load() < kRanks) std::this_thread::yield();
    const ShardedEngine& saved = *saver_engines[comm.rank()];
    for (char more = 1; more != 0;) {
      try {
        const ShardedEngine loaded = ShardedEngine::load(path, comm);
        EXPECT_TRUE(SameShardedEngine(loaded, saved)) << "rank " << comm.rank();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << comm.rank() << ": " << e.what();
      }
      if (comm.rank() == 0) {
        ++loads;
        more = saving.load() ? 1 : 0;
      }
      comm.broadcast(std::span<char>(&more, 1), 0);
    }
    ++ready;
  });
  ++ready;
  saver.join();
  std::printf("%d loads during %d saves\n", loads.load(), kSaves);
  EXPECT_EQ(ShardFiles(path).size(), static_cast<std::size_t>(kRanks));
  RemoveShardedCheckpoint(path);
}

// A save that fails on one rank alone, after the others wrote their slices
// (rank 0, whose slice has two blocks, has no room for it: the others' have
// one): every rank throws, the slice files that were written are removed, and
// the previous checkpoint loads and equals what it saved.
TEST(ShardedEngine, ASaveThatFailsOnOneRankLeavesThePreviousCheckpoint) {
  constexpr int kRanks = 4;
  const std::size_t d = (kRanks + 1) * kCoordinateBlock - 100;  // rank 0: 2 blocks
  const std::string path = TempPath("optex_sharded_one_rank_");
  RunOnRanks(kRanks, [&](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    ShardedEngine engine(UniformStart(d, 7), Adam{.lr = 0.02}, ShardedOptions(4, 5), comm, {},
                         true);
    ASSERT_EQ(engine.shard().size, comm.rank() == 0            ? 2 * kCoordinateBlock
                                   : comm.rank() == kRanks - 1 ? kCoordinateBlock - 100
                                                               : kCoordinateBlock);
    for (int t = 0; t < 3; ++t) ShardedRound(engine);
    engine.save(path);
    comm.barrier();
    // Room for every slice file but rank 0's.
    std::uintmax_t others = 0;
    const std::uintmax_t rank0 = std::filesystem::file_size(MyShardFile(path, comm));
    const auto mine = static_cast<std::uint64_t>(rank0);
    std::array<std::uint64_t, kRanks> sizes{};
    comm.all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(sizes));
    for (std::size_t r = 1; r < kRanks; ++r) others = std::max<std::uintmax_t>(others, sizes[r]);
    ASSERT_GT(sizes[0], others + 4096);
    const auto before = CheckpointFiles(path);
    std::vector<float> saved = WholeIterate(engine);
    ShardedRound(engine);
    comm.barrier();
    {
      std::optional<FileSizeLimit> full;
      if (comm.rank() == 0) full.emplace(static_cast<rlim_t>(others + 2048));
      comm.barrier();
      // Rank 0 throws its own error, the others name it.
      std::vector<std::string> needles = {"File too large"};
      if (comm.rank() != 0) needles.push_back("ShardedEngine::save: rank 0 failed");
      EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { engine.save(path); }, needles))
          << "rank " << comm.rank();
      comm.barrier();
    }
    comm.barrier();
    EXPECT_TRUE(CheckpointFiles(path) == before) << "rank " << comm.rank();
    ShardedEngine old = ShardedEngine::load(path, comm);
    EXPECT_TRUE(SameBits(WholeIterate(old), saved));
    ShardedRound(old);
    comm.barrier();
    if (comm.rank() == 0) RemoveShardedCheckpoint(path);
  });
}

// Format 1 (generations a and b, no checksum) still loads, as strictly.
TEST(ShardedEngine, LoadsFormatOneManifests) {
  const std::string path = TempPath("optex_sharded_format1_");
  const std::string saved = path + ".v2";
  RunOnRanks(2, [&](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    ShardedEngine engine(UniformStart(kManyBlocksDim, 3), Adam{.lr = 0.02}, ShardedOptions(3, 4),
                         comm, {}, true);
    for (int t = 0; t < 3; ++t) ShardedRound(engine);
    engine.save(saved);
    // What the format-1 writer made of it: the slice files as generation b,
    // tags of the shared state and the slice's iterate.
    const std::span<const float> x = engine.engine().iterate();
    const std::uint64_t tag =
        mix_seed(engine.state_hash(),
                 fnv1a64(reinterpret_cast<const unsigned char*>(x.data()), x.size_bytes()));
    std::array<std::uint64_t, 2> tags{};
    comm.all_gather(std::span<const std::uint64_t>(&tag, 1), std::span<std::uint64_t>(tags));
    std::filesystem::copy_file(MyShardFile(saved, comm),
                               path + ".shard-" + std::to_string(comm.rank()) + "-of-2.b");
    const std::string v1 =
        "optex sharded checkpoint 1\nranks 2\ndim " + std::to_string(kManyBlocksDim) +
        "\ngeneration b\niteration 3\nranges 1 " + std::to_string(kManyBlocksDim) + "\ntag 0 " +
        std::to_string(tags[0]) + "\ntag 1 " + std::to_string(tags[1]) + "\n";
    if (comm.rank() == 0) WriteFile(path, v1);
    comm.barrier();
    {
      ShardedEngine loaded = ShardedEngine::load(path, comm);
      EXPECT_TRUE(SameShardedEngine(loaded, engine)) << "rank " << comm.rank();
      ShardedRound(loaded);
    }
    comm.barrier();
    if (comm.rank() == 0) WriteFile(path, v1 + "junk\n");
    comm.barrier();
    EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { (void)ShardedEngine::load(path, comm); },
                                               {"line 9", "unexpected text"}));
    comm.barrier();
    if (comm.rank() == 0) WriteFile(path, v1);
    comm.barrier();
    // A save over it removes the format-1 files.
    engine.save(path);
    comm.barrier();
    EXPECT_EQ(ShardFiles(path).size(), 2u);
    EXPECT_FALSE(std::filesystem::exists(path + ".shard-0-of-2.b"));
    {
      ShardedEngine loaded = ShardedEngine::load(path, comm);
      EXPECT_TRUE(SameShardedEngine(loaded, engine)) << "rank " << comm.rank();
    }
    comm.barrier();
    if (comm.rank() == 0) {
      RemoveShardedCheckpoint(path);
      RemoveShardedCheckpoint(saved);
    }
  });
}

// The manifest of a 3-rank checkpoint, altered every way: each line removed,
// duplicated, extended with trailing text, each field changed to other numbers
// (valid-looking or not), truncated at every byte, extended at the end. As
// written (the checksum no longer matches) every one is refused, naming the
// path and the line. With the checksum recomputed each is refused naming the
// path, or loads an engine equal to the saved one that takes a step. A refused
// load changes no file.
TEST(ShardedEngine, FuzzedManifestsAreRefusedOrLoadTheSavedEngine) {
  constexpr int kRanks = 3;
  const std::string path = TempPath("optex_sharded_fuzz_");
  RunOnRanks(kRanks, [&](Communicator& comm) {
    comm.set_timeout(kTestTimeout);
    const std::size_t d = OneBlockPerRankDim(kRanks);
    const OptimizerRanges ranges{{5000, adamw(0.02, 0.01)}, {d - 5000, Adam{.lr = 0.01}}};
    ShardedEngine engine(UniformStart(d, 8), ranges, ShardedOptions(3, 6), comm, {}, true);
    for (int t = 0; t < 3; ++t) ShardedRound(engine);
    engine.save(path);
    comm.barrier();
    const std::string good = ReadFile(path);
    const auto baseline = CheckpointFiles(path);

    // The lines, without their newlines; the last is the checksum.
    std::vector<std::string> lines;
    for (std::size_t at = 0; at < good.size();) {
      const std::size_t end = good.find('\n', at);
      lines.push_back(good.substr(at, end - at));
      at = end + 1;
    }
    ASSERT_EQ(lines.size(), 7u + kRanks);
    ASSERT_TRUE(lines.back().starts_with("check "));
    const auto join = [](const std::vector<std::string>& body) {
      std::string text;
      for (const std::string& line : body) text += line + '\n';
      return text;
    };
    const auto seal = [&](const std::string& text) {
      return text + "check " + [&] {
        const std::uint64_t h =
            fnv1a64(reinterpret_cast<const unsigned char*>(text.data()), text.size());
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        return std::string(hex);
      }() + '\n';
    };
    ASSERT_EQ(seal(join({lines.begin(), lines.end() - 1})), good);

    // Other values for a field: neighbours, the edges, and numbers written
    // every other way.
    const auto others = [](const std::string& field) {
      std::vector<std::string> v = {"0",
                                    "1",
                                    "+" + field,
                                    "-" + field,
                                    "0" + field,
                                    "",
                                    field + ".9",
                                    field + "x",
                                    field + "e0",
                                    " " + field,
                                    "18446744073709551615",
                                    "18446744073709551616",
                                    "99999999999999999999999",
                                    "-0",
                                    "0x1",
                                    "a"};
      std::uint64_t n = 0;
      if (std::from_chars(field.data(), field.data() + field.size(), n).ec == std::errc()) {
        v.push_back(std::to_string(n + 1));
        if (n > 0) v.push_back(std::to_string(n - 1));
        v.push_back(std::to_string(n * 2));
        v.push_back(std::to_string(n / 2));
        v.push_back(std::to_string(n + 4096));
      }
      if (field.size() == 16) {  // a hexadecimal token or checksum
        std::string flipped = field;
        flipped[15] = flipped[15] == '0' ? '1' : '0';
        v.push_back(flipped);
        std::string upper = field;
        for (char& c : upper) c = static_cast<char>(std::toupper(c));
        v.push_back(upper);
        v.push_back(field.substr(1));
        v.push_back(field + "0");
      }
      std::erase(v, field);
      return v;
    };
    std::vector<std::vector<std::string>> bodies;  // altered lines, before the checksum
    const std::vector<std::string> body(lines.begin(), lines.end() - 1);
    for (std::size_t i = 0; i < body.size(); ++i) {
      std::vector<std::string> b = body;
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(i));
      bodies.push_back(b);
      b = body;
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(i), body[i]);
      bodies.push_back(b);
      for (const char* tail : {" ", " 0", " junk", "\t", "\r", " 1 2"}) {
        b = body;
        b[i] += tail;
        bodies.push_back(b);
      }
      // Each field (the key too) replaced.
      std::vector<std::string> fields;
      for (std::size_t at = 0;;) {
        const std::size_t space = body[i].find(' ', at);
        fields.push_back(body[i].substr(at, space - at));
        if (space == std::string::npos) break;
        at = space + 1;
      }
      for (std::size_t f = 0; f < fields.size(); ++f) {
        for (const std::string& other : others(fields[f])) {
          std::vector<std::string> changed = fields;
          changed[f] = other;
          std::string line;
          for (const std::string& x : changed) line += (line.empty() ? "" : " ") + x;
          b = body;
          b[i] = line;
          bodies.push_back(b);
        }
      }
      if (i + 1 < body.size()) {
        b = body;
        std::swap(b[i], b[i + 1]);
        bodies.push_back(b);
      }
    }
    // As written (the old checksum) and resealed.
    std::vector<std::pair<std::string, bool>> cases;  // text, must name a line
    for (const auto& b : bodies) {
      cases.emplace_back(join(b) + lines.back() + '\n', true);
      cases.emplace_back(seal(join(b)), false);
    }
    for (const std::string& other : others(lines.back().substr(6))) {
      cases.emplace_back(join(body) + "check " + other + '\n', true);
    }
    cases.emplace_back(join(body), true);  // no checksum
    for (std::size_t n = 0; n < good.size(); ++n) cases.emplace_back(good.substr(0, n), true);
    for (const char* tail : {"x", "\n", " ", "check 0\n", "tag 3 7\n", "\0"}) {
      cases.emplace_back(good + std::string(tail, std::max<std::size_t>(std::strlen(tail), 1)),
                         true);
    }
    cases.emplace_back(good + lines.back() + '\n', true);

    int refused = 0;
    int accepted = 0;
    for (const auto& [text, names_line] : cases) {
      if (text == good) continue;
      if (comm.rank() == 0) WriteFile(path, text);
      comm.barrier();
      std::string error;
      try {
        ShardedEngine loaded = ShardedEngine::load(path, comm);
        EXPECT_TRUE(SameShardedEngine(loaded, engine)) << "rank " << comm.rank() << ", manifest\n"
                                                       << text;
        ShardedRound(loaded);
        ++accepted;
      } catch (const std::runtime_error& e) {
        error = e.what();
        ++refused;
      }
      if (!error.empty()) {
        EXPECT_NE(error.find(path), std::string::npos) << error;
        if (names_line) {
          EXPECT_NE(error.find("': line "), std::string::npos) << error << "\nmanifest\n" << text;
        }
      }
      comm.barrier();
      if (comm.rank() == 0) {
        auto expected = baseline;
        for (auto& [name, bytes] : expected) {
          if (name == std::filesystem::path(path).filename().string()) bytes = text;
        }
        EXPECT_TRUE(CheckpointFiles(path) == expected) << "a load changed the files; manifest\n"
                                                       << text;
      }
      comm.barrier();
    }
    if (comm.rank() == 0) {
      std::printf("fuzzed manifests: %zu cases, %d refused, %d loaded the saved engine\n",
                  cases.size(), refused, accepted);
    }
    EXPECT_GT(refused, 1000);
    // The checkpoint as saved still loads.
    if (comm.rank() == 0) WriteFile(path, good);
    comm.barrier();
    EXPECT_TRUE(SameShardedEngine(ShardedEngine::load(path, comm), engine));
    comm.barrier();
    if (comm.rank() == 0) RemoveShardedCheckpoint(path);
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
