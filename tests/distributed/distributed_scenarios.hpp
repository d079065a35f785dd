// Checks of the distributed engine that every communicator backend must pass.
// Each function is called on every rank of a world with that rank's
// communicator: by W threads in test_distributed.cpp (in-process), by W
// processes in test_distributed_mpi.cpp (under mpirun).
//
// The reference is always a single-process Engine with the same options,
// which every rank runs locally on the side, evaluating all N points itself.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/distributed/communicator.hpp"
#include "optex/distributed/data_parallel.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/distributed/distributed_minimize.hpp"
#include "optex/engine/coordinate_range.hpp"
#include "optex/problems/problems.hpp"
#include "optex/util/random.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace optex::test {

inline constexpr std::size_t kDim = 40;

// A file name in the test's temporary directory that every rank shares: rank
// 0 draws it.
inline std::string SharedTempPath(Communicator& comm, const std::string& prefix) {
  std::uint64_t tag = std::random_device{}();
  comm.broadcast(std::span<std::uint64_t>(&tag, 1), 0);
  return ::testing::TempDir() + prefix + std::to_string(tag) + ".ckpt";
}
inline constexpr std::chrono::seconds kTestTimeout{30};

// Evaluates every point of the batch the way the ranks of a hybrid layout with
// D data ranks do together: the mean over D minibatches in rank order.
inline void EvaluateLikeAGroup(Batch& batch, int data_parallel) {
  NoisyQuadratic f;
  const std::size_t d = batch.dim();
  std::vector<float> rows(static_cast<std::size_t>(data_parallel) * d);
  std::vector<double> losses(static_cast<std::size_t>(data_parallel));
  for (int i = 0; i < batch.size(); ++i) {
    for (int r = 0; r < data_parallel; ++r) {
      losses[static_cast<std::size_t>(r)] = f.EvaluateWithGradient(
          batch.point(i), std::span<float>(rows).subspan(static_cast<std::size_t>(r) * d, d),
          minibatch_seed(batch.seed(i), r, data_parallel));
    }
    mean_in_rank_order(rows, batch.grad(i));
    batch.loss(i) = mean_in_rank_order(losses);
  }
}

// Every rank's distributed trajectory is bit for bit the single-process one
// with the same N, after every iteration (and the ranks' hashes agree: a
// hash_interval of 1 checks after every tell).
// `evaluations_per_point` and `strategy` are the engine's own split of the N
// evaluations into points (Options), beside the ranks' data parallelism.
inline void CheckMatchesSingleProcess(Communicator& comm, int n, Optimizer optimizer,
                                      int data_parallel = 1, int evaluations_per_point = 1,
                                      Strategy strategy = Strategy::fixed,
                                      Mode mode = Mode::approximate) {
  comm.set_timeout(kTestTimeout);
  Options options = WithN(n, 17);
  options.history = 12;
  options.evaluations_per_point = evaluations_per_point;
  options.strategy = strategy;
  options.mode = mode;
  const std::vector<float> x0 = UniformStart(kDim, 5);
  DistributedOptions dist;
  dist.data_parallel = data_parallel;
  dist.hash_interval = 1;
  DistributedEngine engine(x0, optimizer, options, comm, dist);
  Engine reference(x0, optimizer, options);
  NoisyQuadratic f;
  for (int t = 0; t < 8; ++t) {
    Batch& batch = engine.ask();
    for (int i : engine.my_points()) {
      EXPECT_EQ(engine.seed(i), minibatch_seed(batch.seed(i), engine.data_rank(), data_parallel));
      batch.loss(i) = f.EvaluateWithGradient(batch.point(i), batch.grad(i), engine.seed(i));
    }
    const IterationInfo& info = engine.tell(batch);

    Batch& ref_batch = reference.ask();
    EvaluateLikeAGroup(ref_batch, data_parallel);
    const IterationInfo& ref_info = reference.tell(ref_batch);
    ASSERT_TRUE(SameEngine(engine.engine(), reference))
        << "rank " << comm.rank() << " of " << comm.size() << ", iteration " << t;
    EXPECT_TRUE(SameBits(info.loss, ref_info.loss));
    EXPECT_EQ(info.committed_steps, ref_info.committed_steps);
  }
  if (comm.size() > 1) {
    EXPECT_GT(engine.communication().bytes_sent, 0u);
    EXPECT_GT(engine.communication().collectives, 0);
  }
}

