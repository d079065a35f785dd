// Tests of the OptEx engine on the CPU: determinism across evaluation threads and
// the DESIGN.md section 2 semantics, checked step by step against hand computations
// with the base optimizers. The invariants that every device must keep (N = 1,
// Proxy::target, same seed same bits, checkpoints, non-finite values, refused calls)
// are in tests/engine/test_engine_invariants.cpp, once per device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/minimize.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/problems/sphere.hpp"
#include "optex/util/random.hpp"
#include "optex/util/thread_pool.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Adam;
using optex::Batch;
using optex::Engine;
using optex::IterationInfo;
using optex::Optimizer;
using optex::OptimizerState;
using optex::Options;
using optex::Sgd;

// ---- helpers ------------------------------------------------------------------

using optex::problems::Sphere;
using optex::test::Quartic;

using optex::test::UniformStart;
using optex::test::WithN;

using optex::test::BitEqual;
using optex::test::StateBitEqual;

// Evaluates every point of the batch with f, in index order.
template <class F>
void Evaluate(const F& f, Batch& b) {
  for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
}

template <class F>
const IterationInfo& Iterate(Engine& e, const F& f) {
  Batch& b = e.ask();
  Evaluate(f, b);
  return e.tell(b);
}

// Base optimizers with state worth checking: momentum + Nesterov, and Adam.
std::vector<Optimizer> BaseOptimizers() {
  return {Sgd{.lr = 0.01, .momentum = 0.9, .nesterov = true}, Adam{.lr = 0.02}};
}

std::string Name(const Optimizer& opt) { return std::string(optex::optimizer_name(opt)); }

// The GP mean of DESIGN.md section 2, from scratch in double: scale inputs by
// the mean over history of sqrt(||x_j||), Matern-5/2 on ||x - x_j|| / (scale * l),
// mu(x) = G^T (K + noise I)^-1 k(X, x).
std::vector<double> ReferenceGpMean(const std::vector<std::vector<float>>& xs,
                                    const std::vector<std::vector<float>>& gs,
                                    std::span<const float> x, double lengthscale, double noise) {
  const auto n = static_cast<Eigen::Index>(xs.size());
  const std::size_t d = x.size();
  auto dist = [d](std::span<const float> a, std::span<const float> b) {
    double s = 0.0;
    for (std::size_t k = 0; k < d; ++k) {
      const double t = static_cast<double>(a[k]) - static_cast<double>(b[k]);
      s += t * t;
    }
    return std::sqrt(s);
  };
  const std::vector<float> zero(d, 0.0f);
  double scale = 0.0;
  for (const auto& p : xs) scale += std::sqrt(dist(p, zero));
  scale /= static_cast<double>(n);
  const double l = scale * lengthscale;
  Eigen::MatrixXd k(n, n);
  Eigen::VectorXd kx(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j < n; ++j) {
      k(i, j) = optex::covariance_value(
          optex::Covariance::matern52,
          dist(xs[static_cast<std::size_t>(i)], xs[static_cast<std::size_t>(j)]) / l);
    }
    k(i, i) += noise;
    kx(i) = optex::covariance_value(optex::Covariance::matern52,
                                    dist(xs[static_cast<std::size_t>(i)], x) / l);
  }
  const Eigen::VectorXd w = k.llt().solve(kx);
  std::vector<double> mu(d, 0.0);
  for (Eigen::Index j = 0; j < n; ++j) {
    for (std::size_t c = 0; c < d; ++c) mu[c] += w(j) * gs[static_cast<std::size_t>(j)][c];
  }
  return mu;
}

double Cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// ---- (a) determinism across threads ----------------------------------------------

