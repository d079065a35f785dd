// The fused passes against the unfused ones they replace, bit for bit
// (DESIGN.md, "A round's passes"): all new rows of the history's statistics
// from one pass over the points and one over the gradients, several queries
// per pass, a prediction's four statistics from one pass over the pair, and a
// GP proxy step's mean, copy and update in one pass (with StepInParts, the
// optimizer update in parts).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/backend/streaming.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/engine_equality.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

namespace {

using optex::BlockPool;
using optex::GradientHistory;
using optex::test::BitEqual;
using optex::test::SameBits;

// Dimensions below a block, across block boundaries, and split over threads.
class FusedDim : public ::testing::TestWithParam<std::size_t> {};

TEST_P(FusedDim, SeveralQueriesInOnePassEqualOnePassPerQuery) {
  const std::size_t dim = GetParam();
  constexpr std::size_t kRows = 6;
  const std::vector<float> rows = optex::test::UniformStart(kRows * dim, 1);
  std::vector<std::vector<float>> queries;
  std::vector<const float*> pointers;
  for (unsigned q = 0; q < 3; ++q) {
    queries.push_back(optex::test::UniformStart(dim, 10 + q));
    pointers.push_back(queries.back().data());
  }
  const BlockPool pool(3);
  std::vector<double> distances(3 * kRows), inner(3 * kRows), norms(3);
  optex::streaming::squared_distances(pool, rows.data(), kRows, dim, pointers, distances.data(),
                                      norms.data());
  optex::streaming::inner_products(pool, rows.data(), kRows, dim, pointers, inner.data());
  for (std::size_t q = 0; q < 3; ++q) {
    std::vector<double> one_distances(kRows), one_inner(kRows);
    optex::streaming::squared_distances(rows.data(), kRows, dim, pointers[q], one_distances.data());
    optex::streaming::inner_products(rows.data(), kRows, dim, pointers[q], one_inner.data());
    for (std::size_t j = 0; j < kRows; ++j) {
      EXPECT_TRUE(SameBits(distances[q * kRows + j], one_distances[j])) << q << ", " << j;
      EXPECT_TRUE(SameBits(inner[q * kRows + j], one_inner[j])) << q << ", " << j;
    }
    EXPECT_TRUE(SameBits(norms[q], optex::streaming::dot(pointers[q], pointers[q], dim))) << q;
  }
}

TEST(FusedQueries, MoreQueriesThanOneGroupHoldsEqualOnePassPerQuery) {
  constexpr std::size_t kDim = 5000;
  constexpr std::size_t kRows = 5;
  constexpr std::size_t kQueries = 19;  // a group of 16 and one of 3
  const std::vector<float> rows = optex::test::UniformStart(kRows * kDim, 7);
  std::vector<std::vector<float>> queries;
  std::vector<const float*> pointers;
  for (unsigned q = 0; q < kQueries; ++q) {
    queries.push_back(optex::test::UniformStart(kDim, 100 + q));
    pointers.push_back(queries.back().data());
  }
  std::vector<double> distances(kQueries * kRows), inner(kQueries * kRows);
  optex::streaming::squared_distances(BlockPool(2), rows.data(), kRows, kDim, pointers,
                                      distances.data());
  optex::streaming::inner_products(BlockPool(2), rows.data(), kRows, kDim, pointers, inner.data());
  for (std::size_t q = 0; q < kQueries; ++q) {
    std::vector<double> one_distances(kRows), one_inner(kRows);
    optex::streaming::squared_distances(rows.data(), kRows, kDim, pointers[q],
                                        one_distances.data());
    optex::streaming::inner_products(rows.data(), kRows, kDim, pointers[q], one_inner.data());
    for (std::size_t j = 0; j < kRows; ++j) {
      EXPECT_TRUE(SameBits(distances[q * kRows + j], one_distances[j])) << q << ", " << j;
      EXPECT_TRUE(SameBits(inner[q * kRows + j], one_inner[j])) << q << ", " << j;
    }
  }
}

TEST_P(FusedDim, APairsStatisticsFromOnePassEqualFourPasses) {
  const std::size_t dim = GetParam();
  const std::vector<float> a = optex::test::UniformStart(dim, 2);
  const std::vector<float> b = optex::test::UniformStart(dim, 3);
  const auto s = optex::streaming::pair_statistics(BlockPool(2), a.data(), b.data(), dim);
  double squared = 0.0;
  optex::streaming::squared_distances(a.data(), 1, dim, b.data(), &squared);
  EXPECT_TRUE(SameBits(s.aa, optex::streaming::dot(a.data(), a.data(), dim)));
  EXPECT_TRUE(SameBits(s.ab, optex::streaming::dot(a.data(), b.data(), dim)));
  EXPECT_TRUE(SameBits(s.bb, optex::streaming::dot(b.data(), b.data(), dim)));
  EXPECT_TRUE(SameBits(s.squared_distance, squared));
}

// Everything two histories hold: ring position, version, rows and statistics.
::testing::AssertionResult SameHistory(const GradientHistory& a, const GradientHistory& b) {
  if (a.size() != b.size() || a.next_slot() != b.next_slot() || a.version() != b.version()) {
    return ::testing::AssertionFailure() << "size, next slot or version";
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!SameBits(a.squared_norm(i), b.squared_norm(i)))
      return ::testing::AssertionFailure() << "squared norm " << i;
    if (!BitEqual(a.point(i), b.point(i)) || !BitEqual(a.gradient(i), b.gradient(i)))
      return ::testing::AssertionFailure() << "row " << i;
    for (std::size_t j = 0; j < a.size(); ++j) {
      if (i == j) continue;
      if (!SameBits(a.squared_distance(i, j), b.squared_distance(i, j)) ||
          !SameBits(a.gradient_inner(i, j), b.gradient_inner(i, j))) {
        return ::testing::AssertionFailure() << "statistics (" << i << ", " << j << ")";
      }
    }
    if (!SameBits(a.gradient_inner(i, i), b.gradient_inner(i, i)))
      return ::testing::AssertionFailure() << "gradient norm " << i;
  }
  return ::testing::AssertionSuccess();
}