// minimize_distributed returns the same Result on every rank, equal to
// minimize's in one process (a deterministic objective).
inline void CheckMinimizeMatchesSingleProcess(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  const problems::Rosenbrock f;
  const std::vector<float> x0 = f.standard_start(kDim);
  const Options options = WithN(4, 3);
  const Stop stop{.max_iters = 12};
  const Result distributed = minimize_distributed(f, x0, Adam{.lr = 0.01}, options, comm, {}, stop);
  const Result single = minimize(f, x0, Adam{.lr = 0.01}, options, stop);
  EXPECT_TRUE(BitEqual(distributed.x, single.x));
  EXPECT_TRUE(SameBits(distributed.fun, single.fun));
  EXPECT_EQ(distributed.iterations, single.iterations);
  EXPECT_EQ(distributed.evaluations, single.evaluations);
  ASSERT_EQ(distributed.loss_history.size(), single.loss_history.size());
  for (std::size_t t = 0; t < single.loss_history.size(); ++t) {
    EXPECT_TRUE(SameBits(distributed.loss_history[t], single.loss_history[t])) << t;
  }
}

// An objective that throws on the last rank at iteration 2.
struct ThrowsOnLastRank {
  int rank = 0;
  int size = 1;
  int* iteration = nullptr;
  double operator()(std::span<const float> x, std::span<float> g) const {
    if (rank == size - 1 && *iteration == 2) throw std::runtime_error("simulated rollout crash");
    return problems::Sphere().EvaluateWithGradient(x, g);
  }
};

// OnFailure::abort: every rank throws RankFailure naming the last rank, its
// point and the message; the engine is unchanged and the batch still pending.
inline void CheckFailureAborts(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  int iteration = 0;
  const ThrowsOnLastRank f{comm.rank(), comm.size(), &iteration};
  DistributedEngine engine(UniformStart(kDim, 1), Adam{.lr = 0.01}, WithN(4), comm);
  for (; iteration < 2; ++iteration) {
    Batch& b = engine.ask();
    for (int i : engine.my_points()) b.loss(i) = f(b.point(i), b.grad(i));
    engine.tell(b);
  }
  Batch& b = engine.ask();
  for (int i : engine.my_points()) {
    try {
      b.loss(i) = f(b.point(i), b.grad(i));
    } catch (const std::exception& e) {
      engine.fail(i, e.what());
    }
  }
  const std::uint64_t before = engine.state_hash();
  try {
    engine.tell(b);
    ADD_FAILURE() << "rank " << comm.rank() << ": tell did not throw";
  } catch (const RankFailure& e) {
    EXPECT_EQ(e.rank(), comm.size() - 1);
    EXPECT_EQ(e.point(), engine.points_of_group(engine.groups() - 1).first);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank " + std::to_string(comm.size() - 1)));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("simulated rollout crash"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("iteration 2"));
  }
  EXPECT_EQ(engine.state_hash(), before);
  EXPECT_TRUE(engine.engine().pending());
  EXPECT_EQ(engine.engine().iteration(), 2);
}

