// Engine::tell's `unchanged` coordinate ranges (DESIGN.md section 2), on
// every device: the CPU and CUDA device 0 (the /cuda0 instances skip without a
// GPU, or fail with OPTEX_REQUIRE_GPU=1).
//
// What is true, bit for bit, of one commit with unchanged ranges against the
// same commit without them (a twin engine loaded from a checkpoint taken just
// before the round, told the same gradients):
//   - on the ranges, the iterate and every state slot are what they were
//     before the round;
//   - everywhere else they equal the twin's: the coordinates of an
//     elementwise optimizer interact only through the committed point, which
//     is chosen as without the ranges;
//   - the step count, the committed point, the loss and the history (points,
//     gradients and Gram statistics) equal the twin's.
// A whole run with unchanged ranges does not equal one without them past the
// first round: the next round's proxy points and GP weights see the
// coordinates that did not move. So every round is compared with its own twin.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/batch.hpp"
#include "optex/engine/coordinate_range.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "support/engine_equality.hpp"
#include "support/gpu_test_support.hpp"
#include "support/test_support.hpp"
#include "support/throws_with.hpp"

namespace optex {
// Devices in gtest's messages by name, not as bytes.
inline void PrintTo(const Device& device, std::ostream* os) { *os << device.name(); }
}  // namespace optex

namespace {

namespace fs = std::filesystem;
using optex::Adam;
using optex::Batch;
using optex::CoordinateRange;
using optex::Device;
using optex::Engine;
using optex::GradientHistory;
using optex::IterationInfo;
using optex::Optimizer;
using optex::OptimizerState;
using optex::Options;
using optex::Sgd;
using optex::test::BitEqual;
using optex::test::SameBits;
using optex::test::SameEngine;
using optex::test::ThrowsWith;
using optex::test::UniformStart;
using optex::test::WithN;

// Over one 256-thread block of the CUDA kernels; the ranges take the first and
// the last coordinate and one crosses a block boundary.
constexpr std::size_t kDim = 300;
const std::vector<CoordinateRange> kUnused = {{0, 7}, {100, 60}, {250, 20}, {299, 1}};

bool InRanges(std::size_t k, std::span<const CoordinateRange> ranges) {
  return std::any_of(ranges.begin(), ranges.end(), [k](const CoordinateRange& r) {
    return k >= r.offset && k - r.offset < r.size;
  });
}

// 0.5 sum_k w_k (x_k - 1)^2 over the coordinates outside `unused`, whose
// gradient is exactly zero: what a caller writes for parameters that took no
// part in the evaluation.
struct PartlyUsedQuadratic {
  std::vector<CoordinateRange> unused;
  double Evaluate(std::span<const float> x, std::span<float> g) const {
    double f = 0.0;
    for (std::size_t k = 0; k < x.size(); ++k) {
      if (InRanges(k, unused)) {
        g[k] = 0.0f;
        continue;
      }
      const double w = 1.0 + static_cast<double>(k % 7);
      const double r = static_cast<double>(x[k]) - 1.0;
      f += 0.5 * w * r * r;
      g[k] = static_cast<float>(w * r);
    }
    return f;
  }
};

void Evaluate(const PartlyUsedQuadratic& f, Batch& b) {
  for (int i = 0; i < b.size(); ++i) b.loss(i) = f.Evaluate(b.point(i), b.grad(i));
}

// a and b agree bit for bit on the coordinates inside `ranges` (inside = true)
// or on those outside them (inside = false).
::testing::AssertionResult SameBitsWhere(std::span<const float> a, std::span<const float> b,
                                         std::span<const CoordinateRange> ranges, bool inside) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (InRanges(k, ranges) == inside && !SameBits(a.subspan(k, 1), b.subspan(k, 1))) {
      return ::testing::AssertionFailure() << "coordinate " << k << ": " << a[k] << " vs " << b[k];
    }
  }
  return ::testing::AssertionSuccess();
}

// The same for the iterate and every state slot of two engines (or a saved
// iterate and state); the step counts are not compared.
::testing::AssertionResult SameValuesWhere(std::span<const float> xa, const OptimizerState& sa,
                                           std::span<const float> xb, const OptimizerState& sb,
                                           std::span<const CoordinateRange> ranges, bool inside) {
  auto r = SameBitsWhere(xa, xb, ranges, inside);
  if (!r) return r << " (iterate)";
  for (std::size_t j = 0; j < sa.slots.size(); ++j) {
    r = SameBitsWhere(sa.slots[j], sb.slots[j], ranges, inside);
    if (!r) return r << " (state slot " << j << ")";
  }
  return ::testing::AssertionSuccess();
}

