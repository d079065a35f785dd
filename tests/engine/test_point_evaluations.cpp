// Points with several evaluations, the posterior variance, the safeguards and
// the adaptive strategy (DESIGN.md section 2): their invariants, bit for bit
// where the design promises it, on the CPU engine.
//
//   - D = 1 with a chain is the plain engine; P = 1 (D = N) is the base
//     optimizer stepping with the mean of N gradients;
//   - every safeguard changes nothing where it does not trigger, and triggers
//     on a constructed case;
//   - the posterior variance is >= 0, near the noise at history points and
//     grows away from them;
//   - runs are deterministic and checkpoints resume them bit for bit;
//   - bad values are refused with a clear error, and a refused tell changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "optex/engine/adaptive_split.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/util/random.hpp"
#include "support/engine_equality.hpp"
#include "support/scratch_directory.hpp"
#include "support/test_support.hpp"
#include "support/throws_with.hpp"

namespace {

using namespace optex;
using namespace optex::test;

constexpr std::size_t kDim = 30;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void EvaluateRows(const NoisyQuadratic& f, Batch& b) {
  for (int r = 0; r < b.size(); ++r)
    b.loss(r) = f.EvaluateWithGradient(b.point(r), b.grad(r), b.seed(r));
}

Options With(int n, int evaluations_per_point, std::uint64_t seed = 3) {
  Options o = WithN(n, seed);
  o.evaluations_per_point = evaluations_per_point;
  return o;
}

// ---- points with several evaluations --------------------------------------------------

TEST(PointEvaluations, RowsOfAPointAreOnePointWithTheirOwnSeeds) {
  const NoisyQuadratic f{.sigma = 0.3};
  Engine e(UniformStart(kDim, 1), Adam{.lr = 0.02}, With(6, 3));
  for (int t = 0; t < 5; ++t) {
    Batch& b = e.ask();
    ASSERT_EQ(b.size(), 6);
    for (int r = 0; r < 6; ++r) {
      EXPECT_TRUE(BitEqual(b.point(r), b.point(r / 3 * 3))) << "row " << r;
      for (int q = 0; q < r; ++q) EXPECT_NE(b.seed(r), b.seed(q)) << "rows " << q << ", " << r;
    }
    EvaluateRows(f, b);
    const std::size_t before = e.history().size();
    const IterationInfo& info = e.tell(b);
    EXPECT_EQ(info.point_evaluations, (std::vector<int>{3, 3}));
    EXPECT_EQ(e.history().size(), std::min<std::size_t>(before + 2, e.history().capacity()))
        << "one history pair per point, not per evaluation";
    EXPECT_TRUE(std::isfinite(info.gradient_noise)) << "three evaluations measure the noise";
    EXPECT_GT(info.gradient_noise, 0.0);
  }
  EXPECT_EQ(e.evaluations(), 30);
}

// The history holds each point's mean gradient: the rows summed in double in
// row order, divided by the count.
TEST(PointEvaluations, ThePointsGradientIsTheMeanOfItsRows) {
  const NoisyQuadratic f{.sigma = 0.5};
  Engine e(UniformStart(kDim, 2), Sgd{.lr = 0.05}, With(4, 2));
  Batch& b = e.ask();
  EvaluateRows(f, b);
  std::vector<float> mean(kDim);
  for (std::size_t j = 0; j < kDim; ++j) {
    mean[j] = static_cast<float>((static_cast<double>(b.grad(2)[j]) + b.grad(3)[j]) / 2.0);
  }
  e.tell(b);
  const GradientHistory& h = e.history();
  EXPECT_TRUE(BitEqual(h.gradient(h.newest_slot()), mean));
}

// P = 1: every evaluation at the iterate, and the step is the base
// optimizer's with the mean gradient: N x minibatch, bit for bit.
TEST(PointEvaluations, OnePointIsTheMeanGradientStepBitForBit) {
  const NoisyQuadratic f{.sigma = 0.4};
  const std::vector<float> x0 = UniformStart(kDim, 4);
  for (const Optimizer& optimizer :
       {Optimizer{Adam{.lr = 0.03}}, Optimizer{Sgd{.lr = 0.05, .momentum = 0.9}}}) {
    Engine e(x0, optimizer, With(4, 4));
    std::vector<float> x = x0;
    OptimizerState s = init_state(optimizer, kDim);
    std::vector<float> rows(4 * kDim), g(kDim);
    for (int t = 0; t < 12; ++t) {
      Batch& b = e.ask();
      for (int r = 0; r < 4; ++r) {
        ASSERT_TRUE(BitEqual(b.point(r), x)) << "iteration " << t << ", row " << r;
        f.EvaluateWithGradient(x, std::span<float>(rows).subspan(r * kDim, kDim), b.seed(r));
      }
      for (std::size_t j = 0; j < kDim; ++j) {
        double sum = 0.0;
        for (int r = 0; r < 4; ++r) sum += rows[r * kDim + j];
        g[j] = static_cast<float>(sum / 4.0);
      }
      EvaluateRows(f, b);
      const IterationInfo& info = e.tell(b);
      apply_step(optimizer, x, s, g);
      ASSERT_TRUE(BitEqual(e.iterate(), x)) << "iteration " << t;
      ASSERT_TRUE(StateBitEqual(e.optimizer_state(), s)) << "iteration " << t;
      EXPECT_EQ(info.point_evaluations, std::vector<int>{4});
      EXPECT_TRUE(std::isnan(info.cosine)) << "one point: nothing is predicted";
    }
  }
}

// A chain with one evaluation per point and safeguards that never trigger is
// the plain engine, bit for bit, in every observable.
TEST(PointEvaluations, SafeguardsThatDoNotTriggerChangeNothing) {
  const NoisyQuadratic f{.sigma = 0.05};
  const std::vector<float> x0 = UniformStart(kDim, 5);
  Options plain = With(4, 1);
  plain.history = 8;
  Options guarded = plain;
  guarded.max_posterior_variance = 1e6;
  guarded.trust_region = 1e6;
  guarded.max_lengthscale_change = 1e6;
  Options best = plain;
  best.continue_from = ContinueFrom::best_loss;
  for (const Options& other : {guarded, best}) {
    Engine a(x0, Adam{.lr = 0.02}, plain);
    Engine b(x0, Adam{.lr = 0.02}, other);
    for (int t = 0; t < 15; ++t) {
      Batch& ba = a.ask();
      Batch& bb = b.ask();
      for (int r = 0; r < 4; ++r) ASSERT_TRUE(BitEqual(ba.point(r), bb.point(r)));
      EvaluateRows(f, ba);
      // With continue_from = best_loss the last point must stay the best:
      // report losses that fall along the chain.
      for (int r = 0; r < 4; ++r) ba.loss(r) = 10.0 - r;
      EvaluateRows(f, bb);
      for (int r = 0; r < 4; ++r) bb.loss(r) = 10.0 - r;
      const IterationInfo ia = a.tell(ba);
      const IterationInfo& ib = b.tell(bb);
      ASSERT_TRUE(SameEngine(a, b)) << "iteration " << t;
      EXPECT_EQ(ia.committed_point, ib.committed_point);
      EXPECT_STREQ(ib.chain_stop, "");
    }
  }
}

// ---- the posterior variance -----------------------------------------------------------

TEST(PosteriorVariance, NearTheNoiseAtHistoryPointsAndGrowingAway) {
  const std::size_t d = 5;
  GradientHistory h(8, d);
  SplitMix64 rng(9);
  std::vector<std::vector<float>> points;
  for (int j = 0; j < 6; ++j) {
    std::vector<float> x(d), g(d);
    for (std::size_t i = 0; i < d; ++i) {
      x[i] = static_cast<float>(rng.uniform(-1, 1));
      g[i] = static_cast<float>(rng.uniform(-1, 1));
    }
    h.push(x, g);
    points.push_back(x);
  }
  const double noise = 1e-3;
  GpGradientEstimator gp(Covariance::matern52, noise, InputScaling::none, 8);
  gp.fit(h, 0.8);
  std::vector<float> mu(d);
  for (const auto& x : points) {
    gp.predict(h, x, mu);
    EXPECT_GE(gp.variance(), 0.0);
    EXPECT_LE(gp.variance(), 1.01 * noise) << "at a history point";
  }
  // Along a ray away from the first point the variance grows towards 1.
  double previous = -1.0;
  for (const double t : {0.0, 0.2, 0.5, 1.0, 3.0, 30.0}) {
    std::vector<float> x = points[0];
    for (float& v : x) v += static_cast<float>(t);
    gp.predict(h, x, mu);
    EXPECT_GE(gp.variance(), previous - 1e-12) << "t = " << t;
    EXPECT_LE(gp.variance(), 1.0);
    previous = gp.variance();
  }
  EXPECT_GT(previous, 0.99) << "far from every history point";
}

TEST(PosteriorVariance, ReportedPerPointWhereTheGpPredicted) {
  const NoisyQuadratic f{.sigma = 0.0};
  Engine e(UniformStart(kDim, 6), Adam{.lr = 0.02}, With(4, 1));
  for (int t = 0; t < 6; ++t) {
    Batch& b = e.ask();
    EvaluateRows(f, b);
    const IterationInfo& info = e.tell(b);
    ASSERT_EQ(info.posterior_variance.size(), 4u);
    ASSERT_EQ(info.prediction_error.size(), 4u);
    EXPECT_TRUE(std::isnan(info.posterior_variance[3])) << "no step leaves the last point";
    EXPECT_TRUE(std::isnan(info.prediction_error[3]));
    if (t < 2) continue;  // warm-up: no GP yet
    for (int p = 0; p < 3; ++p) {
      EXPECT_GE(info.posterior_variance[p], 0.0);
      EXPECT_LE(info.posterior_variance[p], 1.0);
      EXPECT_GE(info.prediction_error[p], 0.0);
    }
  }
}

// ---- safeguards that trigger ----------------------------------------------------------

TEST(Safeguards, AVarianceLimitEndsTheChainAndTheLastPointTakesTheEvaluations) {
  const NoisyQuadratic f{.sigma = 0.0};
  Options o = With(4, 1);
  o.max_posterior_variance = 1e-12;  // any point off the history is too uncertain
  Engine e(UniformStart(kDim, 7), Adam{.lr = 0.02}, o);
  for (int t = 0; t < 6; ++t) {
    Batch& b = e.ask();
    EvaluateRows(f, b);
    const IterationInfo& info = e.tell(b);
    if (t == 0) {  // warm-up: no history, no GP, no variance
      EXPECT_STREQ(info.chain_stop, "");
      continue;
    }
    EXPECT_STREQ(info.chain_stop, "posterior_variance");
    EXPECT_EQ(info.point_evaluations, std::vector<int>{4});
    EXPECT_GT(info.posterior_variance[0], 1e-12);
  }
}

TEST(Safeguards, ATrustRegionEndsTheChainWhereItStrays) {
  const NoisyQuadratic f{.sigma = 0.0};
  Options o = With(4, 1);
  o.trust_region = 1e-6;  // no proxy point may move at all
  const std::vector<float> x0 = UniformStart(kDim, 8);
  Engine e(x0, Adam{.lr = 0.02}, o);
  for (int t = 0; t < 5; ++t) {
    Batch& b = e.ask();
    EvaluateRows(f, b);
    const IterationInfo& info = e.tell(b);
    if (t < 2) continue;  // the first round has no step to compare with; the second holds
    EXPECT_STREQ(info.chain_stop, "trust_region") << "iteration " << t;
    EXPECT_EQ(info.point_evaluations, std::vector<int>{4});
  }
}

TEST(Safeguards, TheLengthscaleGuardBoundsEachSelection) {
  const NoisyQuadratic f{.sigma = 0.0};
  Options free = With(4, 1);
  free.lengthscale = 1e-3;  // far from what the selection wants
  Options held = free;
  held.max_lengthscale_change = 1.0;
  Options limited = free;
  limited.max_lengthscale_change = 2.0;
  Engine a(UniformStart(kDim, 9), Adam{.lr = 0.02}, free);
  Engine b(UniformStart(kDim, 9), Adam{.lr = 0.02}, held);
  Engine c(UniformStart(kDim, 9), Adam{.lr = 0.02}, limited);
  double previous = limited.lengthscale;
  for (int t = 0; t < 6; ++t) {
    for (Engine* e : {&a, &b, &c}) {
      Batch& batch = e->ask();
      EvaluateRows(f, batch);
      e->tell(batch);
    }
    EXPECT_EQ(b.lengthscale(), held.lengthscale);
    EXPECT_LE(c.lengthscale(), 2.0 * previous * (1 + 1e-12));
    EXPECT_GE(c.lengthscale(), previous / 2.0 * (1 - 1e-12));
    previous = c.lengthscale();
  }
  EXPECT_GT(a.lengthscale(), 100 * free.lengthscale) << "without the guard the selection moves";
}

// Continue from the best loss: a round whose first point has the lowest loss
// commits the base optimizer's step from that point with its own gradient.
TEST(Safeguards, ContinueFromTheBestLossStepsFromTheBestPoint) {
  const NoisyQuadratic f{.sigma = 0.0};
  Options o = With(4, 1);
  o.continue_from = ContinueFrom::best_loss;
  const Optimizer optimizer = Adam{.lr = 0.02};
  Engine e(UniformStart(kDim, 10), optimizer, o);
  for (int t = 0; t < 4; ++t) {
    Batch& b = e.ask();
    EvaluateRows(f, b);
    e.tell(b);
  }
  std::vector<float> x(e.iterate().begin(), e.iterate().end());
  OptimizerState s = e.optimizer_state();
  Batch& b = e.ask();
  EvaluateRows(f, b);
  for (int r = 0; r < 4; ++r) b.loss(r) = r == 0 ? -1.0 : 5.0 + r;
  std::vector<float> g0(b.grad(0).begin(), b.grad(0).end());
  const IterationInfo& info = e.tell(b);
  EXPECT_EQ(info.committed_point, 0);
  apply_step(optimizer, x, s, g0);
  EXPECT_TRUE(BitEqual(e.iterate(), x));
  EXPECT_TRUE(StateBitEqual(e.optimizer_state(), s));
}

// ---- the adaptive strategy ------------------------------------------------------------

TEST(AdaptiveSplit, TheRuleFollowsTheMeasuredNoise) {
  AdaptiveSplit rule(8, 1);
  EXPECT_EQ(rule.evaluations_per_point(), 1);
  rule.update(kNaN, 0.95);  // good predictions, nothing measured: stay
  EXPECT_EQ(rule.evaluations_per_point(), 1);
  rule.update(kNaN, 0.1);  // suspect, never measured: probe with the smallest split
  EXPECT_EQ(rule.evaluations_per_point(), 2);
  rule.update(0.0, kNaN);  // measured: noise-free
  EXPECT_EQ(rule.evaluations_per_point(), 1);
  rule.update(kNaN, 0.1);  // suspect again, but measured one round ago: no probe yet
  EXPECT_EQ(rule.evaluations_per_point(), 1);
  rule.update(0.9, kNaN);  // 0.9 / 4 <= 0.25
  EXPECT_EQ(rule.evaluations_per_point(), 4);
  rule.update(1e9, kNaN);  // nothing suffices: every evaluation at one point
  EXPECT_EQ(rule.evaluations_per_point(), 8);
  rule.update(std::numeric_limits<double>::infinity(), kNaN);
  EXPECT_EQ(rule.noise(), AdaptiveSplit::kMaxNoise);
}

TEST(AdaptiveSplit, RestoreRefusesWhatNoRunReaches) {
  AdaptiveSplit rule(6, 1);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { rule.restore(4, 0.1, 0); }, {"divide"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { rule.restore(0, 0.1, 0); }, {"divide"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { rule.restore(2, -1.0, 0); }, {"noise"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { rule.restore(2, std::numeric_limits<double>::infinity(), 0); }, {"noise"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { rule.restore(2, 0.1, -3); }, {"rounds"}));
  EXPECT_EQ(rule.evaluations_per_point(), 1) << "a refused restore changes nothing";
  EXPECT_TRUE(std::isnan(rule.noise()));
}

TEST(AdaptiveStrategy, NoiseFreeGradientsKeepOneEvaluationPerPoint) {
  const NoisyQuadratic f{.sigma = 0.0};
  Engine e(UniformStart(kDim, 11), Adam{.lr = 0.02}, Options::adaptive(4));
  int full_rounds = 0;
  for (int t = 0; t < 25; ++t) {
    Batch& b = e.ask();
    EvaluateRows(f, b);
    const IterationInfo& info = e.tell(b);
    const int points = static_cast<int>(info.point_evaluations.size());
    if (t == 0) {
      // The warm-up round: all four evaluations at the start, which measure the noise.
      EXPECT_EQ(info.point_evaluations, std::vector<int>{4});
      EXPECT_EQ(info.gradient_noise, 0.0);
      continue;
    }
    // A probe may split in two; the noise it measures is zero, so the split ends.
    EXPECT_GE(points, 2) << "iteration " << t;
    full_rounds += points == 4;
    if (std::isfinite(info.gradient_noise)) {
      EXPECT_EQ(info.gradient_noise, 0.0);
    }
  }
  EXPECT_GE(full_rounds, 20);
}

TEST(AdaptiveStrategy, NoiseDominatedGradientsGoToOnePoint) {
  const NoisyQuadratic f{.sigma = 50.0};
  Engine e(UniformStart(kDim, 12), Adam{.lr = 0.02}, Options::adaptive(4));
  int one_point_rounds = 0;
  for (int t = 0; t < 30; ++t) {
    Batch& b = e.ask();
    EvaluateRows(f, b);
    const IterationInfo& info = e.tell(b);
    one_point_rounds += info.point_evaluations.size() == 1;
  }
  EXPECT_GE(one_point_rounds, 20) << "noise this large calls for N x minibatch";
  EXPECT_EQ(e.last_info().point_evaluations, std::vector<int>{4});
}

// Same seed, same trajectory; and a checkpoint taken mid-run resumes the
// strategy's state with the rest, bit for bit.
TEST(AdaptiveStrategy, DeterministicAndResumedBitForBit) {
  const NoisyQuadratic f{.sigma = 2.0};
  ScratchDirectory dir("optex_test_point_evaluations");
  Options o = Options::adaptive(4);
  o.seed = 21;
  o.trust_region = 50.0;
  o.max_posterior_variance = 0.9;
  const std::vector<float> x0 = UniformStart(kDim, 13);
  Engine a(x0, Adam{.lr = 0.02}, o);
  Engine b(x0, Adam{.lr = 0.02}, o);
  for (int t = 0; t < 20; ++t) {
    for (Engine* e : {&a, &b}) {
      Batch& batch = e->ask();
      EvaluateRows(f, batch);
      e->tell(batch);
    }
    ASSERT_TRUE(SameEngine(a, b)) << "iteration " << t;
  }
  const std::string path = dir.path("adaptive.ckpt");
  a.save(path);
  Engine c = Engine::load(path);
  EXPECT_EQ(c.options().strategy, Strategy::adaptive);
  EXPECT_EQ(c.options().trust_region, 50.0);
  for (int t = 0; t < 15; ++t) {
    for (Engine* e : {&a, &c}) {
      Batch& batch = e->ask();
      EvaluateRows(f, batch);
      e->tell(batch);
    }
    ASSERT_TRUE(SameEngine(a, c)) << "iteration " << t << " after the restore";
    EXPECT_EQ(a.last_info().point_evaluations, c.last_info().point_evaluations);
  }
}

// ---- bad input ------------------------------------------------------------------------

TEST(PointEvaluationsBadInput, EveryBadOptionIsRefusedByName) {
  const std::vector<float> x0 = UniformStart(kDim, 14);
  struct Case {
    std::string name;
    Options options;
    std::string expected;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, auto change, std::string expected) {
    Options o = WithN(4);
    change(o);
    cases.push_back({std::move(name), o, std::move(expected)});
  };
  add(
      "D = 0", [](Options& o) { o.evaluations_per_point = 0; }, "evaluations_per_point");
  add(
      "D = 3 of 4", [](Options& o) { o.evaluations_per_point = 3; }, "evaluations_per_point");
  add(
      "D > N", [](Options& o) { o.evaluations_per_point = 8; }, "evaluations_per_point");
  add(
      "D < 0", [](Options& o) { o.evaluations_per_point = -4; }, "evaluations_per_point");
  add(
      "strategy", [](Options& o) { o.strategy = static_cast<Strategy>(7); }, "strategy");
  add(
      "continue_from", [](Options& o) { o.continue_from = static_cast<ContinueFrom>(2); },
      "continue_from");
  for (const double bad : {0.0, -1.0, kNaN, -std::numeric_limits<double>::infinity()}) {
    add(
        "variance", [&](Options& o) { o.max_posterior_variance = bad; }, "max_posterior_variance");
    add(
        "trust", [&](Options& o) { o.trust_region = bad; }, "trust_region");
  }
  for (const double bad : {0.0, 0.5, kNaN, -2.0}) {
    add(
        "lengthscale change", [&](Options& o) { o.max_lengthscale_change = bad; },
        "max_lengthscale_change");
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { c.options.validate(); }, {c.expected}));
    EXPECT_TRUE(
        ThrowsWith<std::invalid_argument>([&] { Engine(x0, Adam{}, c.options); }, {c.expected}));
  }
}

// A tell that cannot commit (every evaluation of every point non-finite)
// changes nothing; a point with one bad evaluation keeps the mean of the others.
TEST(PointEvaluationsBadInput, ARefusedTellChangesNothingAndBadRowsLeaveTheMean) {
  const NoisyQuadratic f{.sigma = 0.2};
  const std::vector<float> x0 = UniformStart(kDim, 15);
  Engine e(x0, Adam{.lr = 0.02}, With(4, 2));
  Engine twin(x0, Adam{.lr = 0.02}, With(4, 2));
  for (Engine* engine : {&e, &twin}) {
    Batch& b = engine->ask();
    EvaluateRows(f, b);
    engine->tell(b);
  }
  Batch& b = e.ask();
  EvaluateRows(f, b);
  for (int r = 0; r < 4; ++r) b.loss(r) = kNaN;
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.tell(b); }, {"no pair of iteration 1"}));
  EXPECT_TRUE(e.pending());

  Batch& tb = twin.ask();
  EvaluateRows(f, tb);
  EvaluateRows(f, b);
  ASSERT_TRUE(SameEngine(e, twin)) << "the refusal changed something";
  // Row 1 (point 0's second evaluation) is bad: point 0's gradient is row 0's.
  b.grad(1)[3] = std::numeric_limits<float>::infinity();
  const std::vector<float> row0(b.grad(0).begin(), b.grad(0).end());
  const IterationInfo& info = e.tell(b);
  EXPECT_EQ(info.dropped, 1);
  const GradientHistory& h = e.history();
  const std::size_t point0_slot = (h.newest_slot() + h.capacity() - 1) % h.capacity();
  EXPECT_TRUE(BitEqual(h.gradient(point0_slot), row0));
}

}  // namespace