// The same failure through minimize_distributed: the exception reaches every rank.
inline void CheckMinimizeReportsFailureEverywhere(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  std::atomic<int> calls = 0;
  const int last = comm.size() - 1;
  const int rank = comm.rank();
  // Per point, not per iteration: throw on the 3rd call of the last rank.
  auto f = [&calls, last, rank](std::span<const float> x, std::span<float> g) {
    // Calls from the local pool may overlap; only the last rank counts.
    if (rank == last && ++calls == 3) {
      throw std::runtime_error("worker lost");
    }
    return problems::Sphere().EvaluateWithGradient(x, g);
  };
  EXPECT_THROW(
      {
        try {
          minimize_distributed(f, UniformStart(kDim, 2), Sgd{.lr = 0.01}, WithN(4), comm, {},
                               Stop{.max_iters = 10});
        } catch (const RankFailure& e) {
          EXPECT_EQ(e.rank(), last);
          EXPECT_THAT(e.what(), ::testing::HasSubstr("worker lost"));
          throw;
        }
      },
      RankFailure);
}

// Different stop criteria per rank would end the ranks at different
// iterations, in collectives of different sizes: refused before the first
// iteration, on every rank, naming the criterion.
inline void CheckMinimizeRefusesDifferentStops(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  if (comm.size() < 2) return;
  int calls = 0;
  auto f = [&calls](std::span<const float> x, std::span<float> g) {
    ++calls;
    return problems::Sphere().EvaluateWithGradient(x, g);
  };
  const long iterations = comm.rank() == 1 ? 3 : 5;
  try {
    minimize_distributed(f, UniformStart(kDim, 2), Sgd{.lr = 0.01}, WithN(4), comm, {},
                         Stop{.max_iters = iterations});
    ADD_FAILURE() << "rank " << comm.rank() << ": different max_iters were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "ranks disagree on stop.max_iters: rank 0 has 5, rank 1 has 3"));
  }
  EXPECT_EQ(calls, 0);
}

// OnFailure::drop: the failed point is dropped on every rank, exactly as a
// single process drops a pair whose loss is not finite.
inline void CheckFailureDrops(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  DistributedOptions dist;
  dist.on_failure = OnFailure::drop;
  dist.hash_interval = 1;
  const Options options = WithN(4, 9);
  const std::vector<float> x0 = UniformStart(kDim, 4);
  DistributedEngine engine(x0, Adam{.lr = 0.02}, options, comm, dist);
  Engine reference(x0, Adam{.lr = 0.02}, options);
  const problems::Sphere f;
  const int failing_point = engine.points_of_group(engine.groups() - 1).first;
  for (int t = 0; t < 5; ++t) {
    Batch& b = engine.ask();
    for (int i : engine.my_points()) {
      if (t == 3 && i == failing_point) {
        engine.fail(i, "episode timed out");
      } else {
        b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
      }
    }
    const IterationInfo& info = engine.tell(b);
    Batch& rb = reference.ask();
    for (int i = 0; i < rb.size(); ++i)
      rb.loss(i) = f.EvaluateWithGradient(rb.point(i), rb.grad(i));
    if (t == 3) rb.loss(failing_point) = std::numeric_limits<double>::quiet_NaN();
    reference.tell(rb);
    EXPECT_EQ(info.dropped, t == 3 ? 1 : 0) << "iteration " << t;
    ASSERT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank() << ", t " << t;
  }
}

