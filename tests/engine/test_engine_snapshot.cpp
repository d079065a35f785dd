// EngineSnapshot (optex/engine/engine_snapshot.hpp): an engine built from a snapshot continues
// bit for bit, a snapshot without its history resumes exactly as an empty history does,
// validate() refuses every field the way a checkpoint file is refused, and a range that
// joins late (its step offset) is a fresh optimizer started that many steps later.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/engine.hpp"
#include "optex/engine/engine_snapshot.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace {

using namespace optex;
using namespace optex::test;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A non-quadratic objective with coupled coordinates and, through the point's seed, a
// little noise: several evaluations of one point differ (the adaptive strategy measures it).
double Objective(std::span<const float> x, std::span<float> g, std::uint64_t seed) {
  SplitMix64 rng(seed);
  const std::size_t d = x.size();
  double f = 0.0;
  for (std::size_t i = 0; i < d; ++i) {
    const double xi = x[i];
    const double next = i + 1 < d ? static_cast<double>(x[i + 1]) : 0.0;
    const double prev = i > 0 ? static_cast<double>(x[i - 1]) : 0.0;
    f += (1.0 + static_cast<double>(i % 3)) * xi * xi + 0.05 * xi * xi * xi * xi + 0.3 * xi * next;
    g[i] = static_cast<float>(2.0 * (1.0 + static_cast<double>(i % 3)) * xi + 0.2 * xi * xi * xi +
                              0.3 * (prev + next) + 0.01 * rng.normal());
  }
  return f;
}

void Step(Engine& e) {
  Batch& b = e.ask();
  for (int i = 0; i < b.size(); ++i) b.loss(i) = Objective(b.point(i), b.grad(i), b.seed(i));
  e.tell(b);
}

