// OptimizerRanges (optex/optimizer_ranges.hpp): the shape rules of per-range
// hyperparameters, their state layout, that a ranged step is each range's own step on its
// slice (bit for bit), and what a running engine may replace them with.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_equality.hpp"
#include "optex/optimizer_ranges.hpp"

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
              HasSubstr("range 1: lr: must be finite and > 0, got nan"));
  EXPECT_EQ(RefusalOf([] { (void)OptimizerRanges(Sgd{.lr = -1.0}).for_dimension(5); }),
            "lr: must be finite and > 0, got -1");
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
  // One range: the optimizer's own message, without a range prefix.
  EXPECT_EQ(optex::cannot_replace(OptimizerRanges(Adam{}).for_dimension(5), optex::adamw()),
            "decoupled_weight_decay: AdamW cannot replace Adam (a different algorithm); start a "
            "new engine");
}

}  // namespace
