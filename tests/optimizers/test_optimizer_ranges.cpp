// OptimizerRanges (optex/optimizers/optimizer_ranges.hpp): the shape rules of per-range
// hyperparameters, their state layout, that a ranged step is each range's own step on its
// slice (bit for bit), and what a running engine may replace them with.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/engine_equality.hpp"

namespace {

using optex::Adam;
using optex::Lion;
using optex::OptimizerRange;
using optex::OptimizerRanges;
using optex::OptimizerState;
using optex::RmsProp;
using optex::Sgd;
using optex::test::BitEqual;
using ::testing::HasSubstr;

std::string RefusalOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(OptimizerRanges, OneOptimizerCoversAnyDimension) {
  const OptimizerRanges whole = Adam{.lr = 0.1};
  EXPECT_TRUE(whole.covers_any_dimension());
  EXPECT_EQ(whole.count(), 1u);
  for (std::size_t d : {1u, 7u, 1000u}) {
    const OptimizerRanges sized = whole.for_dimension(d);
    EXPECT_FALSE(sized.covers_any_dimension());
    ASSERT_EQ(sized.count(), 1u);
    EXPECT_EQ(sized[0].size, d);
    EXPECT_EQ(sized.front(), optex::Optimizer(Adam{.lr = 0.1}));
  }
}

TEST(OptimizerRanges, ShapeRulesAreCheckedWithMessagesNamingTheRange) {
  EXPECT_THAT(RefusalOf([] { OptimizerRanges(std::vector<OptimizerRange>{}); }),
              HasSubstr("at least one range"));
  EXPECT_THAT(RefusalOf([] {
                OptimizerRanges({{3, Sgd{}}, {0, Sgd{}}});
              }),
              HasSubstr("range 1 has size 0"));
  EXPECT_THAT(RefusalOf([] {
                OptimizerRanges({{3, Sgd{}}, {2, Adam{}}});
              }),
              HasSubstr("range 1 is adam but range 0 is sgd"));
  const OptimizerRanges two{{3, Sgd{}}, {2, Sgd{.momentum = 0.5}}};
  EXPECT_THAT(RefusalOf([&] { (void)two.for_dimension(6); }),
              HasSubstr("the sizes add up to 5, but the dimension is 6"));
  EXPECT_THAT(RefusalOf([&] { (void)two.for_dimension(4); }), HasSubstr("add up to 5"));
  EXPECT_EQ(RefusalOf([&] { (void)two.for_dimension(5); }), "(accepted)");
  // A bad hyperparameter names its range when there are several, and only then.
  const OptimizerRanges bad{{3, Sgd{}}, {2, Sgd{.lr = std::nan("")}}};
  EXPECT_THAT(RefusalOf([&] { (void)bad.for_dimension(5); }),
              HasSubstr("range 1: lr: must be finite and >= 0, got nan"));
  EXPECT_EQ(RefusalOf([] { (void)OptimizerRanges(Sgd{.lr = -1.0}).for_dimension(5); }),
            "lr: must be finite and >= 0, got -1");
  // Adam and AdamW are one kind: they may share an engine.
  EXPECT_EQ(RefusalOf([] {
              (void)OptimizerRanges({{2, Adam{}}, {3, optex::adamw()}});
            }),
            "(accepted)");
}

TEST(OptimizerRanges, TheStateKeepsTheSlotsOfAnyRange) {
  EXPECT_EQ(OptimizerRanges({{2, Sgd{}}, {3, Sgd{}}}).state_slots(), optex::StateSlots{});
  EXPECT_EQ(OptimizerRanges({{2, Sgd{}}, {3, Sgd{.momentum = 0.9}}}).state_slots(),
            optex::StateSlots{}.with(0));
  EXPECT_EQ(OptimizerRanges({{2, RmsProp{.momentum = 0.5}}, {3, RmsProp{.centered = true}}})
                .state_slots(),
            optex::StateSlots{}.with(0).with(1).with(2));
  const OptimizerState s = optex::init_state(
      OptimizerRanges({{2, Sgd{}}, {3, Sgd{.momentum = 0.9}}}).for_dimension(5), 5);
  EXPECT_EQ(s.slots[0], std::vector<float>(5, 0.0f));
  EXPECT_TRUE(s.slots[1].empty());
}

// A non-quadratic gradient that differs per coordinate and per step.
std::vector<float> GradientAt(std::span<const float> x, int t) {
  std::vector<float> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    g[i] = static_cast<float>(std::sin(1.3 * x[i] + 0.7 * static_cast<double>(i)) +
                              0.1 * static_cast<double>(t) * x[i]);
  }
  return g;
}