// Pushes `before` pairs one at a time into both, then `count` more: one at a
// time into `one`, all at once into `fused`.
void PushBoth(GradientHistory& one, GradientHistory& fused, std::size_t before, std::size_t count,
              unsigned seed) {
  const std::size_t dim = one.dim();
  for (std::size_t k = 0; k < before; ++k) {
    const auto x = optex::test::UniformStart(dim, seed + 100 + static_cast<unsigned>(k));
    const auto g = optex::test::UniformStart(dim, seed + 200 + static_cast<unsigned>(k));
    one.push(x, g);
    fused.push(x, g);
  }
  std::vector<std::vector<float>> xs, gs;
  std::vector<const float*> xp, gp;
  for (std::size_t k = 0; k < count; ++k) {
    xs.push_back(optex::test::UniformStart(dim, seed + 300 + static_cast<unsigned>(k)));
    gs.push_back(optex::test::UniformStart(dim, seed + 400 + static_cast<unsigned>(k)));
  }
  for (std::size_t k = 0; k < count; ++k) {
    one.push(xs[k], gs[k]);
    xp.push_back(xs[k].data());
    gp.push_back(gs[k].data());
  }
  fused.push_all(xp, gp, BlockPool(3));
}

TEST_P(FusedDim, PushingAllPairsAtOnceEqualsPushingThemOneByOne) {
  const std::size_t dim = GetParam();
  struct Case {
    std::size_t capacity, before, count;
  };
  // Into an empty ring, a partly full one, across the wrap, and more pairs than
  // the ring holds (the first ones are overwritten within the same push).
  for (const Case c : {Case{5, 0, 3}, Case{8, 2, 4}, Case{5, 4, 4}, Case{3, 1, 5}, Case{4, 4, 4}}) {
    GradientHistory one(c.capacity, dim);
    GradientHistory fused(c.capacity, dim);
    PushBoth(one, fused, c.before, c.count, static_cast<unsigned>(c.capacity * 10 + c.before));
    EXPECT_TRUE(SameHistory(one, fused))
        << "capacity " << c.capacity << ", " << c.before << " before, " << c.count << " at once";
  }
}

INSTANTIATE_TEST_SUITE_P(Dims, FusedDim, ::testing::Values(1, 1023, 4096, 9001, 300007));

TEST(FusedPush, NoPairsChangesNothingAndMismatchedListsAreRefusedBeforeAnyWrite) {
  GradientHistory history(4, 16);
  const auto x = optex::test::UniformStart(16, 1);
  const auto g = optex::test::UniformStart(16, 2);
  history.push(x, g);
  GradientHistory before = history;
  history.push_all({}, {});
  EXPECT_TRUE(SameHistory(history, before));
  const std::vector<const float*> two = {x.data(), x.data()};
  const std::vector<const float*> one = {g.data()};
  EXPECT_THROW(history.push_all(two, one), std::invalid_argument);
  EXPECT_TRUE(SameHistory(history, before));
  EXPECT_THROW(history.push(std::span<const float>(x.data(), 15), g), std::invalid_argument);
  EXPECT_TRUE(SameHistory(history, before));
}

