// Engine::set_optimizer: hyperparameters that change between iterations (a
// learning-rate schedule) while the optimizer state carries on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distributed/run_on_ranks.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/distributed/in_process_communicator.hpp"
#include "optex/engine/engine.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/problems/rosenbrock.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace {

using namespace optex;
using namespace optex::test;

// A schedule that halves the learning rate every third iteration.
double ScheduledLr(double base, int t) { return base / static_cast<double>(1 << (t / 3)); }

Optimizer WithLr(Optimizer opt, double lr) {
  std::visit([lr](auto& o) { o.lr = lr; }, opt);
  return opt;
}

std::vector<Optimizer> Optimizers() {
  return {Sgd{.lr = 1e-3}, Sgd{.lr = 1e-3, .momentum = 0.9, .nesterov = true}, Adam{.lr = 1e-2},
          adamw(1e-2, 0.1)};
}

// Runs `iterations` iterations, calling set_optimizer with the schedule before each.
void RunScheduled(Engine& engine, const Optimizer& base, int first, int iterations) {
  const problems::Rosenbrock f;
  const double lr0 = std::visit([](const auto& o) { return o.lr; }, base);
  for (int t = first; t < first + iterations; ++t) {
    engine.set_optimizer(WithLr(base, ScheduledLr(lr0, t)));
    Batch& b = engine.ask();
    for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
    engine.tell(b);
  }
}

// With N = 1 a scheduled engine is the plain optimizer under the same schedule, bit for bit.
TEST(SetOptimizer, ScheduleWithParallelismOneIsThePlainScheduledOptimizer) {
  const problems::Rosenbrock f;
  const std::vector<float> x0 = UniformStart(16, 3, -0.5, 0.5);
  for (const Optimizer& opt : Optimizers()) {
    SCOPED_TRACE(std::string(optimizer_name(opt)));
    Engine engine(x0, opt, WithN(1));
    RunScheduled(engine, opt, 0, 12);

    std::vector<float> x = x0;
    std::vector<float> g(x.size());
    OptimizerState s = init_state(opt, x.size());
    const double lr0 = std::visit([](const auto& o) { return o.lr; }, opt);
    for (int t = 0; t < 12; ++t) {
      f.EvaluateWithGradient(x, g);
      apply_step(WithLr(opt, ScheduledLr(lr0, t)), x, s, g);
    }
    EXPECT_TRUE(BitEqual(engine.iterate(), x));
    EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));
    EXPECT_EQ(engine.optimizer(), WithLr(opt, ScheduledLr(lr0, 11)));
  }
}

// The new values take effect at the next ask(): the proxy steps use them. A
// schedule that changes the learning rate changes the trajectory, and setting
// the same values again changes nothing.
TEST(SetOptimizer, NewValuesDriveTheNextProxySteps) {
  const std::vector<float> x0 = UniformStart(16, 4, -0.5, 0.5);
  const Adam adam{.lr = 1e-2};
  Engine fixed(x0, adam, WithN(4, 9));
  Engine same(x0, adam, WithN(4, 9));
  Engine halved(x0, adam, WithN(4, 9));
  const problems::Rosenbrock f;
  for (int t = 0; t < 6; ++t) {
    same.set_optimizer(adam);
    if (t == 3) halved.set_optimizer(Adam{.lr = 5e-3});
    for (Engine* e : {&fixed, &same, &halved}) {
      Batch& b = e->ask();
      for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
      e->tell(b);
    }
    if (t < 3) {
      ASSERT_TRUE(SameEngine(halved, fixed)) << "iteration " << t;
    }
  }
  EXPECT_TRUE(SameEngine(same, fixed));
  EXPECT_FALSE(SameBits(halved.iterate(), fixed.iterate()));
  EXPECT_EQ(halved.optimizer_state().step, fixed.optimizer_state().step);
}

// A checkpoint stores the hyperparameters in force, and a resumed run keeps
// following the schedule identically.
TEST(SetOptimizer, CheckpointKeepsTheScheduledValues) {
  const std::vector<float> x0 = UniformStart(16, 5, -0.5, 0.5);
  const Optimizer opt = Sgd{.lr = 1e-3, .momentum = 0.9};
  Engine whole(x0, opt, WithN(3, 2));
  RunScheduled(whole, opt, 0, 10);

  Engine first(x0, opt, WithN(3, 2));
  RunScheduled(first, opt, 0, 5);
  const std::string path = ::testing::TempDir() + "set_optimizer.optex";
  first.save(path);
  Engine resumed = Engine::load(path);
  std::remove(path.c_str());
  EXPECT_EQ(resumed.optimizer(), first.optimizer());
  RunScheduled(resumed, opt, 5, 5);
  EXPECT_TRUE(SameEngine(resumed, whole));
}