template <class T>
bool SameValues(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Every field, bit for bit (NaN included).
::testing::AssertionResult SameSnapshot(const EngineSnapshot& a, const EngineSnapshot& b) {
  const auto fail = [](const char* field) { return ::testing::AssertionFailure() << field; };
  if (!(a.options.parallelism == b.options.parallelism && a.options.history == b.options.history &&
        a.options.seed == b.options.seed && a.options.strategy == b.options.strategy &&
        a.options.device == b.options.device &&
        a.options.proxy_distances == b.options.proxy_distances)) {
    return fail("options");
  }
  if (!(a.optimizer == b.optimizer)) return fail("optimizer");
  if (!SameValues(a.iterate, b.iterate)) return fail("iterate");
  if (!StateBitEqual(a.state, b.state)) return fail("state");
  if (!SameBits(a.lengthscale, b.lengthscale)) return fail("lengthscale");
  if (a.rng != b.rng || a.iteration != b.iteration || a.evaluations != b.evaluations) {
    return fail("rng or counters");
  }
  if (a.history_size != b.history_size || a.history_next != b.history_next) return fail("ring");
  if (!SameValues(a.points, b.points) || !SameValues(a.gradients, b.gradients)) {
    return fail("history points or gradients");
  }
  if (!SameValues(a.squared_distances, b.squared_distances) ||
      !SameValues(a.squared_norms, b.squared_norms) ||
      !SameValues(a.gradient_gram, b.gradient_gram)) {
    return fail("history statistics");
  }
  if (a.split_evaluations != b.split_evaluations || !SameBits(a.split_noise, b.split_noise) ||
      a.split_rounds_since_measured != b.split_rounds_since_measured ||
      !SameBits(a.last_step_norm, b.last_step_norm)) {
    return fail("round state");
  }
  return ::testing::AssertionSuccess();
}

struct RunCase {
  const char* name;
  OptimizerRanges optimizer;
  Options options;
  std::size_t d;
};

Options With(int n, int history, std::uint64_t seed) {
  Options o = WithN(n, seed);
  o.history = history;
  return o;
}

Options Adaptive() {
  Options o = Options::adaptive(4);
  o.history = 8;
  o.seed = 3;
  o.trust_region = 4.0;
  return o;
}

Options CoefficientDistances() {
  Options o = With(3, 5, 6);
  o.proxy_distances = ProxyDistances::coefficients;
  return o;
}

Options TwoEvaluationsPerPoint() {
  Options o = With(4, 6, 5);
  o.evaluations_per_point = 2;
  return o;
}

std::vector<RunCase> Runs() {
  return {
      {"adam", Adam{.lr = 0.05}, With(4, 8, 1), 7},
      {"sgd_momentum", Sgd{.lr = 0.02, .momentum = 0.9, .nesterov = true}, With(3, 5, 2), 6},
      {"rmsprop_centered", RmsProp{.lr = 0.01, .momentum = 0.5, .centered = true}, With(3, 4, 4),
       5},
      {"adaptive_adamw", adamw(0.05, 0.1), Adaptive(), 6},
      {"sgd_coefficient_distances", Sgd{.lr = 0.02, .momentum = 0.9, .weight_decay = 0.01},
       CoefficientDistances(), 6},
      {"two_evaluations_per_point", Sgd{.lr = 0.05, .momentum = 0.5}, TwoEvaluationsPerPoint(), 6},
      {"ranges",
       OptimizerRanges{{2, Adam{.lr = 0.05}}, {3, adamw(0.02, 0.1)}, {3, Adam{.lr = 0.1}}},
       With(4, 6, 7), 8},
  };
}

class SnapshotRoundTrip : public ::testing::TestWithParam<RunCase> {};

// Taken between rounds and built again, the engine is the same engine: the same state now,
// the same points, seeds and commits from here on. Its own snapshot is the one it was built
// from, and the checkpoint file is the same snapshot framed.
TEST_P(SnapshotRoundTrip, ContinuesBitForBit) {
  const RunCase& run = GetParam();
  Engine e(UniformStart(run.d, 11), run.optimizer, run.options);
  for (int t = 0; t < 4; ++t) Step(e);
  if (run.optimizer.count() > 1) {
    // Ranges that joined at different steps.
    std::vector<OptimizerRange> joined(e.optimizer_ranges().ranges().begin(),
                                       e.optimizer_ranges().ranges().end());
    joined[1].step_offset = 2;
    joined[2].step_offset = e.optimizer_state().step;
    e.set_optimizer(OptimizerRanges(joined));
    Step(e);
  }
  const EngineSnapshot taken = e.snapshot();
  Engine resumed = Engine::from_snapshot(taken);
  ASSERT_TRUE(SameEngine(resumed, e));
  EXPECT_TRUE(SameSnapshot(resumed.snapshot(), taken));

  const std::string path = ::testing::TempDir() + "snapshot_round_trip_" + run.name + ".ckpt";
  e.save(path);
  Engine loaded = Engine::load(path);
  std::remove(path.c_str());
  EXPECT_TRUE(SameSnapshot(loaded.snapshot(), taken));

  for (int t = 0; t < 5; ++t) {
    Step(e);
    Step(resumed);
    Step(loaded);
    ASSERT_TRUE(SameEngine(resumed, e)) << "round " << t;
    ASSERT_TRUE(SameEngine(loaded, e)) << "round " << t;
    ASSERT_TRUE(SameSnapshot(resumed.snapshot(), e.snapshot())) << "round " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, SnapshotRoundTrip, ::testing::ValuesIn(Runs()),
                         [](const ::testing::TestParamInfo<RunCase>& p) {
                           return std::string(p.param.name);
                         });

// Without its history a snapshot resumes as a run whose history is empty: everything else
// as it was (iterate, state, counters, random state, lengthscale), the next round held at
// the iterate (the warm-up) with the seeds the original would have drawn, and its commit a
// plain step from the iterate.
TEST(EngineSnapshot, WithoutHistoryTheRunWarmsUpAgain) {
  Options o = With(3, 6, 9);
  o.continue_from = ContinueFrom::last;
  Engine e(UniformStart(5, 2), Adam{.lr = 0.05}, o);
  for (int t = 0; t < 4; ++t) Step(e);
  const EngineSnapshot full = e.snapshot();
  const EngineSnapshot bare = e.snapshot(false);
  EXPECT_EQ(bare.history_size, 0u);
  EXPECT_EQ(bare.history_next, 0u);
  EXPECT_TRUE(bare.points.empty() && bare.gradients.empty());
  EXPECT_EQ(bare.squared_distances, std::vector<double>(36, 0.0));
  EXPECT_EQ(bare.squared_norms, std::vector<double>(6, 0.0));
  EXPECT_EQ(bare.gradient_gram, std::vector<double>(36, 0.0));
  EngineSnapshot expected = full;
  expected.forget_history();
  EXPECT_TRUE(SameSnapshot(bare, expected));

  Engine resumed = Engine::from_snapshot(bare);
  EXPECT_TRUE(BitEqual(resumed.iterate(), e.iterate()));
  EXPECT_TRUE(StateBitEqual(resumed.optimizer_state(), e.optimizer_state()));
  EXPECT_EQ(resumed.rng_state(), e.rng_state());
  EXPECT_EQ(resumed.iteration(), e.iteration());
  EXPECT_EQ(resumed.evaluations(), e.evaluations());
  EXPECT_TRUE(SameBits(resumed.lengthscale(), e.lengthscale()));
  EXPECT_EQ(resumed.history().size(), 0u);

  const std::vector<float> x(e.iterate().begin(), e.iterate().end());
  Batch& held = resumed.ask();
  Batch& original = e.ask();
  for (int i = 0; i < held.size(); ++i) {
    EXPECT_TRUE(BitEqual(held.point(i), x)) << "point " << i;
    EXPECT_EQ(held.seed(i), original.seed(i)) << "point " << i;
  }
  std::vector<float> g_last(x.size());
  for (int i = 0; i < held.size(); ++i) {
    held.loss(i) = Objective(held.point(i), held.grad(i), held.seed(i));
  }
  held.loss(held.size() - 1) = Objective(x, g_last, held.seed(held.size() - 1));
  resumed.tell(held);
  std::vector<float> stepped = x;
  OptimizerState state = full.state;
  apply_step(full.optimizer, stepped, state, g_last);
  EXPECT_TRUE(BitEqual(resumed.iterate(), stepped));
  EXPECT_TRUE(StateBitEqual(resumed.optimizer_state(), state));
  EXPECT_EQ(resumed.history().size(), 3u);
}

TEST(EngineSnapshot, IsRefusedBetweenAskAndTell) {
  Engine e(UniformStart(4, 1), Adam{}, With(2, 4, 0));
  (void)e.ask();
  EXPECT_THROW((void)e.snapshot(), std::runtime_error);
  EXPECT_THROW((void)e.snapshot(false), std::runtime_error);
}

// ---- validation -------------------------------------------------------------------

// d = 5, N = 4 (one evaluation per point), a ring of 8 holding 6 pairs after two rounds.
EngineSnapshot Good() {
  Options o = With(4, 8, 3);
  o.history = 8;
  Engine e(UniformStart(5, 4), OptimizerRanges{{2, Adam{.lr = 0.05}}, {3, Adam{.lr = 0.02}}}, o);
  for (int t = 0; t < 2; ++t) Step(e);
  EngineSnapshot s = e.snapshot();
  EXPECT_EQ(s.history_size, 8u);
  return s;
}

EngineSnapshot GoodPartial() {
  Options o = With(3, 8, 3);
  Engine e(UniformStart(5, 4), Adam{.lr = 0.05}, o);
  for (int t = 0; t < 2; ++t) Step(e);
  EngineSnapshot s = e.snapshot();
  EXPECT_EQ(s.history_size, 6u);
  return s;
}

struct Refusal {
  SnapshotField field;
  int index = -1;
  std::optional<std::size_t> element;
  std::string message;
};

// validate() refuses `s` as `expected` says, and so does from_snapshot, building nothing.
void ExpectRefused(const EngineSnapshot& s, const Refusal& expected) {
  SCOPED_TRACE(expected.message);
  try {
    validate(s);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidSnapshot& e) {
    EXPECT_EQ(e.field(), expected.field) << e.what();
    EXPECT_EQ(e.index(), expected.index) << e.what();
    EXPECT_EQ(e.element(), expected.element) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(expected.message));
  }
  EXPECT_THROW((void)Engine::from_snapshot(s), InvalidSnapshot);
}

template <class F>
EngineSnapshot Edited(EngineSnapshot s, F edit) {
  edit(s);
  return s;
}

TEST(EngineSnapshotValidation, AcceptsWhatAnEngineGives) {
  EXPECT_NO_THROW(validate(Good()));
  EXPECT_NO_THROW(validate(GoodPartial()));
  EngineSnapshot bare = Good();
  bare.forget_history();
  EXPECT_NO_THROW(validate(bare));
}

TEST(EngineSnapshotValidation, OptionsOptimizerAndOffsetsAreChecked) {
  using F = SnapshotField;
  ExpectRefused(Edited(Good(), [](auto& s) { s.options.parallelism = 0; }),
                {F::options, -1, {}, "options: parallelism"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.options.history = 0; }),
                {F::options, -1, {}, "options: history"});
  for (const int value : {-1, 2, 255}) {
    ExpectRefused(
        Edited(Good(),
               [&](auto& s) { s.options.proxy_distances = static_cast<ProxyDistances>(value); }),
        {F::options, -1, {}, "options: proxy_distances"});
  }
  ExpectRefused(Edited(Good(),
                       [](auto& s) {
                         s.optimizer = OptimizerRanges{{2, Adam{}}, {2, Adam{}}};
                       }),
                {F::optimizer, -1, {}, "the sizes add up to 4, but the dimension is 5"});
  ExpectRefused(Edited(Good(),
                       [](auto& s) {
                         s.optimizer = OptimizerRanges{{2, Adam{}}, {3, Adam{.lr = -1.0}}};
                       }),
                {F::optimizer, -1, {}, "range 1: lr: must be finite and >= 0, got -1"});
  // A huge range that wraps the sum around to the dimension.
  ExpectRefused(Edited(Good(),
                       [](auto& s) {
                         s.optimizer = OptimizerRanges{
                             {std::numeric_limits<std::size_t>::max(), Adam{}}, {6, Adam{}}};
                       }),
                {F::optimizer, -1, {}, "the sizes add up to more than"});
  ExpectRefused(Edited(Good(),
                       [](auto& s) {
                         s.optimizer = OptimizerRanges{{2, Adam{}}, {3, Adam{}, s.state.step + 1}};
                       }),
                {F::step_offset, 1, {}, "optimizer range 1 step_offset is"});
  EXPECT_NO_THROW(validate(Edited(Good(), [](auto& s) {
    s.optimizer = OptimizerRanges{{2, Adam{}, s.state.step}, {3, Adam{}, 1}};
  })));
  // torch.optim's boundary values load: lr 0 (a schedule's first or last step), betas 0,
  // weight decay 0, and an eps of 0 where the state's second moment is positive.
  EXPECT_NO_THROW(validate(Edited(Good(), [](auto& s) {
    s.optimizer = OptimizerRanges{{2, Adam{.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0}},
                                  {3, Adam{.lr = 0.0, .eps = 0.0}}};
  })));
}