// Every point, gradient and Gram entry of two histories, bit for bit.
::testing::AssertionResult SameHistory(const GradientHistory& a, const GradientHistory& b) {
  if (a.size() != b.size() || a.newest_slot() != b.newest_slot()) {
    return ::testing::AssertionFailure() << "history size or ring position";
  }
  for (std::size_t j = 0; j < a.size(); ++j) {
    auto r = BitEqual(a.point(j), b.point(j));
    if (!r) return r << " (history point " << j << ")";
    r = BitEqual(a.gradient(j), b.gradient(j));
    if (!r) return r << " (history gradient " << j << ")";
    for (std::size_t k = 0; k < a.size(); ++k) {
      if (!SameBits(a.squared_distance(j, k), b.squared_distance(j, k)) ||
          !SameBits(a.gradient_inner(j, k), b.gradient_inner(j, k))) {
        return ::testing::AssertionFailure() << "history Gram entry " << j << ", " << k;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

bool AnyMovedWhere(std::span<const float> before, std::span<const float> after,
                   std::span<const CoordinateRange> ranges) {
  return !SameBitsWhere(before, after, ranges, true);
}

// Adam with L2 weight decay, AdamW, and SGD with momentum and weight decay:
// each moves a coordinate with a zero gradient (decay, momentum).
struct Case {
  const char* name;
  Optimizer optimizer;
};
const Case kCases[] = {
    {"adam_l2", Adam{.lr = 0.05, .weight_decay = 0.1}},
    {"adamw", optex::adamw(0.05, 0.1)},
    {"sgd_momentum", Sgd{.lr = 0.02, .momentum = 0.9, .weight_decay = 0.05}},
    {"sgd_nesterov", Sgd{.lr = 0.02, .momentum = 0.9, .nesterov = true, .weight_decay = 0.05}},
};

class Unchanged : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) optex::test::SkipOrFailWithoutGpu();
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  Options On(Options o) const {
    o.device = GetParam();
    o.history = 6;
    return o;
  }

  // A file in this test's own temporary directory.
  std::string Path(const std::string& name) {
    if (dir_.empty()) {
      static std::atomic<int> counter{0};
      dir_ = fs::temp_directory_path() / ("optex_test_unchanged_" + std::to_string(::getpid()) +
                                          "_" + std::to_string(counter++));
      fs::create_directories(dir_);
    }
    return (dir_ / name).string();
  }

  // The engine as it is now, a batch pending: a twin that has asked too.
  Engine PendingTwin(const std::string& checkpoint) {
    Engine twin = Engine::load(checkpoint);
    twin.ask();
    return twin;
  }

 private:
  fs::path dir_;
};

std::string DeviceName(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cuda() ? "cuda" + std::to_string(info.param.index) : std::string("cpu");
}

// tests/CMakeLists.txt runs the instances whose name ends in /cuda* with the
// ctest label gpu and the others without it.
INSTANTIATE_TEST_SUITE_P(Devices, Unchanged, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         DeviceName);

// One round of `engine` told with `unchanged`, against a twin told the same
// gradients without them: the statements of the file comment.
void ExpectRoundAgainstTwin(Engine& engine, Engine& twin, const PartlyUsedQuadratic& f,
                            std::span<const CoordinateRange> unchanged) {
  const std::vector<float> x_before(engine.iterate().begin(), engine.iterate().end());
  const OptimizerState state_before = engine.optimizer_state();
  Batch& b = engine.ask();
  Batch& tb = twin.ask();
  for (int i = 0; i < b.size(); ++i) ASSERT_TRUE(BitEqual(b.point(i), tb.point(i))) << i;
  Evaluate(f, b);
  Evaluate(f, tb);
  const IterationInfo info = engine.tell(b, unchanged);
  const IterationInfo& twin_info = twin.tell(tb);

  EXPECT_TRUE(SameValuesWhere(engine.iterate(), engine.optimizer_state(), x_before, state_before,
                              unchanged, true));
  EXPECT_TRUE(SameValuesWhere(engine.iterate(), engine.optimizer_state(), twin.iterate(),
                              twin.optimizer_state(), unchanged, false));
  EXPECT_EQ(engine.optimizer_step(), twin.optimizer_step());
  EXPECT_EQ(engine.optimizer_state().step, engine.optimizer_step());
  EXPECT_EQ(info.committed_point, twin_info.committed_point);
  EXPECT_TRUE(SameBits(info.loss, twin_info.loss));
  EXPECT_EQ(info.dropped, twin_info.dropped);
  EXPECT_TRUE(SameHistory(engine.history(), twin.history()));
  // Not a vacuous comparison: without the ranges those coordinates moved.
  EXPECT_TRUE(AnyMovedWhere(x_before, twin.iterate(), unchanged));
}

TEST_P(Unchanged, TheRangesKeepTheirValuesAndTheRestIsAsWithoutThem) {
  const PartlyUsedQuadratic used_everywhere{};
  const PartlyUsedQuadratic partly{kUnused};
  for (const Case& c : kCases) {
    for (const auto continue_from : {optex::ContinueFrom::last, optex::ContinueFrom::best_loss}) {
      SCOPED_TRACE(std::string(c.name) +
                   (continue_from == optex::ContinueFrom::last ? ", last" : ", best_loss"));
      Options o = On(WithN(4, 11));
      o.continue_from = continue_from;
      Engine engine(UniformStart(kDim, 3, -2.0, 2.0), c.optimizer, o);
      // Every coordinate takes part at first, so that the state to keep is not zero.
      for (int t = 0; t < 3; ++t) {
        Batch& b = engine.ask();
        Evaluate(used_everywhere, b);
        engine.tell(b);
      }
      const std::vector<float> x_at_switch(engine.iterate().begin(), engine.iterate().end());
      const OptimizerState state_at_switch = engine.optimizer_state();
      for (int t = 0; t < 6; ++t) {
        SCOPED_TRACE("round " + std::to_string(t));
        const std::string checkpoint = Path("before_round.ckpt");
        engine.save(checkpoint);
        Engine twin = Engine::load(checkpoint);
        ExpectRoundAgainstTwin(engine, twin, partly, kUnused);
        if (HasFailure()) return;
      }
      // Round after round, the ranges still hold what they held at the switch.
      EXPECT_TRUE(SameValuesWhere(engine.iterate(), engine.optimizer_state(), x_at_switch,
                                  state_at_switch, kUnused, true));
    }
  }
}

// Several evaluations per point: the chain and its means, the same statements.
TEST_P(Unchanged, HoldsWithSeveralEvaluationsPerPoint) {
  if (GetParam().is_cuda()) GTEST_SKIP() << "evaluations_per_point > 1 is CPU only";
  const PartlyUsedQuadratic partly{kUnused};
  Options o = On(WithN(4, 2));
  o.evaluations_per_point = 2;
  Engine engine(UniformStart(kDim, 4, -2.0, 2.0), Adam{.lr = 0.05, .weight_decay = 0.1}, o);
  for (int t = 0; t < 4; ++t) {
    SCOPED_TRACE("round " + std::to_string(t));
    engine.save(Path("before_round.ckpt"));
    Engine twin = Engine::load(Path("before_round.ckpt"));
    ExpectRoundAgainstTwin(engine, twin, partly, kUnused);
    if (HasFailure()) return;
  }
}

// The flat overload leaves the same coordinates as the batch one.
TEST_P(Unchanged, TheFlatTellAgreesWithTheBatchTell) {
  const PartlyUsedQuadratic partly{kUnused};
  const Options o = On(WithN(3, 5));
  const std::vector<float> x0 = UniformStart(kDim, 6, -2.0, 2.0);
  Engine by_batch(x0, optex::adamw(0.05, 0.1), o);
  Engine flat(x0, optex::adamw(0.05, 0.1), o);
  std::vector<float> grads(3 * kDim);
  std::vector<double> losses(3);
  for (int t = 0; t < 5; ++t) {
    SCOPED_TRACE("round " + std::to_string(t));
    Batch& b = by_batch.ask();
    Evaluate(partly, b);
    by_batch.tell(b, kUnused);
    Batch& fb = flat.ask();
    for (int i = 0; i < 3; ++i) {
      losses[static_cast<std::size_t>(i)] =
          partly.Evaluate(fb.point(i), std::span<float>(grads).subspan(i * kDim, kDim));
    }
    flat.tell(grads, losses, kUnused);
    ASSERT_TRUE(SameEngine(flat, by_batch));
  }
}

// Dropped pairs: the last point's gradient is NaN (the commit replays to an
// earlier point) and another point has a NaN inside an unchanged range only.
// Both are dropped exactly as without the ranges, and the ranges still hold.
TEST_P(Unchanged, HoldWhenPairsAreDropped) {
  const PartlyUsedQuadratic partly{kUnused};
  Engine engine(UniformStart(kDim, 7, -2.0, 2.0),
                Sgd{.lr = 0.02, .momentum = 0.9, .weight_decay = 0.05}, On(WithN(4, 9)));
  for (int t = 0; t < 2; ++t) {
    Batch& b = engine.ask();
    Evaluate(PartlyUsedQuadratic{}, b);
    engine.tell(b);
  }
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE("round " + std::to_string(t));
    engine.save(Path("before_round.ckpt"));
    Engine twin = Engine::load(Path("before_round.ckpt"));
    const std::vector<float> x_before(engine.iterate().begin(), engine.iterate().end());
    const OptimizerState state_before = engine.optimizer_state();
    Batch& b = engine.ask();
    Batch& tb = twin.ask();
    for (Batch* batch : {&b, &tb}) {
      Evaluate(partly, *batch);
      batch->grad(3)[20] = std::numeric_limits<float>::quiet_NaN();
      batch->grad(1)[kUnused[1].offset + 5] = std::numeric_limits<float>::quiet_NaN();
    }
    const IterationInfo info = engine.tell(b, kUnused);
    const IterationInfo& twin_info = twin.tell(tb);
    EXPECT_EQ(info.committed_point, 2);
    EXPECT_EQ(info.dropped, 2);
    EXPECT_EQ(twin_info.committed_point, 2);
    EXPECT_TRUE(SameValuesWhere(engine.iterate(), engine.optimizer_state(), x_before, state_before,
                                kUnused, true));
    EXPECT_TRUE(SameValuesWhere(engine.iterate(), engine.optimizer_state(), twin.iterate(),
                                twin.optimizer_state(), kUnused, false));
    EXPECT_EQ(engine.optimizer_step(), twin.optimizer_step());
    EXPECT_TRUE(SameHistory(engine.history(), twin.history()));
    for (std::size_t j = 0; j < engine.history().size(); ++j) {
      const auto g = engine.history().gradient(j);
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); }));
    }
  }
}