// Every refusal names what is wrong and leaves the engine as it was.
TEST(SetOptimizer, RefusalsLeaveTheEngineUnchanged) {
  const std::vector<float> x0 = UniformStart(8, 6);
  Engine engine(x0, Sgd{.lr = 1e-2}, WithN(2));
  Engine twin(x0, Sgd{.lr = 1e-2}, WithN(2));
  const auto expect_refused = [&](const Optimizer& opt, const std::string& fragment, bool runtime) {
    try {
      engine.set_optimizer(opt);
      ADD_FAILURE() << "accepted; expected a message with: " << fragment;
    } catch (const std::invalid_argument& e) {
      EXPECT_FALSE(runtime) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(runtime) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine.optimizer(), Optimizer(Sgd{.lr = 1e-2}));
    EXPECT_TRUE(SameEngine(engine, twin));
  };
  expect_refused(Sgd{.lr = -1.0}, "lr: must be finite and >= 0, got -1", false);
  expect_refused(Sgd{.lr = std::numeric_limits<double>::quiet_NaN()},
                 "lr: must be finite and >= 0, got nan", false);
  expect_refused(Sgd{.lr = std::numeric_limits<double>::infinity()},
                 "lr: must be finite and >= 0, got inf", false);
  expect_refused(Sgd{.lr = 1e39}, "lr: must be at most 3.40282e+38", false);
  expect_refused(Sgd{.lr = 1e-2, .weight_decay = -0.5},
                 "weight_decay: must be finite and >= 0, got -0.5", false);
  expect_refused(Adam{.lr = 1e-2}, "optimizer: adam cannot replace sgd", false);
  expect_refused(Sgd{.lr = 1e-2, .momentum = 0.9}, "momentum: 0.9 cannot replace 0", false);
  Engine adam(x0, Adam{}, WithN(2));
  EXPECT_THROW(
      {
        try {
          adam.set_optimizer(adamw());
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("decoupled_weight_decay: AdamW cannot replace Adam"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_EQ(adam.optimizer(), Optimizer(Adam{}));

  const problems::Rosenbrock f;
  for (Engine* e : {&engine, &twin}) {
    Batch& b = e->ask();
    for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  }
  expect_refused(Sgd{.lr = 5e-3}, "set_optimizer: between ask() and tell()", true);
}

// ---- a learning rate of exactly 0 ---------------------------------------------------

// torch.optim's schedules that reach lr 0 exactly: a linear warmup from 0
// (LambdaLR(opt, lambda s: min(1, s / 5))), then CosineAnnealingLR(T_max = 6,
// eta_min = 0) down to 0, where the run stays.
double WarmupThenCosine(double base, int t) {
  constexpr int kWarmup = 5;
  constexpr int kTMax = 6;
  if (t < kWarmup) return base * static_cast<double>(t) / kWarmup;
  const int k = t - kWarmup;
  if (k >= kTMax) return 0.0;
  return base * (1.0 + std::cos(std::numbers::pi * k / kTMax)) / 2.0;
}

std::vector<Optimizer> EveryKind() {
  return {Sgd{.lr = 1e-3},
          Sgd{.lr = 1e-3, .momentum = 0.9, .nesterov = true, .weight_decay = 0.1},
          Adam{.lr = 1e-2},
          adamw(1e-2, 0.1),
          RmsProp{.lr = 1e-3, .weight_decay = 0.1, .momentum = 0.5, .centered = true},
          Lion{.lr = 1e-3, .weight_decay = 0.1}};
}

// With N = 1 an engine under a schedule that starts and ends at lr 0 is the plain optimizer
// under it, bit for bit: at lr 0 the iterate stays, the state advances (torch.optim's step).
TEST(LearningRateZero, ScheduleWithParallelismOneIsThePlainScheduledOptimizer) {
  const problems::Rosenbrock f;
  const std::vector<float> x0 = UniformStart(16, 3, -0.5, 0.5);
  ASSERT_EQ(WarmupThenCosine(1.0, 0), 0.0);
  ASSERT_EQ(WarmupThenCosine(1.0, 11), 0.0);
  for (const Optimizer& opt : EveryKind()) {
    SCOPED_TRACE(std::string(optimizer_name(opt)));
    const double lr0 = std::visit([](const auto& o) { return o.lr; }, opt);
    Engine engine(x0, WithLr(opt, 0.0), WithN(1));
    std::vector<float> x = x0;
    std::vector<float> g(x.size());
    OptimizerState s = init_state(opt, x.size());
    for (int t = 0; t < 14; ++t) {
      const Optimizer scheduled = WithLr(opt, WarmupThenCosine(lr0, t));
      engine.set_optimizer(scheduled);
      Batch& b = engine.ask();
      b.loss(0) = f.EvaluateWithGradient(b.point(0), b.grad(0));
      engine.tell(b);
      f.EvaluateWithGradient(x, g);
      const std::vector<float> before = x;
      apply_step(scheduled, x, s, g);
      if (WarmupThenCosine(lr0, t) == 0.0) {
        ASSERT_TRUE(BitEqual(x, before)) << "step " << t;
      }
      ASSERT_TRUE(BitEqual(engine.iterate(), x)) << "step " << t;
      ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), s)) << "step " << t;
    }
    EXPECT_FALSE(SameBits(engine.iterate(), x0));  // the steps between moved it
    EXPECT_EQ(engine.optimizer_state().step, 14);
  }
}

// In the verified mode at tolerance 0, a round at lr 0 commits all N steps (every guess is
// the iterate, and so is every replayed step): N torch.optim steps at lr 0 with the true
// gradients there. The iterate stays bit for bit; the state is N * rounds sequential steps.
TEST(LearningRateZero, VerifiedRoundsAreNSequentialStepsThatKeepTheIterate) {
  const problems::Rosenbrock f;
  const std::vector<float> x0 = UniformStart(16, 4, -0.5, 0.5);
  constexpr int kN = 4;
  for (const double tolerance : {0.0, 1e-4}) {  // above 0 the guesses take the GP's correction
    for (const Optimizer& base : EveryKind()) {
      SCOPED_TRACE(std::string(optimizer_name(base)) + " tolerance " + std::to_string(tolerance));
      const Optimizer opt = WithLr(base, 0.0);
      Engine engine(x0, opt, Options::verified(kN, tolerance));
      std::vector<float> x = x0;
      std::vector<float> g(x.size());
      OptimizerState s = init_state(opt, x.size());
      for (int round = 0; round < 3; ++round) {
        Batch& b = engine.ask();
        for (int i = 0; i < b.size(); ++i) {
          ASSERT_TRUE(BitEqual(b.point(i), x0)) << "round " << round << " point " << i;
          b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
        }
        EXPECT_EQ(engine.tell(b).committed_steps, kN);
        for (int k = 0; k < kN; ++k) {
          f.EvaluateWithGradient(x, g);
          apply_step(opt, x, s, g);
        }
        ASSERT_TRUE(BitEqual(engine.iterate(), x0)) << "round " << round;
        ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), s)) << "round " << round;
      }
    }
  }
}

