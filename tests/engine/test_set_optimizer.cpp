// Engine::set_optimizer: hyperparameters that change between iterations (a
// learning-rate schedule) while the optimizer state carries on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
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
  expect_refused(Sgd{.lr = -1.0}, "lr: must be finite and > 0, got -1", false);
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
                 "range 0: lr: must be finite and > 0, got -2");
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