// An engine saved in the middle of rounds at lr 0 resumes them, and the schedule after
// them, bit for bit.
TEST(EngineSnapshot, RoundsAtLearningRateZeroResumeBitForBit) {
  const std::vector<float> x0 = UniformStart(5, 4);
  const auto lr_at = [](int t) { return t < 4 ? 0.0 : 0.01 * (t - 3); };
  Engine whole(x0, Adam{.lr = 0.0}, With(4, 8, 3));
  Engine first(x0, Adam{.lr = 0.0}, With(4, 8, 3));
  for (int t = 0; t < 8; ++t) {
    whole.set_optimizer(Adam{.lr = lr_at(t)});
    Step(whole);
  }
  for (int t = 0; t < 3; ++t) Step(first);
  EXPECT_TRUE(BitEqual(first.iterate(), x0));
  Engine resumed = Engine::from_snapshot(first.snapshot());
  for (int t = 3; t < 8; ++t) {
    resumed.set_optimizer(Adam{.lr = lr_at(t)});
    Step(resumed);
  }
  EXPECT_TRUE(SameEngine(resumed, whole));
}

TEST(EngineSnapshotValidation, IterateAndStateAreChecked) {
  using F = SnapshotField;
  ExpectRefused(Edited(Good(), [](auto& s) { s.iterate.clear(); }),
                {F::iterate, -1, {}, "iterate is empty"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.iterate[2] = kNaN; }),
                {F::iterate, -1, 2, "iterate element 2 is nan"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.iterate[0] = -kInf; }),
                {F::iterate, -1, 0, "iterate element 0 is -inf"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.iterate[4] = 1e30f; }),
                {F::iterate, -1, 4, "iterate element 4 is 1e+30"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.step = -1; }),
                {F::step, -1, {}, "optimizer state step is -1"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[0][1] = kNaN; }),
                {F::slot, 0, 1, "optimizer state exp_avg (slot 0), element 1 is nan"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[1][3] = -1.0f; }),
                {F::slot, 1, 3, "optimizer state exp_avg_sq (slot 1), element 3 is -1"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[1].clear(); }),
                {F::slot, 1, {}, "slot 1 (exp_avg_sq) holds 0 values, expected 5"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[0].pop_back(); }),
                {F::slot, 0, {}, "holds 4 values, expected 5"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[2].assign(5, 0.0f); }),
                {F::slot, 2, {}, "expected 0 (the optimizer does not keep it)"});
  // A first moment may be negative, a second may not.
  EXPECT_NO_THROW(validate(Edited(Good(), [](auto& s) { s.state.slots[0][1] = -1.0f; })));
}