// Every coordinate unchanged: the iterate and the state stay as they were,
// while the step count and the history advance.
TEST_P(Unchanged, EveryCoordinateUnchanged) {
  Engine engine(UniformStart(kDim, 8, -2.0, 2.0), Adam{.lr = 0.05, .weight_decay = 0.1},
                On(WithN(3, 1)));
  Batch& first = engine.ask();
  Evaluate(PartlyUsedQuadratic{}, first);
  engine.tell(first);
  const std::vector<float> x_before(engine.iterate().begin(), engine.iterate().end());
  const OptimizerState state_before = engine.optimizer_state();
  const std::size_t history_before = engine.history().size();
  const CoordinateRange all[] = {{0, kDim}};
  Batch& b = engine.ask();
  Evaluate(PartlyUsedQuadratic{{{0, kDim}}}, b);
  const IterationInfo& info = engine.tell(b, all);
  EXPECT_TRUE(BitEqual(engine.iterate(), x_before));
  for (std::size_t j = 0; j < state_before.slots.size(); ++j) {
    EXPECT_TRUE(BitEqual(engine.optimizer_state().slots[j], state_before.slots[j])) << j;
  }
  EXPECT_EQ(engine.optimizer_step(), state_before.step + info.committed_point + 1);
  EXPECT_EQ(engine.history().size(), history_before + 3);
}