// OptEx rounds at lr 0 (N points, the GP's proxy steps) keep the iterate bit for bit while
// the state advances, and feed the history pairs at that one point; a warmup that follows
// then never throws, stays finite and is deterministic, under the options whose rules read
// the history's distances or the last step (noise 0: the jitter; lengthscale selection with
// a zero median distance; the trust region with a zero last step; the adaptive split; the
// reference warm-up), on noise-free and noisy gradients.
TEST(LearningRateZero, RoundsAtZeroThenAWarmupRunAndAreDeterministic) {
  std::vector<std::pair<const char*, Options>> variants;
  const auto add = [&](const char* name, Options o) { variants.emplace_back(name, o); };
  add("defaults", WithN(4, 1));
  Options noiseless = WithN(4, 1);
  noiseless.noise = 0.0;
  add("noise_0", noiseless);
  Options likelihood = WithN(4, 1);
  likelihood.lengthscale_selection = LengthscaleSelection::marginal_likelihood;
  likelihood.noise = 0.0;
  add("marginal_likelihood_noise_0", likelihood);
  Options trust = WithN(4, 1);
  trust.trust_region = 2.0;
  trust.max_posterior_variance = 0.5;
  trust.continue_from = ContinueFrom::best_loss;
  add("trust_region_and_variance", trust);
  add("adaptive", Options::adaptive(4));
  add("reference", Options::reference(4));
  Options small = WithN(6, 1);
  small.history = 6;  // the ring holds nothing but pairs at the one point
  add("history_6", small);

  const std::vector<float> x0 = UniformStart(12, 7, -0.5, 0.5);
  const problems::Rosenbrock rosenbrock;
  const NoisyQuadratic noisy;
  for (const bool noise : {false, true}) {
    for (const auto& [name, options] : variants) {
      SCOPED_TRACE(std::string(name) + (noise ? " noisy" : " noise-free"));
      Engine engine(x0, Adam{.lr = 0.0}, options);
      Engine twin(x0, Adam{.lr = 0.0}, options);
      std::int64_t last_step = 0;
      std::vector<float> moved;
      // 8 rounds at 0, a warmup, then 8 rounds at 0 again (a cosine schedule's end): the
      // history then holds distinct points and, more and more, pairs at one point.
      for (int t = 0; t < 24; ++t) {
        const double lr = t < 8 || t >= 16 ? 0.0 : 2e-2 * std::min(1.0, (t - 7) / 5.0);
        const std::vector<float> held(engine.iterate().begin(), engine.iterate().end());
        for (Engine* e : {&engine, &twin}) {
          e->set_optimizer(Adam{.lr = lr});
          Batch& b = e->ask();
          for (int i = 0; i < b.size(); ++i) {
            b.loss(i) = noise ? noisy.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i))
                              : rosenbrock.EvaluateWithGradient(b.point(i), b.grad(i));
          }
          ASSERT_NO_THROW(e->tell(b)) << "round " << t;
        }
        if (lr == 0.0) {
          ASSERT_TRUE(BitEqual(engine.iterate(), held)) << "round " << t;
          if (t < 8) {
            const GradientHistory& h = engine.history();
            for (std::size_t j = 0; j < h.size(); ++j) ASSERT_TRUE(BitEqual(h.point(j), x0));
          }
          EXPECT_GT(engine.optimizer_state().step, last_step) << "round " << t;
        }
        last_step = engine.optimizer_state().step;
        if (t == 15) moved.assign(engine.iterate().begin(), engine.iterate().end());
        for (float v : engine.iterate()) ASSERT_TRUE(std::isfinite(v)) << "round " << t;
        ASSERT_TRUE(SameEngine(engine, twin)) << "round " << t;
      }
      EXPECT_FALSE(SameBits(moved, x0));
      EXPECT_TRUE(BitEqual(engine.iterate(), moved));
    }
  }
}