// Values each in range, together a state no step can leave (docs/DESIGN.md
// section 6): some gradient's step must stay within the bounds tell() commits,
// or every later tell() would refuse.
TEST(EngineSnapshotValidation, AStateThatCannotTakeAStepIsRefused) {
  using F = SnapshotField;
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[0][3] = 3e38f; }),
                {F::slot, 0, 3, "optimizer state exp_avg (slot 0), element 3: cannot take a step"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.state.slots[0][4] = -1e30f; }),
                {F::slot, 0, 4, "cannot take a step"});
  // Large moments whose step is ordinary load, and the engine built from them steps.
  for (const auto& edit : std::vector<std::function<void(EngineSnapshot&)>>{
           [](EngineSnapshot& s) { s.state.slots[1][3] = 3e38f; },
           [](EngineSnapshot& s) {
             s.state.slots[0][3] = 1e20f;
             s.state.slots[1][3] = 1e38f;
           }}) {
    Engine e = Engine::from_snapshot(Edited(Good(), edit));
    EXPECT_NO_THROW(Step(e));
  }
  // Adam with eps = 0 in float steps 0 / 0 from a zero gradient, and fine from
  // any other: a state that can take a step with some gradient loads.
  Engine no_eps(UniformStart(5, 4), Adam{.lr = 1.0, .beta1 = 0.0, .beta2 = 0.0, .eps = 5e-324},
                With(4, 8, 3));
  Step(no_eps);
  EXPECT_NO_THROW(Step(no_eps = Engine::from_snapshot(no_eps.snapshot())));
  // Hyperparameters no state can step with (lr / (1 - beta1) overflows a float):
  // the constructor takes them, and the checkpoint of such a run loads, as stuck
  // as it was; the state is not to blame.
  Engine stuck(UniformStart(5, 4), Adam{.lr = 1.7e38, .beta1 = 0.5, .beta2 = 0.0}, With(4, 8, 3));
  EXPECT_NO_THROW((void)Engine::from_snapshot(stuck.snapshot()));
  // An optimizer without state: SGD's step with a zero gradient never moves.
  Engine plain(UniformStart(5, 4), Sgd{.lr = 0.5}, With(4, 8, 3));
  Step(plain);
  EXPECT_NO_THROW(validate(plain.snapshot()));
  // The momentum buffer: the step is lr times it.
  Engine momentum(UniformStart(5, 4), Sgd{.lr = 0.5, .momentum = 0.9}, With(4, 8, 3));
  Step(momentum);
  ExpectRefused(Edited(momentum.snapshot(), [](auto& s) { s.state.slots[0][0] = 3e38f; }),
                {F::slot, 0, 0, "optimizer state momentum_buffer (slot 0), element 0: cannot"});
}