// minimize() evaluates on options.parallelism threads; a manual loop on pools of
// other sizes, or sequentially in reverse order, must give the same bits.
TEST(EngineInvariant, MinimizeIsIndependentOfTheThreadCount) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(40, 5);
  constexpr int kIters = 20;
  for (const Optimizer& opt : BaseOptimizers()) {
    SCOPED_TRACE(Name(opt));
    Options o;
    o.parallelism = 5;
    o.seed = 1234;
    const optex::Result r = optex::minimize(f, x0, opt, o, optex::Stop{.max_iters = kIters});
    ASSERT_EQ(r.iterations, kIters);
    const optex::Result again = optex::minimize(f, x0, opt, o, optex::Stop{.max_iters = kIters});
    EXPECT_TRUE(BitEqual(r.x, again.x));

    // Sequential, reverse order.
    Engine manual(x0, opt, o);
    std::vector<double> losses;
    for (int t = 0; t < kIters; ++t) {
      Batch& b = manual.ask();
      for (int i = b.size() - 1; i >= 0; --i) {
        b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
      }
      losses.push_back(manual.tell(b).loss);
    }
    EXPECT_TRUE(BitEqual(r.x, manual.iterate()));
    EXPECT_EQ(r.loss_history, losses);

    // Pools of 1, 2 and 8 threads.
    for (int threads : {1, 2, 8}) {
      SCOPED_TRACE(threads);
      optex::ThreadPool pool(threads);
      Engine e(x0, opt, o);
      for (int t = 0; t < kIters; ++t) {
        Batch& b = e.ask();
        pool.parallel_for(
            b.size(), [&](int i) { b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i)); });
        e.tell(b);
      }
      EXPECT_TRUE(BitEqual(r.x, e.iterate()));
      EXPECT_TRUE(StateBitEqual(e.optimizer_state(), manual.optimizer_state()));
    }
  }
}

// ---- (b) DESIGN.md section 2, step by step ----------------------------------

// Checks one iteration of `engine` against a hand computation from a copy of the
// state before it: x_i = step(x_{i-1}, s_{i-1}, mu_{i-1}), commit = step(x_{N-1},
// s_{N-1}, g_{N-1}), and the history receives all N pairs.
template <class F>
void CheckOneIterationByHand(Engine& engine, const F& f, const Optimizer& opt) {
  const std::vector<float> x_before(engine.iterate().begin(), engine.iterate().end());
  const OptimizerState s_before = engine.optimizer_state();
  const std::size_t h_before = engine.history().size();
  Batch& b = engine.ask();
  const int n = b.size();
  std::vector<float> x = x_before;
  OptimizerState s = s_before;
  ASSERT_TRUE(BitEqual(b.point(0), x));
  for (int i = 1; i < n; ++i) {
    optex::apply_step(opt, x, s, b.predicted_gradient(i - 1));
    ASSERT_TRUE(BitEqual(b.point(i), x)) << "proxy point " << i;
  }
  Evaluate(f, b);
  const IterationInfo& info = engine.tell(b);
  optex::apply_step(opt, x, s, b.grad(n - 1));
  EXPECT_TRUE(BitEqual(engine.iterate(), x));
  EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));
  EXPECT_TRUE(BitEqual(info.iterate, x));
  EXPECT_EQ(info.committed_point, n - 1);
  const std::size_t cap = engine.history().capacity();
  EXPECT_EQ(engine.history().size(), std::min(cap, h_before + static_cast<std::size_t>(n)));
}

