// The distributed engine under mpirun: every rank is a process. The same
// scenarios as test_distributed.cpp (threads); ctest runs this with 2 and 4
// ranks (label mpi).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "distributed/distributed_observe_scenarios.hpp"
#include "distributed/distributed_scenarios.hpp"
#include "optex/distributed/mpi_communicator.hpp"

namespace {

using namespace optex;
using namespace optex::test;

TEST(DistributedMpi, AdamMatchesSingleProcessBitForBit) {
  MpiCommunicator world;
  CheckMatchesSingleProcess(world, 4, Adam{.lr = 0.01});
}

TEST(DistributedMpi, MomentumSgdWithUnevenSharesMatchesSingleProcess) {
  MpiCommunicator world;
  CheckMatchesSingleProcess(world, 2 * world.size() + 1, Sgd{.lr = 0.01, .momentum = 0.9});
}

TEST(DistributedMpi, HybridMatchesSingleProcessWithAveragedMinibatches) {
  MpiCommunicator world;
  // Every layout the world size allows: D = 1 (above), 2 and W.
  for (int d = 2; d <= world.size(); ++d) {
    if (world.size() % d != 0) continue;
    SCOPED_TRACE("data_parallel " + std::to_string(d));
    CheckMatchesSingleProcess(world, 4, Adam{.lr = 0.01}, d);
  }
}

TEST(DistributedMpi, MinimizeMatchesSingleProcess) {
  MpiCommunicator world;
  CheckMinimizeMatchesSingleProcess(world);
}

TEST(DistributedMpi, FailureAbortsOnEveryRank) {
  MpiCommunicator world;
  CheckFailureAborts(world);
}

TEST(DistributedMpi, MinimizeReportsAnObjectiveExceptionEverywhere) {
  MpiCommunicator world;
  CheckMinimizeReportsFailureEverywhere(world);
}

TEST(DistributedMpi, MinimizeRefusesDifferentStopsOnEveryRank) {
  MpiCommunicator world;
  CheckMinimizeRefusesDifferentStops(world);
}

TEST(DistributedMpi, FailureIsDroppedOnEveryRank) {
  MpiCommunicator world;
  CheckFailureDrops(world);
}

TEST(DistributedMpi, DivergenceIsDetected) {
  MpiCommunicator world;
  CheckDivergenceIsDetected(world);
}

TEST(DistributedMpi, ConfigurationMismatchIsRefused) {
  MpiCommunicator world;
  CheckConfigurationMismatchIsRefused(world);
}

TEST(DistributedMpi, BadLayoutsAreRefused) {
  MpiCommunicator world;
  CheckBadLayoutsAreRefused(world);
}

TEST(DistributedMpi, UnchangedRangesMatchSingleProcess) {
  MpiCommunicator world;
  CheckUnchangedMatchesSingleProcess(world);
}

TEST(DistributedMpi, DisagreeingUnchangedRangesAreRefusedOnEveryRank) {
  MpiCommunicator world;
  CheckUnchangedDisagreementIsRefused(world);
}

TEST(DistributedMpi, PointsCoverTheBatch) {
  MpiCommunicator world;
  CheckPointsCoverTheBatch(world);
}

TEST(DistributedMpi, CheckpointResumes) {
  MpiCommunicator world;
  CheckCheckpointResumes(world, SharedTempPath(world, "optex_mpi_"));
}

TEST(DistributedMpi, LocalMisuseThrowsWithoutCommunicating) {
  MpiCommunicator world;
  CheckLocalMisuse(world);
}

TEST(DistributedMpi, ObservedPairsOfEveryRankMatchSingleProcess) {
  MpiCommunicator world;
  CheckObserveMatchesSingleProcess(world);
}

TEST(DistributedMpi, ObserveRefusedOnOneRankIsRefusedOnEveryRank) {
  MpiCommunicator world;
  CheckObserveRefusalOnEveryRank(world);
}

}  // namespace