// ---- a GP proxy step: weights, then the GP mean, the copy and the update in one pass ----

TEST(FusedProxyStep, TheEnginesProxyPointsArePredictCopyAndApplyStepBitForBit) {
  constexpr std::size_t kDim = 3 * 4096 + 77;
  optex::Options options;
  options.parallelism = 4;
  options.history = 6;
  options.lengthscale_selection = optex::LengthscaleSelection::fixed;
  options.lengthscale = 30.0;
  options.threads = 3;
  const optex::OptimizerRanges ranges(
      {{kDim / 3, optex::adamw(1e-2, 0.1)}, {kDim - kDim / 3, optex::adamw(3e-3, 0.0)}});
  optex::Engine engine(optex::test::UniformStart(kDim, 9), ranges, options);
  const optex::test::Quartic objective;
  for (int round = 0; round < 4; ++round) {  // fills the history past its capacity
    optex::Batch& batch = engine.ask();
    for (int i = 0; i < batch.size(); ++i)
      batch.loss(i) = objective.EvaluateWithGradient(batch.point(i), batch.grad(i));
    engine.tell(batch);
  }
  // The reference: the unfused calls, on copies of what the engine steps from.
  const GradientHistory history = engine.history();
  optex::OptimizerState state = engine.optimizer_state();
  optex::GpGradientEstimator estimator(options.kernel, options.noise, options.input_scaling,
                                       static_cast<std::size_t>(options.history));
  estimator.fit(history, engine.lengthscale());
  std::vector<float> x(engine.iterate().begin(), engine.iterate().end());
  const optex::Batch& batch = engine.ask();
  const optex::OptimizerRanges sized = ranges.for_dimension(kDim);
  std::vector<float> predicted(kDim);
  for (int i = 0; i + 1 < batch.size(); ++i) {
    estimator.predict(history, x, predicted);
    optex::apply_step(sized, x, state, predicted);
    ASSERT_TRUE(BitEqual(batch.predicted_gradient(i), predicted)) << "point " << i;
    ASSERT_TRUE(BitEqual(batch.point(i + 1), x)) << "point " << i + 1;
  }
}

// The CPU primitives on 3 threads, a dimension of two blocks and a partial
// one, and a history of kRows random rows with fixed weights: what the step
// tests below drive.
class CpuStep : public ::testing::Test {
 protected:
  static constexpr std::size_t kDim = 2 * 4096 + 77;
  static constexpr std::size_t kRows = 5;

  std::vector<float> random_row(std::size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = normal_(rng_);
    return v;
  }
  // A copy of v in the primitives' memory.
  float* put(const std::vector<float>& v) {
    float* to = p->floats(v.size());
    std::memcpy(to, v.data(), v.size() * sizeof(float));
    return to;
  }

  std::mt19937 rng_{21};
  std::normal_distribution<float> normal_{0.0f, 1.0f};
  const std::unique_ptr<optex::detail::DevicePrimitives> p = optex::detail::make_cpu_primitives(3);
  const float* history = put(random_row(kRows * kDim));
  double* weights = [this] {
    double* w = p->doubles(kRows);
    for (std::size_t j = 0; j < kRows; ++j) w[j] = 0.3 - 0.1 * static_cast<double>(j);
    return w;
  }();
};