// The step count: 1 for a round whose points held at the iterate (the default
// warm-up), committed_point + 1 once the proxy steps are applied, N for the
// reference warm-up's zero-gradient steps; always the state's own counter.
TEST_P(Unchanged, OptimizerStepCountsTheStepsOfEachRound) {
  for (const auto continue_from : {optex::ContinueFrom::last, optex::ContinueFrom::best_loss}) {
    Options o = On(WithN(4, 13));
    o.continue_from = continue_from;
    Engine engine(UniformStart(kDim, 9, -2.0, 2.0), Adam{.lr = 0.05}, o);
    EXPECT_EQ(engine.optimizer_step(), 0);
    bool saw_an_earlier_point = false;
    for (int t = 0; t < 8; ++t) {
      const std::int64_t before = engine.optimizer_step();
      Batch& b = engine.ask();
      // A noisy loss, so that best_loss sometimes commits from an earlier point.
      for (int i = 0; i < b.size(); ++i) {
        b.loss(i) = PartlyUsedQuadratic{}.Evaluate(b.point(i), b.grad(i)) + ((t + i) % 3) * 50.0;
      }
      const IterationInfo& info = engine.tell(b);
      const std::int64_t expected = t == 0 ? 1 : info.committed_point + 1;
      EXPECT_EQ(engine.optimizer_step() - before, expected) << "round " << t;
      EXPECT_EQ(engine.optimizer_step(), engine.optimizer_state().step);
      saw_an_earlier_point = saw_an_earlier_point || info.committed_point < 3;
    }
    if (continue_from == optex::ContinueFrom::best_loss) {
      EXPECT_TRUE(saw_an_earlier_point);
    }
  }
  Options reference = On(WithN(4, 13));
  reference.warmup = optex::Warmup::zero_gradient;
  Engine engine(UniformStart(kDim, 9, -2.0, 2.0), Adam{.lr = 0.05}, reference);
  Batch& b = engine.ask();
  Evaluate(PartlyUsedQuadratic{}, b);
  engine.tell(b);
  EXPECT_EQ(engine.optimizer_step(), 4);
}