TEST(EngineSemantics, ReferenceIterationsMatchAHandComputation) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(16, 21);
  constexpr int kN = 4;
  const Options o = Options::reference(kN);
  for (const Optimizer& opt : BaseOptimizers()) {
    SCOPED_TRACE(Name(opt));
    Engine engine(x0, opt, o);
    // Every pair told so far, oldest first (fewer than T0 = 50: no wrap).
    std::vector<std::vector<float>> hx;
    std::vector<std::vector<float>> hg;
    for (int t = 0; t < 5; ++t) {
      SCOPED_TRACE("iteration " + std::to_string(t));
      Batch& b = engine.ask();
      // The predictions: zero with an empty history, the GP mean afterwards.
      for (int i = 0; i + 1 < kN; ++i) {
        const auto mu = b.predicted_gradient(i);
        if (t == 0) {
          EXPECT_TRUE(std::all_of(mu.begin(), mu.end(), [](float v) { return v == 0.0f; }));
          continue;
        }
        const std::vector<double> ref = ReferenceGpMean(hx, hg, b.point(i), o.lengthscale, o.noise);
        double scale = 0.0;
        for (double v : ref) scale = std::max(scale, std::abs(v));
        ASSERT_GT(scale, 0.0);
        for (std::size_t c = 0; c < ref.size(); ++c) {
          ASSERT_NEAR(mu[c], ref[c], 1e-4 * scale) << "point " << i << " coordinate " << c;
        }
      }
      ASSERT_NO_FATAL_FAILURE(CheckOneIterationByHand(engine, f, opt));
      // The history holds exactly the N (point, true gradient) pairs, in order.
      for (int i = 0; i < kN; ++i) {
        const std::size_t slot = static_cast<std::size_t>(kN * t + i);
        EXPECT_TRUE(BitEqual(engine.history().point(slot), b.point(i)));
        EXPECT_TRUE(BitEqual(engine.history().gradient(slot), b.grad(i)));
        hx.emplace_back(b.point(i).begin(), b.point(i).end());
        hg.emplace_back(b.grad(i).begin(), b.grad(i).end());
      }
    }
    EXPECT_EQ(engine.history().size(), static_cast<std::size_t>(5 * kN));
  }
}

TEST(EngineSemantics, DefaultOptionsAlsoStepWithThePredictedGradients) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(16, 22);
  Options o;
  o.parallelism = 3;
  o.history = 8;                                // wraps during the run
  o.continue_from = optex::ContinueFrom::last;  // the rule the hand computation follows
  for (const Optimizer& opt : BaseOptimizers()) {
    SCOPED_TRACE(Name(opt));
    Engine engine(x0, opt, o);
    Iterate(engine, f);  // warm-up: the points are held at x0
    for (int t = 1; t < 8; ++t) {
      SCOPED_TRACE("iteration " + std::to_string(t));
      ASSERT_NO_FATAL_FAILURE(CheckOneIterationByHand(engine, f, opt));
    }
    EXPECT_EQ(engine.history().size(), 8u);
  }
}

// The reference warm-up: zero predictions that still advance the state. With
// Adam a zero gradient on zero moments does not move x, but the step counter
// grows: after the first tell it is N, and the commit uses bias correction N.
TEST(EngineSemantics, ReferenceWarmupPredictsZeroAndAdvancesAdamsStepCounter) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(12, 4);
  constexpr int kN = 5;
  const Adam adam{.lr = 0.05};
  Engine engine(x0, adam, Options::reference(kN));
  Batch& b = engine.ask();
  for (int i = 0; i + 1 < kN; ++i) {
    const auto mu = b.predicted_gradient(i);
    EXPECT_TRUE(std::all_of(mu.begin(), mu.end(), [](float v) { return v == 0.0f; }));
  }
  for (int i = 0; i < kN; ++i) EXPECT_TRUE(BitEqual(b.point(i), x0)) << i;
  Evaluate(f, b);
  const IterationInfo& info = engine.tell(b);
  EXPECT_EQ(engine.optimizer_state().step, kN);
  EXPECT_TRUE(std::isnan(info.cosine));  // nothing was predicted
  // By hand: N-1 zero-gradient Adam steps, then the true one.
  std::vector<float> x = x0;
  OptimizerState s = optex::init_state(adam, x.size());
  const std::vector<float> zero(x.size(), 0.0f);
  for (int i = 0; i + 1 < kN; ++i) optex::apply_step(adam, x, s, zero);
  optex::apply_step(adam, x, s, b.grad(kN - 1));
  EXPECT_TRUE(BitEqual(engine.iterate(), x));
  EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));
  // Smaller than vanilla's first step (the moments decayed N-1 times).
  std::vector<float> vanilla = x0;
  OptimizerState sv = optex::init_state(adam, x.size());
  optex::apply_step(adam, vanilla, sv, b.grad(kN - 1));
  EXPECT_FALSE(BitEqual(vanilla, x));
  EXPECT_EQ(engine.history().size(), static_cast<std::size_t>(kN));
}

