// The verified mode (Options::mode == Mode::verified; DESIGN.md section 2):
// at tolerance 0 every committed iterate and optimizer state is the base
// optimizer's sequential one bit for bit, for every optimizer kind, in ranges,
// with hyperparameters changed between rounds; more than one step commits per
// round once the window's guesses converge; a positive tolerance stays near the
// sequential trajectory; checkpoints resume the window; bad options are refused.
// On every device (device_fixture.hpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/engine_snapshot.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/device_fixture.hpp"
#include "support/engine_equality.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Batch;
using optex::Engine;
using optex::IterationInfo;
using optex::Mode;
using optex::OptimizerRanges;
using optex::OptimizerState;
using optex::Options;
using optex::test::BitEqual;
using optex::test::EveryConfig;
using optex::test::OptimizerConfig;
using optex::test::Quartic;
using optex::test::StateBitEqual;
using optex::test::UniformStart;

class VerifiedMode : public optex::test::OnDevice {};
INSTANTIATE_TEST_SUITE_P(Devices, VerifiedMode, ::testing::ValuesIn(optex::test::kDevices),
                         optex::test::DeviceName);

// One round with f's gradients at the batch's points.
template <class F>
const IterationInfo& Round(Engine& e, const F& f) {
  Batch& b = e.ask();
  for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  return e.tell(b);
}

// The base optimizer's sequential run, stepped on demand.
struct Sequential {
  OptimizerRanges ranges;
  std::vector<float> x;
  OptimizerState state;
  std::vector<float> g;

  Sequential(const OptimizerRanges& r, std::vector<float> x0)
      : ranges(r.for_dimension(x0.size())),
        x(std::move(x0)),
        state(optex::init_state(ranges, x.size())),
        g(x.size()) {}
  template <class F>
  void Steps(const F& f, int count) {
    for (int k = 0; k < count; ++k) {
      f.EvaluateWithGradient(x, g);
      optex::apply_step(ranges, x, state, g);
    }
  }
};

TEST(VerifiedOptions, BadValuesAreRefusedNamingTheField) {
  EXPECT_THROW(Options::verified(8, -1e-3), std::invalid_argument);
  EXPECT_THROW(Options::verified(8, std::numeric_limits<double>::quiet_NaN()),
               std::invalid_argument);
  EXPECT_THROW(Options::verified(8, std::numeric_limits<double>::infinity()),
               std::invalid_argument);
  EXPECT_THROW(Options::verified(0, 0.0), std::invalid_argument);
  const auto refused = [](Options o, const std::string& field) {
    try {
      o.validate();
      ADD_FAILURE() << field << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::StartsWith(field + ":")) << e.what();
    }
  };
  Options o = Options::verified(4, 0.0);
  o.evaluations_per_point = 2;
  refused(o, "evaluations_per_point");
  o = Options::verified(4, 0.0);
  o.strategy = optex::Strategy::adaptive;
  refused(o, "strategy");
  o = Options::verified(4, 0.0);
  o.proxy = optex::Proxy::target;
  refused(o, "proxy");
  o = Options::verified(4, 0.0);
  o.trust_region = 2.0;
  refused(o, "trust_region");
  o = Options::verified(4, 0.0);
  o.max_posterior_variance = 0.5;
  refused(o, "max_posterior_variance");
  o = Options::verified(8, 0.0);
  o.history = 4;
  refused(o, "history");
  o = Options::verified(4, 0.0);
  o.mode = static_cast<Mode>(7);
  refused(o, "mode");
  // The factory keeps a history of at least N.
  EXPECT_EQ(Options::verified(64, 0.0).history, 64);
  EXPECT_EQ(Options::verified(8, 1e-4).tolerance, 1e-4);
}