// Hostile ranges: each is refused with std::invalid_argument naming the
// range and the problem, from both overloads, and the engine is exactly its
// twin that was never told (the batch still pending); it can be told
// correctly afterwards, with the twin's result.
TEST_P(Unchanged, BadRangesAreRefusedAndChangeNothing) {
  constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max();
  struct Bad {
    std::vector<CoordinateRange> ranges;
    std::vector<std::string> needles;
  };
  const std::vector<Bad> bad = {
      {{{0, 5}, {3, 4}}, {"unchanged", "range 1 (offset 3, size 4)", "overlaps", "range 0"}},
      {{{10, 2}, {0, 2}}, {"unchanged", "range 1 (offset 0, size 2)", "sorted"}},
      {{{5, 5}, {5, 1}}, {"range 1 (offset 5, size 1)", "overlaps"}},
      {{{kDim - 1, 2}}, {"range 0", "past the dimension 300"}},
      {{{kDim, 1}}, {"range 0 (offset 300, size 1)", "past the dimension"}},
      {{{3, 0}}, {"range 0 (offset 3, size 0)", "empty"}},
      {{{1, kHuge}}, {"range 0 (offset 1, size " + std::to_string(kHuge), "past the dimension"}},
      {{{kHuge, 1}}, {"past the dimension"}},
      {{{0, 1}, {kHuge, 2}}, {"range 1", "past the dimension"}},
  };
  const PartlyUsedQuadratic partly{kUnused};
  Engine engine(UniformStart(kDim, 10, -2.0, 2.0), Adam{.lr = 0.05, .weight_decay = 0.1},
                On(WithN(3, 4)));
  Batch& first = engine.ask();
  Evaluate(partly, first);
  engine.tell(first);
  engine.save(Path("before_round.ckpt"));
  Batch& b = engine.ask();
  Evaluate(partly, b);
  std::vector<float> grads(3 * kDim);
  std::vector<double> losses(3);
  for (int i = 0; i < 3; ++i) {
    std::copy(b.grad(i).begin(), b.grad(i).end(), grads.begin() + i * kDim);
    losses[static_cast<std::size_t>(i)] = b.loss(i);
  }
  Engine untouched = PendingTwin(Path("before_round.ckpt"));
  for (const Bad& c : bad) {
    SCOPED_TRACE(c.needles.front());
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { engine.tell(b, c.ranges); }, c.needles));
    EXPECT_TRUE(SameEngine(engine, untouched));
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { engine.tell(grads, losses, c.ranges); },
                                                  c.needles));
    EXPECT_TRUE(SameEngine(engine, untouched));
  }
  // Adjacent ranges are disjoint: accepted. The round is then the twin's.
  Batch& tb = untouched.ask();
  Evaluate(partly, tb);
  const std::vector<CoordinateRange> adjacent = {{0, 5}, {5, 1}, {6, 4}};
  const std::vector<CoordinateRange> merged = {{0, 10}};
  engine.tell(b, adjacent);
  untouched.tell(tb, merged);
  EXPECT_TRUE(SameEngine(engine, untouched));
}

}  // namespace
