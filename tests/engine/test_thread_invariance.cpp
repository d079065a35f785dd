// The thread count never changes a bit (DESIGN.md, "Threads"): every pass
// over d-vectors at 1, 2 and 3 threads against the one-thread pass, the
// optimizer step over ranges that straddle blocks, and whole engine runs,
// including one whose thread count changes between ask() and tell().
//
// The sizes are large enough that a pass really is split (BlockPool gives a
// thread at least 1 MiB of traffic), and not multiples of the block.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/backend/streaming.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace {

using optex::BlockPool;
using optex::test::BitEqual;
using optex::test::SameBits;
using optex::test::SameEngine;

constexpr std::size_t kDim = 3 * 65536 + 4099;  // 52 blocks, the last one partial
constexpr std::size_t kRows = 7;                // one group of four rows and three single ones

bool SameDoubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class ThreadCount : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCount, EveryStreamingPassGivesTheOneThreadBits) {
  const BlockPool pool(GetParam());
  const std::vector<float> rows = optex::test::UniformStart(kRows * kDim, 1);
  const std::vector<float> a = optex::test::UniformStart(kDim, 2);
  const std::vector<float> b = optex::test::UniformStart(kDim, 3);
  const std::vector<const float*> queries = {a.data(), b.data()};
  const std::vector<double> weights = {0.5, -1.25, 2.0, 0.0, 0.75, 1e-3, -3.0};

  for (bool diff : {true, false}) {
    std::vector<double> serial(2 * kRows), pooled(2 * kRows, -1.0);
    std::vector<double> serial_norms(2), pooled_norms(2, -1.0);
    if (diff) {
      optex::streaming::squared_distances(BlockPool::serial(), rows.data(), kRows, kDim, queries,
                                          serial.data(), serial_norms.data());
      optex::streaming::squared_distances(pool, rows.data(), kRows, kDim, queries, pooled.data(),
                                          pooled_norms.data());
      EXPECT_TRUE(SameDoubles(serial_norms, pooled_norms)) << "query norms";
    } else {
      optex::streaming::inner_products(BlockPool::serial(), rows.data(), kRows, kDim, queries,
                                       serial.data());
      optex::streaming::inner_products(pool, rows.data(), kRows, kDim, queries, pooled.data());
    }
    EXPECT_TRUE(SameDoubles(serial, pooled)) << (diff ? "distances" : "inner products");
  }

  std::vector<float> serial_sum(kDim), pooled_sum(kDim, -1.0f);
  optex::streaming::weighted_sum(BlockPool::serial(), rows.data(), kRows, kDim, weights.data(),
                                 serial_sum.data());
  optex::streaming::weighted_sum(pool, rows.data(), kRows, kDim, weights.data(), pooled_sum.data());
  EXPECT_TRUE(BitEqual(serial_sum, pooled_sum));

  EXPECT_TRUE(SameBits(optex::streaming::dot(a.data(), b.data(), kDim),
                       optex::streaming::dot(pool, a.data(), b.data(), kDim)));
  const auto s = optex::streaming::pair_statistics(BlockPool::serial(), a.data(), b.data(), kDim);
  const auto p = optex::streaming::pair_statistics(pool, a.data(), b.data(), kDim);
  EXPECT_TRUE(SameBits(s.aa, p.aa) && SameBits(s.ab, p.ab) && SameBits(s.bb, p.bb) &&
              SameBits(s.squared_distance, p.squared_distance));
}

TEST_P(ThreadCount, TheBoundCheckFindsOneBadValueInAnyBlock) {
  const BlockPool pool(GetParam());
  std::vector<float> v = optex::test::UniformStart(kDim, 4);
  EXPECT_TRUE(optex::streaming::all_within_bound(pool, v.data(), v.size(), 1.0f));
  for (std::size_t at : {std::size_t{0}, kDim / 2, kDim - 1}) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -2.0f}) {
      const float kept = v[at];
      v[at] = bad;
      EXPECT_FALSE(optex::streaming::all_within_bound(pool, v.data(), v.size(), 1.0f))
          << bad << " at " << at;
      v[at] = kept;
    }
  }
}