// A rank whose own computation differs (here: its target oracle) is caught
// by the hash comparison, on every rank, naming the rank.
inline void CheckDivergenceIsDetected(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  if (comm.size() < 2) return;
  Options options = WithN(comm.size());
  options.proxy = Proxy::target;
  DistributedOptions dist;
  dist.hash_interval = 2;
  DistributedEngine engine(UniformStart(kDim, 3), Sgd{.lr = 0.01}, options, comm, dist);
  const float skew = comm.rank() == 1 ? 1.001f : 1.0f;
  engine.engine().set_gradient_oracle([skew](std::span<const float> x, std::span<float> g) {
    const double f = problems::Sphere().EvaluateWithGradient(x, g);
    for (float& v : g) v *= skew;
    return f;
  });
  const problems::Sphere f;
  Batch& b = engine.ask();
  for (int i : engine.my_points()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  engine.tell(b);  // iteration 1: no check
  Batch& b2 = engine.ask();
  for (int i : engine.my_points()) b2.loss(i) = f.EvaluateWithGradient(b2.point(i), b2.grad(i));
  try {
    engine.tell(b2);
    ADD_FAILURE() << "rank " << comm.rank() << ": no divergence reported";
  } catch (const RankDivergence& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("after iteration 2"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank 1 differ"));
  }
}

// Ranks given different settings: every rank throws, naming the odd rank.
inline void CheckConfigurationMismatchIsRefused(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  if (comm.size() < 2) return;
  const std::vector<float> x0 = UniformStart(kDim, 3);
  const double lr = comm.rank() == comm.size() - 1 ? 0.02 : 0.01;
  try {
    DistributedEngine engine(x0, Sgd{.lr = lr}, WithN(4), comm);
    ADD_FAILURE() << "rank " << comm.rank() << ": a different lr was accepted";
  } catch (const std::invalid_argument& e) {
    // The first field that differs, with the values of rank 0 and of the rank that differs.
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("ranks disagree on optimizer.lr: rank 0 has 0.01, rank " +
                                     std::to_string(comm.size() - 1) + " has 0.02"));
  }
  // Options too, by name: the history on the last rank.
  Options shorter = WithN(4);
  if (comm.rank() == comm.size() - 1) shorter.history = 7;
  try {
    DistributedEngine engine(x0, Sgd{.lr = 0.01}, shorter, comm);
    ADD_FAILURE() << "rank " << comm.rank() << ": a different history was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("ranks disagree on options.history: rank 0 has " +
                                               std::to_string(WithN(4).history) + ", rank " +
                                               std::to_string(comm.size() - 1) + " has 7"));
  }
  // The proxy distances: a rank on another computation of the proxy steps is refused too.
  Options distances = WithN(4);
  if (comm.rank() == comm.size() - 1)
    distances.proxy_distances = optex::ProxyDistances::coefficients;
  try {
    DistributedEngine engine(x0, Sgd{.lr = 0.01}, distances, comm);
    ADD_FAILURE() << "rank " << comm.rank() << ": different proxy distances were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "ranks disagree on options.proxy_distances: rank 0 has 0, rank " +
                              std::to_string(comm.size() - 1) + " has 1"));
  }
  // And the distributed options.
  DistributedOptions rarely;
  if (comm.rank() == comm.size() - 1) rarely.hash_interval = 3;
  try {
    DistributedEngine engine(x0, Sgd{.lr = 0.01}, WithN(4), comm, rarely);
    ADD_FAILURE() << "rank " << comm.rank() << ": a different hash interval was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("ranks disagree on distributed.hash_interval"));
  }
  // A bad argument on one rank only: every rank throws.
  Options bad = WithN(4);
  if (comm.rank() == 1) bad.history = 0;
  EXPECT_THROW(DistributedEngine(x0, Sgd{.lr = 0.01}, bad, comm), std::invalid_argument);
  // A different dimension on one rank.
  const std::vector<float> other = UniformStart(comm.rank() == 1 ? kDim + 1 : kDim, 3);
  try {
    DistributedEngine engine(other, Sgd{.lr = 0.01}, WithN(4), comm);
    ADD_FAILURE() << "rank " << comm.rank() << ": a different dimension was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("x0"));
  }
}

