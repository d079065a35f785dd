// The sharded engine under mpirun: the scenarios of test_sharded_engine.cpp
// (sharded_scenarios.hpp) with one process per rank; ctest runs it with 2, 3
// and 4 ranks (3: uneven slices).
#include <gtest/gtest.h>

#include <string>

#include "optex/distributed/mpi_communicator.hpp"
#include "sharded/sharded_scenarios.hpp"

namespace optex::test {
namespace {

TEST(ShardedMpi, FollowsTheWholeEngineBitForBitWithOneBlockPerRank) {
  MpiCommunicator world;
  CheckFollowsWholeEngine(world, OneBlockPerRankDim(world.size()), Adam{.lr = 0.02}, true);
}

TEST(ShardedMpi, FollowsTheWholeEngineWithinToleranceWithUnevenSlices) {
  MpiCommunicator world;
  CheckFollowsWholeEngine(world, kManyBlocksDim, Sgd{.lr = 0.05, .momentum = 0.9}, false);
}

TEST(ShardedMpi, HybridGroupsAverageTheirMinibatchesLikeOneProcess) {
  MpiCommunicator world;
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  CheckFollowsWholeEngine(world, OneBlockPerRankDim(world.size()), Adam{.lr = 0.02}, true, 2, 20);
}

TEST(ShardedMpi, RepeatsBitForBitOnEveryRank) {
  MpiCommunicator world;
  CheckRepeatsBitForBit(world);
}

TEST(ShardedMpi, CheckpointsResumeBitForBitAndSurviveAFailedSave) {
  MpiCommunicator world;
  CheckShardedCheckpoint(world, SharedTempPath(world, "optex_sharded_mpi_"));
}

TEST(ShardedMpi, AFailedRowIsReportedToEveryRank) {
  MpiCommunicator world;
  CheckShardedFailures(world);
}

}  // namespace
}  // namespace optex::test