// The CPU primitives' step out of place (state_in != state_out) is the
// in-place step on a copy, bit for bit, with a given row and with weights,
// and reads its source state without writing it: the backend steps from the
// committed state into the work state without copying it first.
TEST_F(CpuStep, OutOfPlaceIsTheInPlaceStepOnACopyBitForBit) {
  for (const auto& config : optex::test::EveryKind()) {
    SCOPED_TRACE(config.name);
    const optex::OptimizerRanges ranges = config.optimizer.for_dimension(kDim);
    const std::vector<float> x0 = random_row(kDim);
    const float* g = put(random_row(kDim));
    for (const bool weighted : {false, true}) {
      SCOPED_TRACE(weighted ? "weights" : "a given row");
      optex::detail::StateRows source, copy, target;
      std::vector<float> initial[optex::kMaxStateSlots];
      for (int j = 0; j < optex::kMaxStateSlots; ++j) {
        if (!ranges.state_slots().uses(j)) continue;
        std::vector<float> values = random_row(kDim);
        for (float& v : values) v = std::abs(v);  // second moments are >= 0
        initial[j] = values;
        source.slot[j] = put(values);
        copy.slot[j] = put(values);
        target.slot[j] = put(std::vector<float>(kDim, -7.0f));
      }
      optex::detail::StepGradient gradient;
      if (weighted) {
        gradient.history = optex::detail::fp32_rows(history);
        gradient.weights = weights;
        gradient.rows = kRows;
      } else {
        gradient.row = g;
      }
      float* x_in = put(x0);
      float* x_in_place = put(x0);
      float* x_out = put(std::vector<float>(kDim, -7.0f));
      p->step(ranges, 3, source, target, x_in, x_out, gradient, kDim, {});
      p->step(ranges, 3, copy, copy, x_in_place, x_in_place, gradient, kDim, {});
      p->fetch({});
      ASSERT_TRUE(
          BitEqual(std::span<const float>(x_out, kDim), std::span<const float>(x_in_place, kDim)));
      EXPECT_TRUE(BitEqual(std::span<const float>(x_in, kDim), x0)) << "x_in written";
      for (int j = 0; j < optex::kMaxStateSlots; ++j) {
        if (source.slot[j] == nullptr) continue;
        EXPECT_TRUE(BitEqual(std::span<const float>(target.slot[j], kDim),
                             std::span<const float>(copy.slot[j], kDim)))
            << "slot " << j;
        EXPECT_TRUE(BitEqual(std::span<const float>(source.slot[j], kDim), initial[j]))
            << "slot " << j << ": the source state was written";
        EXPECT_FALSE(BitEqual(std::span<const float>(copy.slot[j], kDim), initial[j]))
            << "slot " << j << ": the step changed nothing, so the test proves nothing";
      }
    }
  }
}

// The checks a step takes in its own pass (the bound of x_out, the finiteness
// of each state slot, ||g||^2, ||x_out - x_in||^2) are what within_bound(),
// dot() and squared_distances() give after it, on every optimizer, with a given row and with
// weights, for finite gradients, a NaN or an infinity in the last (partial) block, a value just
// over the bound and a bound every value exceeds; a norm of a weighted step
// without its sum row is refused before anything is written.
TEST_F(CpuStep, ItsOwnChecksAreWithinBoundDotAndSquaredDistancesAfterIt) {
  constexpr float kBound = 1e6f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* name;
    bool bad_gradient;  // the gradient's last coordinate := gradient_value
    float gradient_value;
    bool x_over_bound;  // x's first coordinate := just over twice the bound
    float bound;
    bool passes;
  };
  const Case cases[] = {{"finite", false, 0.0f, false, kBound, true},
                        {"a NaN gradient", true, nan, false, kBound, false},
                        {"an infinite gradient", true, inf, false, kBound, false},
                        {"x over the bound", false, 0.0f, true, kBound, false},
                        {"a bound every value exceeds", false, 0.0f, false, 1e-30f, false}};
  for (const auto& config : optex::test::EveryKind()) {
    const optex::OptimizerRanges ranges = config.optimizer.for_dimension(kDim);
    for (const Case& k : cases) {
      for (const bool weighted : {false, true}) {
        SCOPED_TRACE(config.name + ", " + k.name + (weighted ? ", weights" : ", a given row"));
        std::vector<float> g0 = random_row(kDim);
        if (k.bad_gradient) g0.back() = k.gradient_value;
        std::vector<float> x0 = random_row(kDim);
        if (k.x_over_bound) x0.front() = std::nextafter(2 * kBound, inf);
        optex::detail::StateRows state;
        for (int j = 0; j < optex::kMaxStateSlots; ++j) {
          if (ranges.state_slots().uses(j)) state.slot[j] = put(std::vector<float>(kDim, 0.5f));
        }
        optex::detail::StepGradient gradient;
        if (weighted) {
          std::vector<float> rows(history, history + kRows * kDim);
          if (k.bad_gradient) rows.back() = k.gradient_value;
          gradient.history = optex::detail::fp32_rows(put(rows));
          gradient.weights = weights;
          gradient.rows = kRows;
          gradient.sum = p->floats(kDim);
        } else {
          gradient.row = put(g0);
        }
        const float* x_in = put(x0);
        float* x = p->floats(kDim);
        const int slots = ranges.state_slots().count();
        int* flags = p->ints(static_cast<std::size_t>(1 + slots));
        double* norm = p->doubles(1);
        double* length = p->doubles(1);
        p->step(ranges, 2, state, state, x_in, x, gradient, kDim, {flags, k.bound, norm, length});
        int* expected_flags = p->ints(static_cast<std::size_t>(1 + slots));
        double* expected_norm = p->doubles(1);
        double* expected_length = p->doubles(1);
        p->within_bound(x, 1, kDim, k.bound, expected_flags);
        const optex::detail::StoredRows from = optex::detail::fp32_rows(x_in);
        p->squared_distances(optex::detail::fp32_rows(x), 1, kDim, {&from, 1}, expected_length);
        int r = 1;
        for (int j = 0; j < optex::kMaxStateSlots; ++j) {
          if (state.slot[j] != nullptr) {
            p->within_bound(state.slot[j], 1, kDim, FLT_MAX, expected_flags + r++);
          }
        }
        const float* g = weighted ? gradient.sum : gradient.row;
        p->dot(g, g, kDim, expected_norm);
        p->fetch({});
        for (int f = 0; f <= slots; ++f) EXPECT_EQ(flags[f], expected_flags[f]) << "flag " << f;
        EXPECT_TRUE(SameBits(*norm, *expected_norm)) << *norm << " against " << *expected_norm;
        EXPECT_TRUE(SameBits(*length, *expected_length))
            << *length << " against " << *expected_length;
        if (k.bad_gradient) {
          // What x becomes is the optimizer's (Lion's sign step stays finite); the norm is not.
          EXPECT_FALSE(std::isfinite(*norm));
        } else {
          EXPECT_EQ(flags[0], k.passes ? 1 : 0) << "the check of x decided wrongly";
        }
      }
    }
    // Refused before anything is written: x stays as it was.
    const std::vector<float> x0 = random_row(kDim);
    float* x = put(x0);
    double* norm = p->doubles(1);
    optex::detail::StateRows state;
    for (int j = 0; j < optex::kMaxStateSlots; ++j) {
      if (ranges.state_slots().uses(j)) state.slot[j] = put(std::vector<float>(kDim, 0.5f));
    }
    const optex::detail::StepGradient no_sum{
        .history = optex::detail::fp32_rows(history), .weights = weights, .rows = kRows};
    EXPECT_THROW(p->step(ranges, 2, state, state, x, x, no_sum, kDim, {nullptr, 0.0f, norm}),
                 std::invalid_argument);
    // A length needs two rows: in place it would be zero by construction.
    const optex::detail::StepGradient row{.row = put(random_row(kDim))};
    EXPECT_THROW(p->step(ranges, 2, state, state, x, x, row, kDim, {nullptr, 0.0f, nullptr, norm}),
                 std::invalid_argument);
    EXPECT_TRUE(BitEqual(std::span<const float>(x, kDim), x0));
  }
}