// The default warm-up holds every point at x0 with the state untouched, so the
// first commit is exactly one plain step.
TEST(EngineSemantics, DefaultWarmupHoldsEveryPointAtTheStart) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(12, 8);
  constexpr int kN = 4;
  for (const Optimizer& opt : BaseOptimizers()) {
    SCOPED_TRACE(Name(opt));
    Options o;
    o.parallelism = kN;
    ASSERT_EQ(o.warmup, optex::Warmup::last_gradient);
    Engine engine(x0, opt, o);
    Batch& b = engine.ask();
    for (int i = 0; i < kN; ++i) EXPECT_TRUE(BitEqual(b.point(i), x0)) << i;
    Evaluate(f, b);
    engine.tell(b);
    EXPECT_EQ(engine.optimizer_state().step, 1);
    std::vector<float> x = x0;
    OptimizerState s = optex::init_state(opt, x.size());
    optex::apply_step(opt, x, s, b.grad(kN - 1));
    EXPECT_TRUE(BitEqual(engine.iterate(), x));
    EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));
    EXPECT_EQ(engine.history().size(), static_cast<std::size_t>(kN));
    // The next iteration moves: the proxy points differ from the iterate.
    Batch& b2 = engine.ask();
    EXPECT_FALSE(BitEqual(b2.point(1), b2.point(0)));
  }
}

// With one history pair (the rest of the first batch was non-finite), the
// default warm-up predicts that pair's gradient; the reference still predicts 0.
TEST(EngineSemantics, WarmupWithASingleHistoryPair) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(12, 41);
  constexpr int kN = 3;
  for (bool reference : {false, true}) {
    SCOPED_TRACE(reference ? "reference" : "default");
    const Optimizer opt = Adam{.lr = 0.05};
    Engine engine(x0, opt, reference ? Options::reference(kN) : WithN(kN));
    Batch& b = engine.ask();
    Evaluate(f, b);
    b.loss(1) = std::numeric_limits<double>::quiet_NaN();
    b.loss(2) = std::numeric_limits<double>::infinity();
    engine.tell(b);
    ASSERT_EQ(engine.history().size(), 1u);
    const std::vector<float> g0(engine.history().gradient(0).begin(),
                                engine.history().gradient(0).end());
    Batch& b2 = engine.ask();
    for (int i = 0; i + 1 < kN; ++i) {
      const auto mu = b2.predicted_gradient(i);
      if (reference) {
        EXPECT_TRUE(std::all_of(mu.begin(), mu.end(), [](float v) { return v == 0.0f; }));
      } else {
        EXPECT_TRUE(BitEqual(mu, g0)) << i;
      }
    }
    ASSERT_NO_FATAL_FAILURE(Evaluate(f, b2));
    const IterationInfo& info = engine.tell(b2);
    EXPECT_EQ(std::isnan(info.cosine), reference);
  }
}

// Proxy::last_gradient (the ablation) steps with the newest history gradient.
TEST(EngineSemantics, LastGradientProxyUsesTheNewestGradient) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(12, 43);
  Options o = WithN(4);
  o.proxy = optex::Proxy::last_gradient;
  const Optimizer opt = Sgd{.lr = 0.01, .momentum = 0.9};
  Engine engine(x0, opt, o);
  Iterate(engine, f);
  for (int t = 1; t < 4; ++t) {
    const auto newest = engine.history().gradient(engine.history().newest_slot());
    const std::vector<float> g(newest.begin(), newest.end());
    Batch& b = engine.ask();
    for (int i = 0; i + 1 < b.size(); ++i) EXPECT_TRUE(BitEqual(b.predicted_gradient(i), g));
    Evaluate(f, b);
    engine.tell(b);
    // The newest pair is the last point's.
    EXPECT_TRUE(
        BitEqual(engine.history().gradient(engine.history().newest_slot()), b.grad(b.size() - 1)));
  }
}