TEST(EngineSnapshotValidation, ScalarsAndRoundStateAreChecked) {
  using F = SnapshotField;
  for (const double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    ExpectRefused(Edited(Good(), [&](auto& s) { s.lengthscale = bad; }),
                  {F::lengthscale, -1, {}, "lengthscale is"});
  }
  ExpectRefused(Edited(Good(), [](auto& s) { s.iteration = -1; }),
                {F::iteration, -1, {}, "iteration is -1 (must be >= 0)"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.evaluations = -5; }),
                {F::evaluations, -1, {}, "evaluations is -5 (must be >= 0)"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.split_evaluations = 3; }),  // N = 4
                {F::adaptive_split, -1, {}, "adaptive split"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.split_noise = -1.0; }),
                {F::adaptive_split, -1, {}, "adaptive split"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.split_rounds_since_measured = -2; }),
                {F::adaptive_split, -1, {}, "adaptive split"});
  for (const double bad : {-1.0, HUGE_VAL}) {
    ExpectRefused(Edited(Good(), [&](auto& s) { s.last_step_norm = bad; }),
                  {F::last_step_norm, -1, {}, "last step length is"});
  }
  // NaN: a backend that does not measure the step.
  EXPECT_NO_THROW(validate(Edited(Good(), [](auto& s) { s.last_step_norm = std::nan(""); })));
}