TEST(StepInParts, AnyPartsInAnyOrderEqualApplyStepAndAStepCountsOnce) {
  constexpr std::size_t kDim = 10'001;
  const optex::OptimizerRanges ranges(
      {{3000, optex::adamw(1e-3, 0.05)}, {kDim - 3000, optex::adamw(2e-3, 0.0)}});
  std::vector<float> x_whole = optex::test::UniformStart(kDim, 1);
  std::vector<float> x_parts = x_whole;
  const std::vector<float> g = optex::test::UniformStart(kDim, 2);
  optex::OptimizerState s_whole = optex::init_state(ranges, kDim);
  optex::OptimizerState s_parts = s_whole;
  optex::apply_step(ranges, x_whole, s_whole, g);
  optex::StepInParts step(ranges, x_parts, s_parts, g);
  // Backwards, across the range boundary, the last part running past the end.
  step.update(9000, 20'000);
  step.update(2999, 9000);
  step.update(0, 2999);
  step.finish();
  step.finish();
  EXPECT_TRUE(BitEqual(x_whole, x_parts));
  EXPECT_TRUE(optex::test::StateBitEqual(s_whole, s_parts));
  EXPECT_EQ(s_parts.step, 1);
}

TEST(StepInParts, RefusesWhatApplyStepRefusesBeforeWriting) {
  const optex::OptimizerRanges ranges(optex::Adam{.lr = 1e-3});
  std::vector<float> x = optex::test::UniformStart(16, 3);
  const std::vector<float> short_g = optex::test::UniformStart(15, 4);
  optex::OptimizerState s = optex::init_state(ranges, 16);
  const std::vector<float> x_before = x;
  EXPECT_THROW(optex::StepInParts(ranges.for_dimension(16), x, s, short_g), std::invalid_argument);
  optex::OptimizerState wrong = optex::init_state(optex::OptimizerRanges(optex::Sgd{}), 16);
  const std::vector<float> g = optex::test::UniformStart(16, 5);
  EXPECT_THROW(optex::StepInParts(ranges.for_dimension(16), x, wrong, g), std::invalid_argument);
  EXPECT_TRUE(BitEqual(x, x_before));
  EXPECT_EQ(s.step, 0);
  EXPECT_EQ(wrong.step, 0);
}

}  // namespace