// ---- per-range hyperparameters ------------------------------------------------

// Two ranges of SGD (one without momentum) and of AdamW (one without decay), scheduled per
// range: with N = 1, the plain ranged steps under the same schedule, bit for bit.
TEST(SetOptimizer, PerRangeScheduleIsThePlainRangedSchedule) {
  const problems::Rosenbrock f;
  const std::vector<float> x0 = UniformStart(16, 5, -0.5, 0.5);
  const auto ranges_at = [](bool sgd, int t) -> OptimizerRanges {
    if (sgd) {
      return {{6, Sgd{.lr = ScheduledLr(1e-3, t)}},
              {10, Sgd{.lr = ScheduledLr(2e-3, t + 1), .momentum = 0.9}}};
    }
    return {{6, adamw(ScheduledLr(1e-2, t), 0.1)}, {10, adamw(ScheduledLr(3e-2, t + 2), 0.0)}};
  };
  for (const bool sgd : {true, false}) {
    SCOPED_TRACE(sgd ? "sgd" : "adamw");
    Engine engine(x0, ranges_at(sgd, 0), WithN(1));
    std::vector<float> x = x0;
    OptimizerState s = init_state(ranges_at(sgd, 0), x.size());
    std::vector<float> g(x.size());
    for (int t = 0; t < 12; ++t) {
      engine.set_optimizer(ranges_at(sgd, t));
      Batch& b = engine.ask();
      b.loss(0) = f.EvaluateWithGradient(b.point(0), b.grad(0));
      engine.tell(b);
      f.EvaluateWithGradient(x, g);
      apply_step(ranges_at(sgd, t).for_dimension(x.size()), x, s, g);
      ASSERT_TRUE(BitEqual(engine.iterate(), x)) << "iteration " << t;
      ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), s)) << "iteration " << t;
    }
    EXPECT_EQ(engine.optimizer_ranges(), ranges_at(sgd, 11).for_dimension(16));
  }
}