TEST(EngineSnapshotValidation, HistoryIsChecked) {
  using F = SnapshotField;
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.history_size = 9; }),
                {F::history_size, -1, {}, "history size is 9, more than the capacity 8"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.history_size = ~std::uint64_t{0}; }),
                {F::history_size, -1, {}, "history size is"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.history_next = 2; }),
                {F::history_next, -1, {}, "history next slot 2 is inconsistent with 6 pairs"});
  ExpectRefused(Edited(Good(), [](auto& s) { s.history_next = 8; }),
                {F::history_next, -1, {}, "history next slot 8"});
  // A full ring may continue at any slot.
  EXPECT_NO_THROW(validate(Edited(Good(), [](auto& s) { s.history_next = 5; })));
  // A declared size the arrays do not hold.
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.history_size = 7; }),
                {F::history_next, -1, {}, "history next slot"});
  ExpectRefused(Edited(GoodPartial(),
                       [](auto& s) {
                         s.history_size = 7;
                         s.history_next = 7;
                       }),
                {F::points, -1, {}, "history points holds 30 values, expected 35"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.gradients.resize(25); }),
                {F::gradients, -1, {}, "history gradients holds 25 values, expected 30"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.points[1 * 5 + 2] = kNaN; }),
                {F::points, -1, 7, "history point 1, element 2 is nan"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.gradients[0] = 1e20f; }),
                {F::gradients, -1, 0, "history gradient 0, element 0 is 1e+20"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.squared_distances[1 * 8 + 2] = -1.0; }),
                {F::squared_distances, -1, 10, "history squared distance (1, 2) is -1"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.squared_distances.pop_back(); }),
                {F::squared_distances, -1, {}, "holds 63 values, expected 64"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.squared_norms[3] = std::nan(""); }),
                {F::squared_norms, -1, 3, "history squared norm 3 is nan"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.squared_norms.resize(3); }),
                {F::squared_norms, -1, {}, "holds 3 values, expected 8"});
  ExpectRefused(Edited(GoodPartial(), [](auto& s) { s.gradient_gram[2 * 8 + 3] = HUGE_VAL; }),
                {F::gradient_gram, -1, 19, "history gradient inner product (2, 3) is inf"});
}

// from_snapshot's own arguments are checked as arguments, before the snapshot is.
TEST(EngineSnapshot, ArgumentsThatCannotBeHonouredAreInvalidArguments) {
  const auto refusal = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InvalidSnapshot& e) {
      return std::string("snapshot: ") + e.what();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const Device missing = Device::cuda(cuda_device_count());
  EngineSnapshot bad = Good();
  bad.iteration = -1;
  EXPECT_THAT(refusal([&] { (void)Engine::from_snapshot(bad, missing); }),
              HasSubstr("device: " + missing.name() + " is not available"));
  EXPECT_THAT(refusal([&] { (void)Engine::from_snapshot(Good(), Device::cpu(), Precision::bf16); }),
              HasSubstr("history_precision"));
  // A snapshot taken on a device this process does not have names the options' device.
  EngineSnapshot elsewhere = Good();
  elsewhere.options.device = missing;
  EXPECT_THAT(refusal([&] { (void)Engine::from_snapshot(elsewhere); }),
              HasSubstr("snapshot: options.device: " + missing.name() + " is not available"));
  // ... and resumes where the caller says.
  EXPECT_EQ(Engine::from_snapshot(elsewhere, Device::cpu()).device(), Device::cpu());
}