// Layouts that cannot work are refused on every rank, naming the field.
inline void CheckBadLayoutsAreRefused(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  const std::vector<float> x0 = UniformStart(kDim, 3);
  DistributedOptions dist;
  dist.data_parallel = comm.size() + 1;  // never divides the world size
  try {
    DistributedEngine engine(x0, Sgd{.lr = 0.01}, WithN(4), comm, dist);
    ADD_FAILURE() << "data_parallel " << dist.data_parallel << " accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("data_parallel"));
  }
  dist.data_parallel = 0;
  EXPECT_THROW(DistributedEngine(x0, Sgd{.lr = 0.01}, WithN(4), comm, dist), std::invalid_argument);
  dist = {};
  dist.hash_interval = -1;
  EXPECT_THROW(DistributedEngine(x0, Sgd{.lr = 0.01}, WithN(4), comm, dist), std::invalid_argument);
  if (comm.size() > 1) {
    // More groups than points.
    try {
      DistributedEngine engine(x0, Sgd{.lr = 0.01}, WithN(comm.size() - 1), comm);
      ADD_FAILURE() << "more ranks than points accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("parallelism"));
    }
  }
}

// The points are shared in contiguous blocks covering [0, N) once.
inline void CheckPointsCoverTheBatch(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  for (int n : {comm.size(), comm.size() + 1, 2 * comm.size() + 1, 7 * comm.size()}) {
    DistributedEngine engine(UniformStart(kDim, 3), Sgd{.lr = 0.01}, WithN(n), comm);
    int next = 0;
    for (int g = 0; g < engine.groups(); ++g) {
      const auto r = engine.points_of_group(g);
      EXPECT_EQ(r.first, next);
      EXPECT_GE(r.count, n / engine.groups());
      EXPECT_LE(r.count, n / engine.groups() + 1);
      next = r.first + r.count;
    }
    EXPECT_EQ(next, n);
    EXPECT_THROW(engine.points_of_group(engine.groups()), std::out_of_range);
  }
}

// A checkpoint saved by rank 0 resumes on every rank as if never stopped.
inline void CheckCheckpointResumes(Communicator& comm, const std::string& path) {
  comm.set_timeout(kTestTimeout);
  const Options options = WithN(4, 21);
  const std::vector<float> x0 = UniformStart(kDim, 8);
  NoisyQuadratic f;
  auto run = [&](DistributedEngine& e, int iterations) {
    for (int t = 0; t < iterations; ++t) {
      Batch& b = e.ask();
      for (int i : e.my_points())
        b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), e.seed(i));
      e.tell(b);
    }
  };
  DistributedEngine straight(x0, Adam{.lr = 0.01}, options, comm);
  run(straight, 6);
  DistributedEngine first(x0, Adam{.lr = 0.01}, options, comm);
  run(first, 3);
  first.save(path);
  DistributedEngine resumed = DistributedEngine::load(path, comm);
  run(resumed, 3);
  EXPECT_TRUE(SameEngine(resumed.engine(), straight.engine())) << "rank " << comm.rank();
  EXPECT_THROW(DistributedEngine::load(path + ".missing", comm), std::runtime_error);
  comm.barrier();
  if (comm.rank() == 0) std::remove(path.c_str());
}

// Misuse that stays on one rank and needs no collective.
inline void CheckLocalMisuse(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  DistributedEngine engine(UniformStart(kDim, 3), Sgd{.lr = 0.01}, WithN(4), comm);
  EXPECT_THROW(engine.seed(0), std::runtime_error);       // nothing pending
  EXPECT_THROW(engine.fail(0, "x"), std::runtime_error);  // nothing pending
  Batch& b = engine.ask();
  const auto mine = engine.my_points();
  EXPECT_THROW(engine.fail(mine.first + mine.count, "x"),
               std::out_of_range);  // not this rank's point
  Engine other(UniformStart(kDim, 3), Sgd{.lr = 0.01}, WithN(4));
  EXPECT_THROW(engine.tell(other.ask()), std::invalid_argument);
  for (int i : mine) b.loss(i) = problems::Sphere().EvaluateWithGradient(b.point(i), b.grad(i));
  engine.tell(b);
  EXPECT_THROW(engine.tell(b), std::runtime_error);  // nothing pending any more
}