// A history shorter than the batch keeps the last pairs of each batch.
TEST(EngineSemantics, HistoryShorterThanTheBatchKeepsTheNewestPairs) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(12, 47);
  constexpr int kN = 4;
  for (bool reference : {false, true}) {
    SCOPED_TRACE(reference ? "reference" : "default");
    Options o = reference ? Options::reference(kN) : WithN(kN);
    o.history = 2;
    Engine engine(x0, Adam{.lr = 0.05}, o);
    for (int t = 0; t < 6; ++t) {
      Batch& b = engine.ask();
      Evaluate(f, b);
      engine.tell(b);
      ASSERT_EQ(engine.history().size(), 2u);
      const std::size_t newest = engine.history().newest_slot();
      EXPECT_TRUE(BitEqual(engine.history().point(newest), b.point(kN - 1)));
      EXPECT_TRUE(BitEqual(engine.history().point(1 - newest), b.point(kN - 2)));
      for (float v : engine.iterate()) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// ---- (c) IterationInfo --------------------------------------------------------

TEST(EngineInfo, CountsLossAndCosine) {
  const Sphere f;
  const std::vector<float> x0 = UniformStart(50, 29);
  for (int n : {1, 2, 5}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    Options o;
    o.parallelism = n;
    Engine engine(x0, Adam{.lr = 0.01}, o);
    for (int t = 0; t < 15; ++t) {
      Batch& b = engine.ask();
      Evaluate(f, b);
      std::vector<double> cosines;
      const IterationInfo& info = engine.tell(b);
      EXPECT_EQ(info.iteration, t + 1);
      EXPECT_EQ(engine.iteration(), t + 1);
      EXPECT_EQ(info.evaluations, static_cast<std::int64_t>(n) * (t + 1));
      EXPECT_EQ(info.loss, b.loss(n - 1));
      double best = b.loss(0);
      for (int i = 1; i < n; ++i) best = std::min(best, b.loss(i));
      EXPECT_EQ(info.best_loss, best);
      EXPECT_NEAR(info.grad_norm, 2.0 * std::sqrt(b.loss(n - 1)), 1e-4 * info.grad_norm);
      EXPECT_EQ(info.dropped, 0);
      EXPECT_EQ(info.lengthscale, engine.lengthscale());
      if (n == 1 || t == 0) {
        EXPECT_TRUE(std::isnan(info.cosine)) << "iteration " << t;
        continue;
      }
      ASSERT_FALSE(std::isnan(info.cosine)) << "iteration " << t;
      EXPECT_GE(info.cosine, -1.0);
      EXPECT_LE(info.cosine, 1.0);
      // The reported value is the mean cosine over the proxy points.
      double sum = 0.0;
      for (int i = 0; i + 1 < n; ++i) sum += Cosine(b.predicted_gradient(i), b.grad(i));
      // The library accumulates float blocks into double: agree to ~1e-7.
      EXPECT_NEAR(info.cosine, sum / (n - 1), 1e-6);
      // On a sphere the gradient field is smooth: after warm-up the GP predicts well.
      if (t >= 5) {
        EXPECT_GT(info.cosine, 0.95) << "iteration " << t;
      }
    }
    EXPECT_EQ(engine.last_info().iteration, 15);
  }
}

// ---- (d) ask() and seeds ---------------------------------------------------------

TEST(EngineAsk, AskingTwiceReturnsTheSameBatch) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(16, 31);
  Engine engine(x0, Adam{.lr = 0.02}, WithN(4));
  for (int t = 0; t < 3; ++t) {
    Batch& a = engine.ask();
    const std::vector<float> points(a.points().begin(), a.points().end());
    std::vector<std::uint64_t> seeds;
    for (int i = 0; i < a.size(); ++i) seeds.push_back(a.seed(i));
    const std::uint64_t rng = engine.rng_state();
    Batch& b = engine.ask();
    EXPECT_EQ(&a, &b);
    EXPECT_TRUE(BitEqual(b.points(), points));
    for (int i = 0; i < b.size(); ++i) EXPECT_EQ(b.seed(i), seeds[static_cast<std::size_t>(i)]);
    EXPECT_EQ(engine.rng_state(), rng);
    EXPECT_EQ(b.iteration(), t);
    Evaluate(f, b);
    engine.tell(b);
  }
}

TEST(EngineAsk, SeedsDifferAcrossPointsAndAreReproducible) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(8, 37);
  constexpr int kN = 6;
  auto seeds_of = [&](std::uint64_t seed) {
    Engine e(x0, Sgd{.lr = 0.01}, WithN(kN, seed));
    std::vector<std::uint64_t> out;
    for (int t = 0; t < 3; ++t) {
      Batch& b = e.ask();
      for (int i = 0; i < kN; ++i) out.push_back(b.seed(i));
      Evaluate(f, b);
      e.tell(b);
    }
    return out;
  };
  const std::vector<std::uint64_t> a = seeds_of(42);
  // Distinct across points and across iterations.
  EXPECT_EQ(std::set<std::uint64_t>(a.begin(), a.end()).size(), a.size());
  EXPECT_EQ(seeds_of(42), a);
  EXPECT_NE(seeds_of(43), a);
}

