// The distributed engine on the in-process backend: W ranks as W threads.
// The same scenarios run under mpirun in test_distributed_mpi.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/distributed_observe_scenarios.hpp"
#include "distributed/distributed_scenarios.hpp"
#include "distributed/run_on_ranks.hpp"
#include "optex/backend/block_pool.hpp"
#include "optex/distributed/in_process_communicator.hpp"

namespace {

using namespace optex;
using namespace optex::test;

class Distributed : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(WorldSizes, Distributed, ::testing::Values(1, 2, 3, 4),
                         [](const auto& p) { return "W" + std::to_string(p.param); });

TEST_P(Distributed, AdamMatchesSingleProcessBitForBit) {
  RunOnRanks(GetParam(),
             [](Communicator& c) { CheckMatchesSingleProcess(c, 4, Adam{.lr = 0.01}); });
}

// Points with several evaluations, fixed and chosen each round: the ranks
// share the N evaluations as they share N points, and agree bit for bit.
TEST_P(Distributed, SeveralEvaluationsPerPointMatchSingleProcessBitForBit) {
  RunOnRanks(GetParam(), [](Communicator& c) {
    CheckMatchesSingleProcess(c, 4, Adam{.lr = 0.01}, 1, 2);
    CheckMatchesSingleProcess(c, 4, Adam{.lr = 0.01}, 1, 1, Strategy::adaptive);
  });
}

// The verified mode: every rank replays the same gathered gradients and
// commits the same steps as one process, bit for bit.
TEST_P(Distributed, VerifiedModeMatchesSingleProcessBitForBit) {
  RunOnRanks(GetParam(), [](Communicator& c) {
    CheckMatchesSingleProcess(c, 4, Adam{.lr = 0.01}, 1, 1, Strategy::fixed, Mode::verified);
    CheckMatchesSingleProcess(c, 2 * c.size() + 1, Sgd{.lr = 0.01, .momentum = 0.9}, 1, 1,
                              Strategy::fixed, Mode::verified);
  });
}

TEST_P(Distributed, MomentumSgdWithUnevenSharesMatchesSingleProcess) {
  RunOnRanks(GetParam(), [](Communicator& c) {
    CheckMatchesSingleProcess(c, 2 * c.size() + 1, Sgd{.lr = 0.01, .momentum = 0.9});
  });
}

TEST_P(Distributed, MinimizeMatchesSingleProcess) {
  RunOnRanks(GetParam(), CheckMinimizeMatchesSingleProcess);
}

TEST_P(Distributed, FailureAbortsOnEveryRank) { RunOnRanks(GetParam(), CheckFailureAborts); }

TEST_P(Distributed, MinimizeRefusesDifferentStopsOnEveryRank) {
  RunOnRanks(GetParam(), CheckMinimizeRefusesDifferentStops);
}

TEST_P(Distributed, MinimizeReportsAnObjectiveExceptionEverywhere) {
  RunOnRanks(GetParam(), CheckMinimizeReportsFailureEverywhere);
}

TEST_P(Distributed, FailureIsDroppedOnEveryRank) { RunOnRanks(GetParam(), CheckFailureDrops); }

TEST_P(Distributed, DivergenceIsDetected) { RunOnRanks(GetParam(), CheckDivergenceIsDetected); }

TEST_P(Distributed, ConfigurationMismatchIsRefused) {
  RunOnRanks(GetParam(), CheckConfigurationMismatchIsRefused);
}

TEST_P(Distributed, BadLayoutsAreRefused) { RunOnRanks(GetParam(), CheckBadLayoutsAreRefused); }

TEST_P(Distributed, PointsCoverTheBatch) { RunOnRanks(GetParam(), CheckPointsCoverTheBatch); }

TEST_P(Distributed, CheckpointResumes) {
  const std::string path =
      ::testing::TempDir() + "optex_distributed_W" + std::to_string(GetParam()) + ".ckpt";
  RunOnRanks(GetParam(), [&path](Communicator& c) { CheckCheckpointResumes(c, path); });
}

TEST_P(Distributed, UnchangedRangesMatchSingleProcess) {
  RunOnRanks(GetParam(), CheckUnchangedMatchesSingleProcess);
}

TEST_P(Distributed, DisagreeingUnchangedRangesAreRefusedOnEveryRank) {
  RunOnRanks(GetParam(), CheckUnchangedDisagreementIsRefused);
}

TEST_P(Distributed, LocalMisuseThrowsWithoutCommunicating) {
  RunOnRanks(GetParam(), CheckLocalMisuse);
}

// observe: ranks with 0, 2, 1, 3 late pairs hold the single engine's history.
TEST_P(Distributed, ObservedPairsOfEveryRankMatchSingleProcess) {
  RunOnRanks(GetParam(), CheckObserveMatchesSingleProcess);
}

TEST_P(Distributed, ObserveRefusedOnOneRankIsRefusedOnEveryRank) {
  RunOnRanks(GetParam(), CheckObserveRefusalOnEveryRank);
}

// W ranks as threads of one process share its cores; an explicit count is kept.
TEST_P(Distributed, RanksOnOneMachineShareItsCores) {
  const int world = GetParam();
  RunOnRanks(world, [world](Communicator& comm) {
    DistributedEngine shared(UniformStart(kDim, 1), Adam{.lr = 0.01}, WithN(4), comm);
    EXPECT_EQ(shared.engine().options().threads, std::max(1, available_cores() / world));
    Options explicit_count = WithN(4);
    explicit_count.threads = 3;
    DistributedEngine kept(UniformStart(kDim, 1), Adam{.lr = 0.01}, explicit_count, comm);
    EXPECT_EQ(kept.engine().options().threads, 3);
  });
}

// The hybrid layout: G groups of D data-parallel ranks equal one process that
// averages D minibatch gradients per point.
struct Layout {
  int world;
  int data_parallel;
};
class Hybrid : public ::testing::TestWithParam<Layout> {};
INSTANTIATE_TEST_SUITE_P(Layouts, Hybrid,
                         ::testing::Values(Layout{2, 2}, Layout{4, 2}, Layout{4, 4}, Layout{3, 3}),
                         [](const auto& p) {
                           return "W" + std::to_string(p.param.world) + "D" +
                                  std::to_string(p.param.data_parallel);
                         });

TEST_P(Hybrid, MatchesSingleProcessWithAveragedMinibatches) {
  const Layout l = GetParam();
  RunOnRanks(l.world, [&l](Communicator& c) {
    CheckMatchesSingleProcess(c, 4, Adam{.lr = 0.01}, l.data_parallel);
  });
}

TEST_P(Hybrid, SgdMatchesSingleProcessWithAveragedMinibatches) {
  const Layout l = GetParam();
  RunOnRanks(l.world, [&l](Communicator& c) {
    CheckMatchesSingleProcess(c, 3, Sgd{.lr = 0.02}, l.data_parallel);
  });
}

// A rank that stops calling the engine: the others throw CommunicatorTimeout
// within the communicator's timeout, naming it, instead of hanging.
TEST(DistributedTimeout, ARankThatStopsMakesTheOthersTimeOut) {
  constexpr int kWorld = 3;
  const auto start = std::chrono::steady_clock::now();
  RunOnRanks(kWorld, [](Communicator& c) {
    c.set_timeout(std::chrono::milliseconds(300));
    DistributedEngine engine(UniformStart(kDim, 3), Sgd{.lr = 0.01}, WithN(3), c);
    Batch& b = engine.ask();
    if (c.rank() == kWorld - 1) return;  // gone
    for (int i : engine.my_points()) {
      b.loss(i) = problems::Sphere().EvaluateWithGradient(b.point(i), b.grad(i));
    }
    try {
      engine.tell(b);
      ADD_FAILURE() << "rank " << c.rank() << ": tell returned";
    } catch (const CommunicatorError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::to_string(kWorld - 1)));
    }
    EXPECT_TRUE(engine.engine().pending());
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// The same for observe: a rank that never arrives makes the others throw a
// CommunicatorError naming it, and their histories are unchanged.
TEST(DistributedTimeout, ARankThatSkipsObserveMakesTheOthersTimeOut) {
  constexpr int kWorld = 3;
  const auto start = std::chrono::steady_clock::now();
  RunOnRanks(kWorld, [](Communicator& c) {
    c.set_timeout(std::chrono::milliseconds(300));
    DistributedEngine engine(UniformStart(kDim, 3), Sgd{.lr = 0.01}, WithN(3), c);
    if (c.rank() == kWorld - 1) return;  // gone
    const std::vector<float> pair = UniformStart(kDim, 4);
    try {
      engine.observe(pair, pair);
      ADD_FAILURE() << "rank " << c.rank() << ": observe returned";
    } catch (const CommunicatorError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::to_string(kWorld - 1)));
    }
    EXPECT_EQ(engine.engine().history().size(), 0u);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(DataParallel, MinibatchSeedIsThePointSeedWithoutDataParallelism) {
  EXPECT_EQ(minibatch_seed(1234, 0, 1), 1234u);
  EXPECT_NE(minibatch_seed(1234, 0, 2), minibatch_seed(1234, 1, 2));
  EXPECT_NE(minibatch_seed(1234, 0, 2), 1234u);
}

TEST(DataParallel, MeanInRankOrder) {
  const std::vector<float> rows = {1.0f, 2.0f, 3.0f, 5.0f, 7.0f, 9.0f};  // 3 ranks x 2
  std::vector<float> out(2);
  mean_in_rank_order(rows, out);
  EXPECT_FLOAT_EQ(out[0], (1.0f + 3.0f + 7.0f) / 3.0f);
  EXPECT_FLOAT_EQ(out[1], (2.0f + 5.0f + 9.0f) / 3.0f);
  std::vector<float> bad(4);
  EXPECT_THROW(mean_in_rank_order(rows, bad), std::invalid_argument);
  const std::vector<double> losses = {1.0, 2.0, 4.0};
  EXPECT_DOUBLE_EQ(mean_in_rank_order(losses), 7.0 / 3.0);
  EXPECT_THROW(mean_in_rank_order(std::span<const double>()), std::invalid_argument);
}

}  // namespace