// ---- ranges that join late -----------------------------------------------------------

// The snapshot of `e` with range `r` joining now: its slots zero on its coordinates (a fresh
// state) and its step offset the state's step.
EngineSnapshot Joining(const Engine& e, std::size_t r) {
  EngineSnapshot s = e.snapshot();
  std::vector<OptimizerRange> ranges(s.optimizer.ranges().begin(), s.optimizer.ranges().end());
  std::size_t begin = 0;
  for (std::size_t k = 0; k < r; ++k) begin += ranges[k].size;
  for (std::vector<float>& slot : s.state.slots) {
    if (slot.empty()) continue;
    std::fill(slot.begin() + static_cast<std::ptrdiff_t>(begin),
              slot.begin() + static_cast<std::ptrdiff_t>(begin + ranges[r].size), 0.0f);
  }
  ranges[r].step_offset = s.state.step;
  s.optimizer = OptimizerRanges(ranges);
  return s;
}

// With N = 1 the engine is the base optimizer: after range 1 joins at step k it is, bit for
// bit, a fresh optimizer on its coordinates started k steps later, while range 0 carries on.
// With Proxy::target (every proxy step a true step) the same holds over N = 3 points a round.
TEST(StepOffset, ALateRangeIsAFreshOptimizerStartedLater) {
  for (const Optimizer& second :
       {Optimizer(Adam{.lr = 0.03, .beta1 = 0.8}), Optimizer(adamw(0.03, 0.1))}) {
    for (const int n : {1, 3}) {
      SCOPED_TRACE(std::string(optimizer_name(second)) + " N = " + std::to_string(n));
      const Optimizer first =
          std::holds_alternative<Adam>(second) && std::get<Adam>(second).decoupled_weight_decay
              ? Optimizer(adamw(0.05, 0.05))
              : Optimizer(Adam{.lr = 0.05});
      Options o = With(n, 6, 1);
      o.proxy = n > 1 ? Proxy::target : Proxy::gp;
      const auto gradient = [](std::span<const float> x, std::span<float> g) {
        return Objective(x, g, 0);
      };
      const std::size_t d = 6;
      Engine e(UniformStart(d, 5), OptimizerRanges{{2, first}, {4, second}}, o);
      e.set_gradient_oracle(gradient);
      const auto run = [&](Engine& engine) {
        Batch& b = engine.ask();
        for (int i = 0; i < b.size(); ++i) b.loss(i) = gradient(b.point(i), b.grad(i));
        engine.tell(b);
      };
      for (int t = 0; t < 3; ++t) run(e);
      Engine late = Engine::from_snapshot(Joining(e, 1));
      late.set_gradient_oracle(gradient);
      EXPECT_EQ(late.optimizer_ranges()[1].step_offset, e.optimizer_state().step);

      // The reference: the whole run as plain steps, range 1 restarting at the join.
      const std::vector<float> x(late.iterate().begin(), late.iterate().end());
      std::vector<float> x0(x.begin(), x.begin() + 2), x1(x.begin() + 2, x.end());
      OptimizerState s0 = e.snapshot().state;
      for (std::vector<float>& slot : s0.slots) {
        if (!slot.empty()) slot.resize(2);
      }
      OptimizerState s1 = init_state(second, 4);
      std::vector<float> g(d), whole(d);
      for (int t = 0; t < 4; ++t) {
        run(late);
        for (int i = 0; i < n; ++i) {
          std::copy(x0.begin(), x0.end(), whole.begin());
          std::copy(x1.begin(), x1.end(), whole.begin() + 2);
          gradient(whole, g);
          apply_step(first, x0, s0, std::span<const float>(g).subspan(0, 2));
          apply_step(second, x1, s1, std::span<const float>(g).subspan(2, 4));
        }
        ASSERT_TRUE(BitEqual(late.iterate().subspan(0, 2), x0)) << "round " << t;
        ASSERT_TRUE(BitEqual(late.iterate().subspan(2, 4), x1)) << "round " << t;
        EXPECT_EQ(late.optimizer_state().step - late.optimizer_ranges()[1].step_offset, s1.step);
      }
    }
  }
}

}  // namespace
