// DistributedEngine::observe on every communicator backend: called on every
// rank with that rank's communicator, by W threads in test_distributed.cpp
// and by W processes in test_distributed_mpi.cpp. The reference is a
// single-process Engine that every rank runs on the side, observing the
// concatenation of every rank's pairs in rank order.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/distributed_scenarios.hpp"
#include "optex/distributed/communicator.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/engine/engine.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace optex::test {

// Rank r's late pairs: {0, 2, 1, 3}[r % 4] of them, true pairs of the noisy
// quadratic at points drawn from the rank, the same on every rank that asks.
struct LatePairs {
  std::vector<float> points;
  std::vector<float> gradients;
};
inline LatePairs LatePairsOfRank(int rank, std::size_t d) {
  static constexpr std::size_t kCounts[] = {0, 2, 1, 3};
  const std::size_t m = kCounts[rank % 4];
  LatePairs p;
  p.points = UniformStart(m * d, 1000 + static_cast<std::uint64_t>(rank));
  p.gradients.resize(m * d);
  NoisyQuadratic f;
  for (std::size_t k = 0; k < m; ++k) {
    f.EvaluateWithGradient(std::span<const float>(p.points).subspan(k * d, d),
                           std::span<float>(p.gradients).subspan(k * d, d), k);
  }
  return p;
}

// Every rank's pairs in rank order: what each rank observes.
inline LatePairs LatePairsOfEveryRank(int ranks, std::size_t d) {
  LatePairs all;
  for (int r = 0; r < ranks; ++r) {
    const LatePairs p = LatePairsOfRank(r, d);
    all.points.insert(all.points.end(), p.points.begin(), p.points.end());
    all.gradients.insert(all.gradients.end(), p.gradients.begin(), p.gradients.end());
  }
  return all;
}

// One round of the distributed engine and of the reference, every point
// evaluated the same way.
inline void RoundOnBoth(DistributedEngine& engine, Engine& reference) {
  NoisyQuadratic f;
  Batch& batch = engine.ask();
  for (int i : engine.my_points()) {
    batch.loss(i) = f.EvaluateWithGradient(batch.point(i), batch.grad(i), batch.seed(i));
  }
  engine.tell(batch);
  Batch& ref = reference.ask();
  for (int i = 0; i < ref.size(); ++i) {
    ref.loss(i) = f.EvaluateWithGradient(ref.point(i), ref.grad(i), ref.seed(i));
  }
  reference.tell(ref);
}

// Ranks observe different numbers of pairs (0, 2, 1, 3, ...): every rank's
// engine equals the single engine that observed the concatenation in rank
// order, bit for bit, and so do the rounds after it. Observing when no rank
// has pairs changes nothing.
inline void CheckObserveMatchesSingleProcess(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  Options options = WithN(4, 41);
  options.history = 5;  // four ranks' six pairs wrap the ring
  const std::vector<float> x0 = UniformStart(kDim, 42);
  DistributedOptions dist;
  dist.hash_interval = 1;
  DistributedEngine engine(x0, Adam{.lr = 0.01}, options, comm, dist);
  Engine reference(x0, Adam{.lr = 0.01}, options);
  for (int t = 0; t < 2; ++t) RoundOnBoth(engine, reference);

  const std::int64_t collectives = engine.communication().collectives;
  engine.observe({}, {});  // no rank has pairs: one exchange, nothing observed
  ASSERT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();
  EXPECT_EQ(engine.communication().collectives, collectives + 1);

  const LatePairs mine = LatePairsOfRank(comm.rank(), kDim);
  engine.observe(mine.points, mine.gradients);
  const LatePairs all = LatePairsOfEveryRank(comm.size(), kDim);
  reference.observe(all.points, all.gradients);
  if (!all.points.empty()) {
    EXPECT_EQ(engine.communication().collectives, collectives + 3);
  }
  ASSERT_TRUE(SameEngine(engine.engine(), reference))
      << "rank " << comm.rank() << " of " << comm.size() << ", after observe";
  for (int t = 0; t < 3; ++t) {
    RoundOnBoth(engine, reference);
    ASSERT_TRUE(SameEngine(engine.engine(), reference))
        << "rank " << comm.rank() << " of " << comm.size() << ", round " << t << " after observe";
  }
}

// A rank whose pairs are refused makes every rank throw invalid_argument
// naming the lowest such rank and its reason, and nothing changes anywhere;
// between ask() and tell() every rank throws runtime_error without a
// collective. Afterwards the ranks are still in step: a valid observe and a
// round match the single engine.
inline void CheckObserveRefusalOnEveryRank(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  Options options = WithN(4, 43);
  options.history = 6;
  const std::vector<float> x0 = UniformStart(kDim, 44);
  DistributedEngine engine(x0, Adam{.lr = 0.01}, options, comm);
  Engine reference(x0, Adam{.lr = 0.01}, options);
  RoundOnBoth(engine, reference);

  // A NaN on the last rank (and, with three or more ranks, a wrong size on
  // rank 1 too: the lowest bad rank is named).
  const int last = comm.size() - 1;
  const int named = comm.size() >= 3 ? 1 : last;
  std::vector<float> points = UniformStart(2 * kDim, 45);
  std::vector<float> gradients = UniformStart(2 * kDim, 46);
  if (comm.rank() == last) gradients[kDim + 3] = std::numeric_limits<float>::quiet_NaN();
  if (comm.size() >= 3 && comm.rank() == 1) points.pop_back();
  const std::string reason = named == last ? "gradients row 1, element 3 is nan"
                                           : "points has " + std::to_string(2 * kDim - 1);
  try {
    engine.observe(points, gradients);
    ADD_FAILURE() << "rank " << comm.rank() << ": observe did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank " + std::to_string(named) + " refused"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(reason));
  }
  ASSERT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();

  // Pending: a local refusal on every rank.
  engine.ask();
  EXPECT_THROW(engine.observe(points, gradients), std::runtime_error);
  RoundOnBoth(engine, reference);  // its ask() returns the pending batch
  ASSERT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();

  // Still in step.
  const LatePairs mine = LatePairsOfRank(comm.rank(), kDim);
  engine.observe(mine.points, mine.gradients);
  const LatePairs all = LatePairsOfEveryRank(comm.size(), kDim);
  reference.observe(all.points, all.gradients);
  RoundOnBoth(engine, reference);
  ASSERT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();
}

}  // namespace optex::test