// What per-range replacements refuse: another number of ranges, other sizes, a single
// optimizer for several ranges, and a range that changes kind or layout (named by its index).
TEST(SetOptimizer, PerRangeRefusalsLeaveTheEngineUnchanged) {
  const std::vector<float> x0 = UniformStart(8, 6);
  const OptimizerRanges ranges{{3, Sgd{.lr = 1e-2}}, {5, Sgd{.lr = 1e-3, .momentum = 0.5}}};
  Engine engine(x0, ranges, WithN(2));
  Engine twin(x0, ranges, WithN(2));
  const auto expect_refused = [&](const OptimizerRanges& next, const std::string& fragment) {
    try {
      engine.set_optimizer(next);
      ADD_FAILURE() << "accepted; expected a message with: " << fragment;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine.optimizer_ranges(), ranges.for_dimension(8));
    EXPECT_TRUE(SameEngine(engine, twin));
  };
  expect_refused(Sgd{.lr = 1e-2}, "1 cannot replace 2");
  expect_refused(OptimizerRanges{{4, Sgd{}}, {4, Sgd{.momentum = 0.5}}}, "range 0 has size 4");
  expect_refused(OptimizerRanges{{3, Sgd{}}, {2, Sgd{.momentum = 0.5}}, {3, Sgd{}}},
                 "3 cannot replace 2");
  expect_refused(OptimizerRanges{{3, Sgd{}}, {6, Sgd{.momentum = 0.5}}}, "add up to 9");
  expect_refused(OptimizerRanges{{3, Sgd{}}, {5, Sgd{}}},
                 "range 1: momentum: 0 cannot replace 0.5");
  expect_refused(OptimizerRanges{{3, Sgd{.lr = -2.0}}, {5, Sgd{.momentum = 0.5}}},
                 "range 0: lr: must be finite and >= 0, got -2");
  expect_refused(OptimizerRanges{{3, Adam{}}, {5, Adam{}}},
                 "range 0: optimizer: adam cannot replace sgd");
  // Accepted: new values, same sizes and layouts.
  engine.set_optimizer(
      OptimizerRanges{{3, Sgd{.lr = 5e-3}}, {5, Sgd{.lr = 1e-4, .momentum = 0.8}}});
  EXPECT_EQ(std::get<Sgd>(engine.optimizer_ranges()[1].optimizer).momentum, 0.8);
}

// Step offsets: a new engine's state is at step 0, so its ranges must join there; later,
// set_optimizer moves an offset anywhere up to the state's step (a range that starts over),
// and refuses one beyond it, naming the range, with the engine unchanged.
TEST(SetOptimizer, StepOffsetsMoveWithinTheStateStep) {
  const std::vector<float> x0 = UniformStart(8, 6);
  const OptimizerRanges ranges{{3, Adam{.lr = 1e-2}}, {5, Adam{.lr = 1e-3}}};
  try {
    Engine refused(x0, OptimizerRanges{{3, Adam{}}, {5, Adam{}, 1}}, WithN(2));
    ADD_FAILURE() << "a new engine accepted a range that joins at step 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "range 1 has step_offset 1, beyond the optimizer state's step 0"));
  }
  Engine engine(x0, ranges, WithN(2));
  Engine twin(x0, ranges, WithN(2));
  const problems::Rosenbrock f;
  for (Engine* e : {&engine, &twin}) {
    for (int t = 0; t < 3; ++t) {
      Batch& b = e->ask();
      for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
      e->tell(b);
    }
  }
  const std::int64_t step = engine.optimizer_state().step;
  ASSERT_GT(step, 2);
  try {
    engine.set_optimizer(OptimizerRanges{{3, Adam{.lr = 1e-2}}, {5, Adam{.lr = 1e-3}, step + 1}});
    ADD_FAILURE() << "accepted a step offset beyond the state's step";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "range 1 has step_offset " + std::to_string(step + 1) +
                              ", beyond the optimizer state's step " + std::to_string(step)));
  }
  EXPECT_TRUE(SameEngine(engine, twin));
  const OptimizerRanges joined{{3, Adam{.lr = 1e-2}, 1}, {5, Adam{.lr = 1e-3}, step}};
  engine.set_optimizer(joined);
  EXPECT_EQ(engine.optimizer_ranges(), joined.for_dimension(8));
  // The offsets are in force: the next commit differs from the twin's.
  for (Engine* e : {&engine, &twin}) {
    Batch& b = e->ask();
    for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
    e->tell(b);
  }
  EXPECT_FALSE(SameBits(engine.iterate(), twin.iterate()));
  EXPECT_EQ(engine.optimizer_state().step, twin.optimizer_state().step);
}