// Tolerance 0: each round's committed iterate and state equal the sequential
// run's after as many steps as the rounds committed so far, bit for bit.
TEST_P(VerifiedMode, ToleranceZeroIsTheSequentialRunBitForBit) {
  const Quartic f;
  const std::size_t d = 600;
  const std::vector<float> x0 = UniformStart(d, 11);
  // Whichever way the proxy steps find their distances: the replay decides.
  for (const auto distances : {optex::ProxyDistances::direct, optex::ProxyDistances::coefficients})
    for (const OptimizerConfig& config : EveryConfig(d)) {
      SCOPED_TRACE(config.name);
      Options options = Options::verified(6, 0.0);
      options.proxy_distances = distances;
      Engine engine(x0, config.optimizer, On(options));
      Sequential reference(config.optimizer, x0);
      int steps = 0;
      for (int round = 0; round < 12; ++round) {
        const IterationInfo& info = Round(engine, f);
        ASSERT_GE(info.committed_steps, 1);
        ASSERT_LE(info.committed_steps, 6);
        EXPECT_EQ(info.disagreement, 0.0);
        reference.Steps(f, info.committed_steps);
        steps += info.committed_steps;
        ASSERT_TRUE(BitEqual(engine.iterate(), reference.x)) << "round " << round;
        ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), reference.state)) << "round " << round;
      }
      EXPECT_EQ(engine.optimizer_state().step, steps);
      EXPECT_EQ(engine.iteration(), 12);
      EXPECT_EQ(engine.evaluations(), 12 * 6);
    }
}

// New hyperparameters between rounds (a schedule) apply from the next committed
// step, in the verified run as in the sequential one.
TEST_P(VerifiedMode, ASchedulesStepsStayTheSequentialOnes) {
  const Quartic f;
  const std::size_t d = 300;
  const std::vector<float> x0 = UniformStart(d, 12);
  Engine engine(x0, optex::Adam{.lr = 1e-2}, On(Options::verified(5, 0.0)));
  Sequential reference(optex::Adam{.lr = 1e-2}, x0);
  for (int round = 0; round < 15; ++round) {
    const optex::Adam hyper{.lr = 1e-2 / (1.0 + 0.2 * round)};
    engine.set_optimizer(hyper);
    reference.ranges = OptimizerRanges(hyper).for_dimension(d);
    const IterationInfo& info = Round(engine, f);
    reference.Steps(f, info.committed_steps);
    ASSERT_TRUE(BitEqual(engine.iterate(), reference.x)) << "round " << round;
    ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), reference.state)) << "round " << round;
  }
}

// The window pays: on a smooth problem with a small step the guesses converge,
// and the rounds commit more than one step each, in the median at least 2 of 8.
TEST_P(VerifiedMode, ConvergedGuessesCommitSeveralStepsARound) {
  const Quartic f;
  const std::size_t d = 200;
  const std::vector<float> x0 = UniformStart(d, 13);
  Engine engine(x0, optex::Sgd{.lr = 2e-3, .momentum = 0.5}, On(Options::verified(8, 0.0)));
  std::vector<int> committed;
  for (int round = 0; round < 30; ++round) committed.push_back(Round(engine, f).committed_steps);
  std::vector<int> sorted = committed;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GE(sorted[sorted.size() / 2], 2) << ::testing::PrintToString(committed);
}

// A positive tolerance: each round reports its largest accepted disagreement
// (at most the tolerance), and the trajectory stays near the sequential one.
TEST_P(VerifiedMode, APositiveToleranceStaysNearTheSequentialRun) {
  const Quartic f;
  const std::size_t d = 200;
  const std::vector<float> x0 = UniformStart(d, 14);
  for (const double tolerance : {1e-6, 1e-4, 1e-2}) {
    SCOPED_TRACE(tolerance);
    Engine engine(x0, optex::Adam{.lr = 5e-3}, On(Options::verified(8, tolerance)));
    Sequential reference(optex::Adam{.lr = 5e-3}, x0);
    int steps = 0;
    for (int round = 0; round < 20; ++round) {
      const IterationInfo& info = Round(engine, f);
      EXPECT_LE(info.disagreement, tolerance);
      EXPECT_GE(info.disagreement, 0.0);
      steps += info.committed_steps;
    }
    reference.Steps(f, steps);
    double diff = 0.0, norm = 0.0;
    const auto x = engine.iterate();
    for (std::size_t i = 0; i < d; ++i) {
      diff += (x[i] - reference.x[i]) * (x[i] - reference.x[i]);
      norm += reference.x[i] * reference.x[i];
    }
    // Each accepted guess moves the replay by at most `tolerance` relative; over
    // the steps taken that compounds to at most about steps * tolerance here.
    EXPECT_LE(std::sqrt(diff / norm), 10.0 * steps * tolerance);
  }
}