struct SliceCase {
  const char* name;
  OptimizerRanges ranges;
};

class RangedStep : public ::testing::TestWithParam<SliceCase> {};

// Coordinates are independent, so the ranged step over x is, bit for bit, each range's own
// optimizer stepping its slice with a state of its own; a slot only another range uses stays
// zero.
TEST_P(RangedStep, IsEachRangesOwnStepOnItsSlice) {
  const OptimizerRanges ranges = GetParam().ranges;
  std::size_t d = 0;
  for (const OptimizerRange& r : ranges.ranges()) d += r.size;
  std::vector<float> x(d);
  for (std::size_t i = 0; i < d; ++i) x[i] = 0.5f - 0.1f * static_cast<float>(i);
  OptimizerState state = optex::init_state(ranges, d);
  std::vector<std::vector<float>> xs;
  std::vector<OptimizerState> states;
  std::size_t begin = 0;
  for (const OptimizerRange& r : ranges.ranges()) {
    xs.emplace_back(x.begin() + static_cast<std::ptrdiff_t>(begin),
                    x.begin() + static_cast<std::ptrdiff_t>(begin + r.size));
    states.push_back(optex::init_state(r.optimizer, r.size));
    begin += r.size;
  }
  for (int t = 0; t < 10; ++t) {
    const std::vector<float> g = GradientAt(x, t);
    optex::apply_step(ranges, x, state, g);
    begin = 0;
    for (std::size_t k = 0; k < ranges.count(); ++k) {
      const std::size_t n = ranges[k].size;
      optex::apply_step(ranges[k].optimizer, xs[k], states[k],
                        std::span<const float>(g).subspan(begin, n));
      ASSERT_TRUE(BitEqual(std::span<const float>(x).subspan(begin, n), xs[k]))
          << "range " << k << " step " << t;
      for (std::size_t j = 0; j < state.slots.size(); ++j) {
        if (state.slots[j].empty()) continue;
        const std::span<const float> slice =
            std::span<const float>(state.slots[j]).subspan(begin, n);
        if (states[k].slots[j].empty()) {
          EXPECT_EQ(std::vector<float>(slice.begin(), slice.end()), std::vector<float>(n, 0.0f));
        } else {
          ASSERT_TRUE(BitEqual(slice, states[k].slots[j])) << "slot " << j << " range " << k;
        }
      }
      begin += n;
    }
    EXPECT_EQ(state.step, t + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, RangedStep,
    ::testing::Values(
        SliceCase{"sgd_mixed_momentum",
                  {{3, Sgd{.lr = 0.1}},
                   {4, Sgd{.lr = 0.05, .momentum = 0.9, .nesterov = true}},
                   {2, Sgd{.lr = 0.02, .weight_decay = 0.5}}}},
        SliceCase{"adam_and_adamw",
                  {{5, Adam{.lr = 0.1, .weight_decay = 0.1}}, {4, optex::adamw(0.05, 0.2)}}},
        SliceCase{"rmsprop_mixed_slots",
                  {{2, RmsProp{.lr = 0.01}},
                   {3, RmsProp{.lr = 0.02, .momentum = 0.9}},
                   {4, RmsProp{.lr = 0.005, .centered = true}}}},
        SliceCase{"lion", {{6, Lion{.lr = 0.01}}, {1, Lion{.lr = 0.1, .weight_decay = 0.5}}}},
        SliceCase{"many_small",
                  {{1, Adam{.lr = 0.1}},
                   {1, Adam{.lr = 0.2}},
                   {1, Adam{.lr = 0.3}},
                   {1, Adam{.lr = 0.4}},
                   {1, Adam{.lr = 0.5}}}}),
    [](const ::testing::TestParamInfo<SliceCase>& p) { return std::string(p.param.name); });

// One range is exactly one optimizer: the same bits as the unranged step.
TEST(OptimizerRanges, OneRangeIsTheOptimizerItself) {
  const optex::Optimizer adam = Adam{.lr = 0.05, .beta1 = 0.8};
  std::vector<float> a = {1.0f, -2.0f, 3.0f}, b = a;
  OptimizerState sa = optex::init_state(adam, 3), sb = sa;
  for (int t = 0; t < 5; ++t) {
    const std::vector<float> g = GradientAt(a, t);
    optex::apply_step(adam, a, sa, g);
    optex::apply_step(OptimizerRanges({{3, adam}}), b, sb, g);
  }
  EXPECT_TRUE(BitEqual(a, b));
  EXPECT_EQ(sa, sb);
}

// A step refuses ranges that do not fit x or the state, before writing anything.
TEST(OptimizerRanges, AStepRefusesRangesThatDoNotFit) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f};
  const std::vector<float> g = {0.1f, 0.2f, 0.3f};
  OptimizerState s = optex::init_state(Adam{}, 3);
  EXPECT_THROW(optex::apply_step(OptimizerRanges({{2, Adam{}}}), x, s, g), std::invalid_argument);
  EXPECT_THROW(optex::apply_step(OptimizerRanges({{2, Adam{}}, {2, Adam{}}}), x, s, g),
               std::invalid_argument);
  EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(s, optex::init_state(Adam{}, 3));
}