TEST_P(ThreadCount, TheOptimizerStepOverRangesGivesTheOneThreadBits) {
  const BlockPool pool(GetParam());
  // Range boundaries inside blocks, and one range shorter than a block.
  const optex::OptimizerRanges ranges({{70001, optex::adamw(1e-3, 0.05)},
                                       {100, optex::adamw(3e-3, 0.0)},
                                       {kDim - 70101, optex::adamw(2e-4, 0.1)}});
  std::vector<float> x_serial = optex::test::UniformStart(kDim, 5);
  std::vector<float> x_pooled = x_serial;
  optex::OptimizerState s_serial = optex::init_state(ranges, kDim);
  optex::OptimizerState s_pooled = s_serial;
  for (unsigned step = 0; step < 3; ++step) {
    const std::vector<float> g = optex::test::UniformStart(kDim, 10 + step);
    optex::apply_step(ranges, x_serial, s_serial, g);
    optex::apply_step(ranges, x_pooled, s_pooled, g, pool);
  }
  EXPECT_TRUE(BitEqual(x_serial, x_pooled));
  EXPECT_TRUE(optex::test::StateBitEqual(s_serial, s_pooled));
}

// Gradients that turn along the run, so every statistic of a round moves.
void evaluate(optex::Batch& batch) {
  const optex::test::Quartic objective;
  for (int i = 0; i < batch.size(); ++i)
    batch.loss(i) = objective.EvaluateWithGradient(batch.point(i), batch.grad(i));
}

optex::Options round_options(int threads) {
  optex::Options o;
  o.parallelism = 4;
  o.history = 9;  // fills in three rounds, then the ring wraps
  o.threads = threads;
  o.trust_region = 3.0;             // distances from the iterate
  o.max_posterior_variance = 0.99;  // the variance at each proxy point
  return o;
}

TEST_P(ThreadCount, AnEngineRunGivesTheOneThreadBitsEveryRound) {
  const std::vector<float> x0 = optex::test::UniformStart(kDim, 7, -0.5, 0.5);
  const optex::OptimizerRanges ranges(
      {{kDim / 2, optex::adamw(2e-3, 0.01)}, {kDim - kDim / 2, optex::adamw(1e-3, 0.0)}});
  optex::Engine one(x0, ranges, round_options(1));
  optex::Engine many(x0, ranges, round_options(GetParam()));
  for (int round = 0; round < 6; ++round) {
    optex::Batch& first = one.ask();
    optex::Batch& second = many.ask();
    evaluate(first);
    evaluate(second);
    const optex::IterationInfo a = one.tell(first);
    const optex::IterationInfo b = many.tell(second);
    ASSERT_TRUE(SameEngine(one, many)) << "round " << round;
    EXPECT_TRUE(SameBits(a.grad_norm, b.grad_norm) && SameBits(a.cosine, b.cosine) &&
                SameBits(a.loss, b.loss))
        << "round " << round;
    EXPECT_TRUE(SameDoubles(a.prediction_error, b.prediction_error)) << "round " << round;
    EXPECT_TRUE(SameDoubles(a.posterior_variance, b.posterior_variance)) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadCount, ::testing::Values(1, 2, 3));

TEST(Threads, ChangingTheCountBetweenAskAndTellChangesNothing) {
  const std::vector<float> x0 = optex::test::UniformStart(kDim, 8);
  optex::Engine fixed(x0, optex::Adam{.lr = 1e-3}, round_options(1));
  optex::Engine switched(x0, optex::Adam{.lr = 1e-3}, round_options(3));
  for (int round = 0; round < 5; ++round) {
    optex::Batch& reference = fixed.ask();
    optex::Batch& batch = switched.ask();
    switched.set_threads(round % 2 == 0 ? 2 : 0);
    evaluate(reference);
    evaluate(batch);
    fixed.tell(reference);
    switched.tell(batch);
    ASSERT_TRUE(SameEngine(fixed, switched)) << "round " << round;
  }
}

TEST(Threads, AThreadCountOutsideTheRangeIsRefusedAndChangesNothing) {
  optex::Options o;
  for (int bad : {-1, optex::kMaxThreads + 1}) {
    o.threads = bad;
    try {
      o.validate();
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("threads"), std::string::npos) << e.what();
    }
  }
  optex::Engine engine(std::vector<float>(10, 0.5f), optex::Adam{}, round_options(2));
  EXPECT_THROW(engine.set_threads(-3), std::invalid_argument);
  EXPECT_EQ(engine.options().threads, 2);
  engine.set_threads(0);
  EXPECT_EQ(engine.options().threads, 0);
}

}  // namespace