// ---- the distributed engine ---------------------------------------------------

// A schedule applied collectively keeps every rank on the single-process trajectory.
TEST(SetOptimizerDistributed, ScheduleMatchesTheSingleProcessEngine) {
  RunOnRanks(3, [](Communicator& comm) {
    const std::vector<float> x0 = UniformStart(12, 8, -0.5, 0.5);
    const Optimizer opt = Adam{.lr = 1e-2};
    DistributedOptions dist;
    dist.hash_interval = 1;
    DistributedEngine engine(x0, opt, WithN(5, 1), comm, dist);
    Engine reference(x0, opt, WithN(5, 1));
    const problems::Rosenbrock f;
    for (int t = 0; t < 6; ++t) {
      engine.set_optimizer(Adam{.lr = ScheduledLr(1e-2, t)});
      Batch& b = engine.ask();
      for (int i : engine.my_points()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
      engine.tell(b);
    }
    RunScheduled(reference, opt, 0, 6);
    EXPECT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();
  });
}

// Ranges agree across ranks like single optimizers: the same schedule per range keeps every
// rank on the single-process trajectory, and a rank with other sizes is named.
TEST(SetOptimizerDistributed, PerRangeScheduleMatchesTheSingleProcessEngine) {
  RunOnRanks(2, [](Communicator& comm) {
    const std::vector<float> x0 = UniformStart(12, 8, -0.5, 0.5);
    const auto ranges_at = [](int t) {
      return OptimizerRanges{{5, Adam{.lr = ScheduledLr(1e-2, t)}},
                             {7, Adam{.lr = ScheduledLr(3e-2, t), .weight_decay = 0.1}}};
    };
    DistributedOptions dist;
    dist.hash_interval = 1;
    DistributedEngine engine(x0, ranges_at(0), WithN(4, 1), comm, dist);
    Engine reference(x0, ranges_at(0), WithN(4, 1));
    const problems::Rosenbrock f;
    for (int t = 0; t < 5; ++t) {
      engine.set_optimizer(ranges_at(t));
      reference.set_optimizer(ranges_at(t));
      Batch& b = engine.ask();
      for (int i : engine.my_points()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
      engine.tell(b);
      Batch& r = reference.ask();
      for (int i = 0; i < r.size(); ++i) r.loss(i) = f.EvaluateWithGradient(r.point(i), r.grad(i));
      reference.tell(r);
    }
    EXPECT_TRUE(SameEngine(engine.engine(), reference)) << "rank " << comm.rank();
    try {
      engine.set_optimizer(comm.rank() == 1 ? OptimizerRanges{{6, Adam{}}, {6, Adam{}}}
                                            : ranges_at(0));
      ADD_FAILURE() << "rank " << comm.rank() << " accepted ranges of other sizes";
    } catch (const std::invalid_argument& e) {
      // The refusing rank says why; the others name it.
      const char* expected = comm.rank() == 1 ? "range 0 has size 6" : "rank 1";
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine.engine().optimizer_ranges(), ranges_at(4).for_dimension(12));
  });
}

// Ranks that disagree all throw, naming the odd rank, and keep the old values.
TEST(SetOptimizerDistributed, DisagreeingRanksAllThrowAndKeepTheOldValues) {
  RunOnRanks(3, [](Communicator& comm) {
    const Optimizer opt = Adam{.lr = 1e-2};
    DistributedEngine engine(UniformStart(12, 8), opt, WithN(4), comm);
    const double lr = comm.rank() == 2 ? 1e-3 : 5e-3;
    try {
      engine.set_optimizer(Adam{.lr = lr});
      ADD_FAILURE() << "rank " << comm.rank() << " accepted disagreeing hyperparameters";
    } catch (const std::invalid_argument& e) {
      // The field that differs, with both values.
      EXPECT_THAT(e.what(),
                  ::testing::HasSubstr(
                      "ranks disagree on optimizer.lr: rank 0 has 0.005, rank 2 has 0.001"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("rank 2 differs from rank 0"));
    }
    EXPECT_EQ(engine.engine().optimizer(), opt);
    // A refusal on one rank (a bad value there) reaches every rank too.
    try {
      engine.set_optimizer(Adam{.lr = comm.rank() == 1 ? -1.0 : 5e-3});
      ADD_FAILURE() << "rank " << comm.rank() << " accepted a refused value";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine.engine().optimizer(), opt);
  });
}

}  // namespace