// ---- step offsets ---------------------------------------------------------------

// The ranges with range r's step offset set to `offset`.
OptimizerRanges WithOffset(const OptimizerRanges& ranges, std::size_t r, std::int64_t offset) {
  std::vector<OptimizerRange> changed(ranges.ranges().begin(), ranges.ranges().end());
  changed[r].step_offset = offset;
  return OptimizerRanges(std::move(changed));
}

struct JoinCase {
  const char* name;
  optex::Optimizer first;   // range 0, there from step 0
  optex::Optimizer second;  // range 1, which joins at step kJoin with a fresh state
};

class LateRange : public ::testing::TestWithParam<JoinCase> {};

constexpr int kJoin = 6;

// A range that joins at step k (its slots zero, step_offset k) is, bit for bit, a fresh
// optimizer of its own on its coordinates started k steps later: Adam's bias correction
// and SGD's first momentum step restart with it (torch.optim's per-parameter `step`),
// while range 0 carries on as if nothing happened.
TEST_P(LateRange, IsAFreshOptimizerStartedThatManyStepsLater) {
  const OptimizerRanges before{{3, GetParam().first}, {2, GetParam().second}};
  const std::size_t d = 5;
  std::vector<float> x = {0.5f, -0.4f, 0.3f, 0.8f, -0.6f};
  OptimizerState s = optex::init_state(before, d);
  std::vector<float> x0(x.begin(), x.begin() + 3);
  OptimizerState s0 = optex::init_state(GetParam().first, 3);
  for (int t = 0; t < kJoin; ++t) {
    const std::vector<float> g = GradientAt(x, t);
    optex::apply_step(before, x, s, g);
    optex::apply_step(GetParam().first, x0, s0, std::span<const float>(g).subspan(0, 3));
  }
  // Range 1 joins: fresh slots on its coordinates, its steps counted from here.
  for (std::vector<float>& slot : s.slots) {
    if (!slot.empty()) std::fill(slot.begin() + 3, slot.end(), 0.0f);
  }
  const OptimizerRanges after = WithOffset(before, 1, s.step);
  std::vector<float> x1(x.begin() + 3, x.end());
  OptimizerState s1 = optex::init_state(GetParam().second, 2);
  for (int t = kJoin; t < kJoin + 8; ++t) {
    const std::vector<float> g = GradientAt(x, t);
    optex::apply_step(after, x, s, g);
    const std::span<const float> gs(g);
    optex::apply_step(GetParam().first, x0, s0, gs.subspan(0, 3));
    optex::apply_step(GetParam().second, x1, s1, gs.subspan(3, 2));
    ASSERT_TRUE(BitEqual(std::span<const float>(x).subspan(0, 3), x0)) << "step " << t;
    ASSERT_TRUE(BitEqual(std::span<const float>(x).subspan(3, 2), x1)) << "step " << t;
    for (std::size_t j = 0; j < s.slots.size(); ++j) {
      if (s.slots[j].empty()) continue;
      const std::span<const float> slot(s.slots[j]);
      ASSERT_TRUE(BitEqual(slot.subspan(0, 3), s0.slots[j])) << "slot " << j;
      ASSERT_TRUE(BitEqual(slot.subspan(3, 2), s1.slots[j])) << "slot " << j;
    }
    EXPECT_EQ(s.step - after[1].step_offset, s1.step);
  }
  // The restart is what made the difference: at offset 0 range 1 sees step kJoin on.
  if (std::holds_alternative<Adam>(GetParam().second)) {
    std::vector<float> y(x.begin(), x.end());
    OptimizerState sy = s;
    std::vector<float> z = y;
    OptimizerState sz = s;
    const std::vector<float> g = GradientAt(x, 99);
    optex::apply_step(after, y, sy, g);
    optex::apply_step(WithOffset(after, 1, 0), z, sz, g);
    EXPECT_FALSE(
        BitEqual(std::span<const float>(y).subspan(3, 2), std::span<const float>(z).subspan(3, 2)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, LateRange,
    ::testing::Values(JoinCase{"adam", Adam{.lr = 0.05}, Adam{.lr = 0.1, .beta1 = 0.8}},
                      JoinCase{"adamw", optex::adamw(0.05, 0.1), optex::adamw(0.1, 0.2)},
                      JoinCase{"sgd_momentum", Sgd{.lr = 0.05, .momentum = 0.9},
                               Sgd{.lr = 0.1, .momentum = 0.8, .nesterov = true}}),
    [](const ::testing::TestParamInfo<JoinCase>& p) { return std::string(p.param.name); });

// SGD without momentum, RMSprop and Lion form no coefficient from the step count, so an
// offset changes nothing, from any state. SGD with momentum does: its first step starts the
// buffer from the gradient, dropping what the buffer held.
TEST(OptimizerRanges, StepOffsetsChangeNothingWhereTheStepCountIsNotUsed) {
  const std::size_t d = 5;
  for (const optex::Optimizer& opt :
       {optex::Optimizer(Sgd{.lr = 0.1, .weight_decay = 0.1}),
        optex::Optimizer(RmsProp{.lr = 0.01}),
        optex::Optimizer(RmsProp{.lr = 0.01, .momentum = 0.9, .centered = true}),
        optex::Optimizer(Lion{.lr = 0.01, .weight_decay = 0.1})}) {
    SCOPED_TRACE(std::string(optex::optimizer_name(opt)));
    const OptimizerRanges plain{{2, opt}, {3, opt}};
    std::vector<float> x = {0.5f, -0.4f, 0.3f, 0.8f, -0.6f};
    OptimizerState s = optex::init_state(plain, d);
    for (int t = 0; t < 4; ++t) optex::apply_step(plain, x, s, GradientAt(x, t));
    std::vector<float> y = x;
    OptimizerState sy = s;
    const OptimizerRanges offset = WithOffset(WithOffset(plain, 0, 1), 1, s.step);
    for (int t = 4; t < 10; ++t) {
      const std::vector<float> g = GradientAt(x, t);
      optex::apply_step(plain, x, s, g);
      optex::apply_step(offset, y, sy, g);
      ASSERT_TRUE(BitEqual(x, y)) << "step " << t;
      ASSERT_EQ(s, sy);
    }
  }
  const OptimizerRanges momentum{{5, Sgd{.lr = 0.1, .momentum = 0.9}}};
  std::vector<float> x = {0.5f, -0.4f, 0.3f, 0.8f, -0.6f};
  OptimizerState s = optex::init_state(momentum, d);
  for (int t = 0; t < 3; ++t) optex::apply_step(momentum, x, s, GradientAt(x, t));
  std::vector<float> y = x;
  OptimizerState sy = s;
  optex::apply_step(momentum, x, s, GradientAt(x, 3));
  optex::apply_step(WithOffset(momentum, 0, s.step - 1), y, sy, GradientAt(y, 3));
  EXPECT_FALSE(BitEqual(x, y));
}

// An offset is the state's step count when the range joined: never negative, and never
// beyond the step of the state a step is given. A refused step writes nothing.
TEST(OptimizerRanges, StepOffsetsOutsideZeroToTheStateStepAreRefused) {
  EXPECT_THAT(RefusalOf([] {
                OptimizerRanges({{2, Adam{}}, {3, Adam{}, -1}});
              }),
              HasSubstr("range 1 has step_offset -1 (must be >= 0"));
  const OptimizerRanges ranges{{2, Adam{}}, {3, Adam{}, 4}};
  EXPECT_EQ(RefusalOf([&] { (void)ranges.for_dimension(5); }), "(accepted)");
  EXPECT_EQ(ranges.for_dimension(5)[1].step_offset, 4);
  EXPECT_THAT(RefusalOf([&] { optex::check_step_offsets(ranges, 3); }),
              HasSubstr("range 1 has step_offset 4, beyond the optimizer state's step 3"));
  EXPECT_EQ(RefusalOf([&] { optex::check_step_offsets(ranges, 4); }), "(accepted)");

  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  const std::vector<float> g = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  OptimizerState s = optex::init_state(ranges, 5);
  s.step = 3;
  s.slots[0][4] = 0.25f;
  const std::vector<float> x_before = x;
  const OptimizerState s_before = s;
  EXPECT_THAT(RefusalOf([&] { optex::apply_step(ranges, x, s, g); }),
              HasSubstr("range 1 has step_offset 4"));
  EXPECT_EQ(x, x_before);
  EXPECT_EQ(s, s_before);
  s.step = 4;
  EXPECT_EQ(RefusalOf([&] { optex::apply_step(ranges, x, s, g); }), "(accepted)");
  EXPECT_EQ(s.step, 5);
}

TEST(OptimizerRanges, ReplacementsKeepCountSizesKindsAndLayouts) {
  const OptimizerRanges current =
      OptimizerRanges({{2, Sgd{}}, {3, Sgd{.momentum = 0.9}}}).for_dimension(5);
  EXPECT_EQ(optex::cannot_replace(
                current, OptimizerRanges({{2, Sgd{.lr = 1.0}}, {3, Sgd{.momentum = 0.1}}})),
            "");
  EXPECT_THAT(optex::cannot_replace(current, Sgd{}), HasSubstr("1 cannot replace 2"));
  EXPECT_THAT(optex::cannot_replace(current, OptimizerRanges({{3, Sgd{}}, {2, Sgd{}}})),
              HasSubstr("range 0 has size 3"));
  EXPECT_THAT(optex::cannot_replace(
                  current, OptimizerRanges({{2, Sgd{.momentum = 0.5}}, {3, Sgd{.momentum = 0.9}}})),
              HasSubstr("range 0: momentum: 0.5 cannot replace 0"));
  EXPECT_THAT(optex::cannot_replace(current, OptimizerRanges({{2, Lion{}}, {3, Lion{}}})),
              HasSubstr("range 0: optimizer: lion cannot replace sgd"));
  // Step offsets are values like the hyperparameters: they may change.
  EXPECT_EQ(optex::cannot_replace(current,
                                  OptimizerRanges({{2, Sgd{}, 7}, {3, Sgd{.momentum = 0.9}, 2}})),
            "");
  // One range: the optimizer's own message, without a range prefix.
  EXPECT_EQ(optex::cannot_replace(OptimizerRanges(Adam{}).for_dimension(5), optex::adamw()),
            "decoupled_weight_decay: AdamW cannot replace Adam (a different algorithm); start a "
            "new engine");
}

}  // namespace