// tell(batch, unchanged) with the same ranges on every rank: bit for bit the
// single-process engine told the same ranges, after every round, and the
// ranges never leave the start point (their gradients are not even zero).
inline void CheckUnchangedMatchesSingleProcess(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  Options options = WithN(4, 21);
  options.history = 12;
  const std::vector<float> x0 = UniformStart(kDim, 8);
  const std::vector<CoordinateRange> unchanged = {{0, 3}, {17, 10}, {kDim - 1, 1}};
  DistributedOptions dist;
  dist.hash_interval = 1;
  const Optimizer adam_l2 = Adam{.lr = 0.01, .weight_decay = 0.1};
  DistributedEngine engine(x0, adam_l2, options, comm, dist);
  Engine reference(x0, adam_l2, options);
  NoisyQuadratic f;
  for (int t = 0; t < 6; ++t) {
    Batch& batch = engine.ask();
    for (int i : engine.my_points()) {
      batch.loss(i) = f.EvaluateWithGradient(batch.point(i), batch.grad(i), engine.seed(i));
    }
    engine.tell(batch, unchanged);
    Batch& ref_batch = reference.ask();
    EvaluateLikeAGroup(ref_batch, 1);
    reference.tell(ref_batch, unchanged);
    ASSERT_TRUE(SameEngine(engine.engine(), reference))
        << "rank " << comm.rank() << " of " << comm.size() << ", iteration " << t;
  }
  const std::span<const float> x = engine.engine().iterate();
  for (const CoordinateRange& r : unchanged) {
    EXPECT_TRUE(
        BitEqual(x.subspan(r.offset, r.size), std::span<const float>(x0).subspan(r.offset, r.size)))
        << "range at " << r.offset;
  }
}

// A rank that passes other unchanged ranges than rank 0, or invalid ones,
// makes every rank throw std::invalid_argument before anything changes (the
// refusing rank with its own reason); the round can then be told with
// agreeing ranges, as one process would.
inline void CheckUnchangedDisagreementIsRefused(Communicator& comm) {
  comm.set_timeout(kTestTimeout);
  if (comm.size() < 2) return;
  const int last = comm.size() - 1;
  const bool is_last = comm.rank() == last;
  const Optimizer sgd = Sgd{.lr = 0.01, .momentum = 0.9, .weight_decay = 0.1};
  DistributedEngine engine(UniformStart(kDim, 9), sgd, WithN(4, 3), comm);
  Engine reference(UniformStart(kDim, 9), sgd, WithN(4, 3));
  NoisyQuadratic f;
  Batch& batch = engine.ask();
  for (int i : engine.my_points()) {
    batch.loss(i) = f.EvaluateWithGradient(batch.point(i), batch.grad(i), engine.seed(i));
  }
  const std::uint64_t hash_before = engine.state_hash();
  const std::vector<CoordinateRange> agreed = {{2, 5}};
  const std::vector<CoordinateRange> other = {{2, 6}};
  const std::vector<CoordinateRange> overlapping = {{2, 5}, {4, 1}};
  const std::string last_name = "rank " + std::to_string(last);
  try {
    engine.tell(batch, is_last ? other : agreed);
    ADD_FAILURE() << "rank " << comm.rank() << ": different ranges were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(last_name + " passed other coordinate ranges"));
  }
  EXPECT_EQ(engine.state_hash(), hash_before);
  EXPECT_TRUE(engine.engine().pending());
  try {
    engine.tell(batch, is_last ? overlapping : agreed);
    ADD_FAILURE() << "rank " << comm.rank() << ": invalid ranges were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(is_last ? "range 1 (offset 4, size 1) overlaps"
                                                       : "refused by " + last_name));
  }
  EXPECT_EQ(engine.state_hash(), hash_before);
  EXPECT_TRUE(engine.engine().pending());
  engine.tell(batch, agreed);
  Batch& ref_batch = reference.ask();
  EvaluateLikeAGroup(ref_batch, 1);
  reference.tell(ref_batch, agreed);
  EXPECT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();
}

}  // namespace optex::test