// The flat tell(gradients, losses) commits exactly like tell(batch), also when
// handed the batch's own buffers (what a binding with zero-copy views does).
TEST(EngineAsk, FlatTellMatchesBatchTell) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(16, 53);
  Engine a(x0, Adam{.lr = 0.02}, WithN(3));
  Engine b(x0, Adam{.lr = 0.02}, WithN(3));
  Engine c(x0, Adam{.lr = 0.02}, WithN(3));
  for (int t = 0; t < 6; ++t) {
    Iterate(a, f);
    Batch& bb = b.ask();
    Evaluate(f, bb);
    const std::vector<float> grads(bb.grads().begin(), bb.grads().end());
    const std::vector<double> losses(bb.losses().begin(), bb.losses().end());
    b.tell(grads, losses);
    Batch& bc = c.ask();
    Evaluate(f, bc);
    c.tell(bc.grads(), bc.losses());
    ASSERT_TRUE(BitEqual(a.iterate(), b.iterate())) << t;
    ASSERT_TRUE(BitEqual(a.iterate(), c.iterate())) << t;
    ASSERT_TRUE(StateBitEqual(a.optimizer_state(), c.optimizer_state())) << t;
  }
}

// ---- (e) the iteration-count check ----------------------------------

std::vector<float> RunOptEx(const std::vector<float>& x0, const Options& o, int iters) {
  const Sphere f;
  Engine engine(x0, Adam{.lr = 0.01}, o);
  for (int t = 0; t < iters; ++t) Iterate(engine, f);
  return {engine.iterate().begin(), engine.iterate().end()};
}

TEST(EngineIterationCount, OptExNeedsAThirdOfAdamsIterationsOnASphere) {
  const Sphere f;
  const std::vector<float> x0 = UniformStart(2000, 2024);
  const Adam adam{.lr = 0.01};
  const std::vector<float> x_ref = RunOptEx(x0, Options::reference(5), 40);
  const double optex_loss = f.Evaluate(x_ref);

  std::vector<float> x = x0;
  OptimizerState s = optex::init_state(adam, x.size());
  std::vector<float> g(x.size());
  for (int t = 0; t < 119; ++t) {
    f.EvaluateWithGradient(x, g);
    optex::apply_step(adam, x, s, g);
  }
  const double adam_loss = f.Evaluate(x);
  EXPECT_GT(adam_loss, optex_loss) << "plain Adam reached OptEx's 40-iteration loss in 119 "
                                      "iterations: the speed-up is below 3x";

  // The library default is no worse than the reference.
  Options defaults;
  defaults.parallelism = 5;
  const double default_loss = f.Evaluate(RunOptEx(x0, defaults, 40));
  EXPECT_LE(default_loss, optex_loss);
  RecordProperty("optex_reference_loss", std::to_string(optex_loss));
  RecordProperty("optex_default_loss", std::to_string(default_loss));
  RecordProperty("adam_119_loss", std::to_string(adam_loss));
}

}  // namespace