// A checkpoint taken with a window carried resumes it: the restored engine's
// rounds are the uninterrupted engine's, bit for bit (iterate, state, steps).
TEST_P(VerifiedMode, ACheckpointResumesTheWindow) {
  const Quartic f;
  const std::size_t d = 200;
  const std::vector<float> x0 = UniformStart(d, 15);
  Engine engine(x0, optex::Adam{.lr = 2e-3}, On(Options::verified(6, 1e-6)));
  int carried_at_save = 0;
  for (int round = 0; round < 6; ++round) {
    const IterationInfo& info = Round(engine, f);
    carried_at_save = 6 - info.committed_steps;
  }
  EXPECT_EQ(engine.snapshot().window_carried, carried_at_save);
  const std::string path = Path("verified.ckpt");
  engine.save(path);
  Engine restored = Engine::load(path);
  EXPECT_EQ(restored.options().mode, Mode::verified);
  EXPECT_EQ(restored.options().tolerance, 1e-6);
  for (int round = 0; round < 6; ++round) {
    const int a = Round(engine, f).committed_steps;
    const int b = Round(restored, f).committed_steps;
    ASSERT_EQ(a, b) << "round " << round;
    ASSERT_TRUE(BitEqual(engine.iterate(), restored.iterate())) << "round " << round;
    ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), restored.optimizer_state()));
  }
}

// A snapshot whose window names steps the history cannot hold is refused.
TEST_P(VerifiedMode, AWindowBeyondTheHistoryIsRefused) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(50, 16);
  Engine engine(x0, optex::Adam{.lr = 1e-2}, On(Options::verified(4, 0.0)));
  Round(engine, f);
  optex::EngineSnapshot s = engine.snapshot();
  for (const auto& [carried, slot] : std::vector<std::pair<int, std::uint64_t>>{
           {4, 0}, {-1, 0}, {2, 4000}, {3, static_cast<std::uint64_t>(s.options.history)}}) {
    optex::EngineSnapshot bad = s;
    bad.window_carried = carried;
    bad.window_first_slot = slot;
    EXPECT_THROW(Engine::from_snapshot(bad), optex::InvalidSnapshot) << carried << " " << slot;
  }
  optex::EngineSnapshot approximate = s;
  approximate.options.mode = Mode::approximate;
  approximate.window_carried = 1;
  EXPECT_THROW(Engine::from_snapshot(approximate), optex::InvalidSnapshot);
}

// A tell the verified commit cannot take (point 0's gradient is not finite, so
// no step can) is refused and changes nothing; the next tell commits as a twin's.
TEST_P(VerifiedMode, ARefusedTellChangesNothing) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(100, 18);
  Engine engine(x0, optex::Adam{.lr = 2e-3}, On(Options::verified(5, 0.0)));
  Engine twin(x0, optex::Adam{.lr = 2e-3}, On(Options::verified(5, 0.0)));
  for (int round = 0; round < 4; ++round) {
    Round(engine, f);
    Round(twin, f);
  }
  Batch& b = engine.ask();
  for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  b.grad(0)[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(engine.tell(b), std::runtime_error);
  twin.ask();  // pending too
  EXPECT_TRUE(optex::test::SameEngine(engine, twin));
  // Row 0 fixed, the same batch commits as the twin's round does.
  f.EvaluateWithGradient(b.point(0), b.grad(0));
  const int steps = engine.tell(b).committed_steps;
  EXPECT_EQ(steps, Round(twin, f).committed_steps);
  EXPECT_TRUE(BitEqual(engine.iterate(), twin.iterate()));
}

// The same run on 1 and 2 threads: the same rounds bit for bit.
TEST_P(VerifiedMode, ThreadCountsGiveTheSameRounds) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(5000, 17);
  Options one = On(Options::verified(6, 1e-6));
  one.threads = 1;
  Options two = one;
  two.threads = 2;
  Engine a(x0, optex::Adam{.lr = 2e-3}, one);
  Engine b(x0, optex::Adam{.lr = 2e-3}, two);
  for (int round = 0; round < 8; ++round) {
    ASSERT_EQ(Round(a, f).committed_steps, Round(b, f).committed_steps);
    ASSERT_TRUE(BitEqual(a.iterate(), b.iterate()));
  }
}

}  // namespace
