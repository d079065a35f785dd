// Tests of the base optimizers (optex/optimizers/*.hpp, optex/optimizers/optimizer.hpp): every
// kind's update against an independent double-precision reference written from the PyTorch formulas
// (Lion from its paper), per coordinate and over vectors, the state each keeps, which
// replacements a running engine accepts, the variant's dispatch, names and checkpoint tags,
// and hyperparameter validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_state.hpp"

namespace {

using optex::Adam;
using optex::Lion;
using optex::Optimizer;
using optex::OptimizerState;
using optex::RmsProp;
using optex::Sgd;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kSteps = 8;

// Coordinates of different sizes and signs; zero checks the weight-decay-free path.
const std::vector<double> kStart = {1.25, -0.75, 3.5, -12.0, 0.0, 0.01, 250.0};

// A gradient that depends on x and on the step, so that an error in one step propagates.
double gradient_at(double x, std::size_t i, int t) {
  return 0.3 * static_cast<double>(i + 1) * x + std::cos(static_cast<double>(2 * t + i) + 0.5);
}

double tol(double expected) { return 2e-5 * (1.0 + std::abs(expected)); }

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Test names from the case's name field.
struct CaseName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& p) const {
    return p.param.name;
  }
};

// ---- references: one coordinate, in double, the formulas as the papers and PyTorch write
// them (not as the library arranges them), t the 0-based step ----

struct Reference {
  double x = 0.0;
  double s[3] = {0.0, 0.0, 0.0};
};

// torch.optim.SGD (dampening 0): the buffer starts as the first gradient.
void reference_step(const Sgd& o, Reference& r, double g, int t) {
  double d = g + o.weight_decay * r.x;
  if (o.momentum != 0.0) {
    r.s[0] = t == 0 ? d : o.momentum * r.s[0] + d;
    d = o.nesterov ? d + o.momentum * r.s[0] : r.s[0];
  }
  r.x -= o.lr * d;
}

// torch.optim.Adam / AdamW.
void reference_step(const Adam& o, Reference& r, double g, int t) {
  if (o.decoupled_weight_decay) {
    r.x *= 1.0 - o.lr * o.weight_decay;
  } else {
    g += o.weight_decay * r.x;
  }
  double& m = r.s[0];
  double& v = r.s[1];
  m = o.beta1 * m + (1.0 - o.beta1) * g;
  v = o.beta2 * v + (1.0 - o.beta2) * g * g;
  const double bias1 = 1.0 - std::pow(o.beta1, t + 1);
  const double bias2 = 1.0 - std::pow(o.beta2, t + 1);
  r.x -= o.lr / bias1 * m / (std::sqrt(v) / std::sqrt(bias2) + o.eps);
}

// torch.optim.RMSprop: E[g^2] (and E[g] when centered), momentum on g / (sqrt(var) + eps).
void reference_step(const RmsProp& o, Reference& r, double g, int) {
  g += o.weight_decay * r.x;
  double& square = r.s[0];
  double& buffer = r.s[1];
  double& mean = r.s[2];
  square = o.alpha * square + (1.0 - o.alpha) * g * g;
  double variance = square;
  if (o.centered) {
    mean = o.alpha * mean + (1.0 - o.alpha) * g;
    variance -= mean * mean;
  }
  const double scaled = g / (std::sqrt(variance) + o.eps);
  if (o.momentum > 0.0) {
    buffer = o.momentum * buffer + scaled;
    r.x -= o.lr * buffer;
  } else {
    r.x -= o.lr * scaled;
  }
}

// Lion, Algorithm 2 of Chen et al. (2023): decoupled decay, the sign of the interpolation,
// then the momentum update.
void reference_step(const Lion& o, Reference& r, double g, int) {
  double& m = r.s[0];
  const double c = o.beta1 * m + (1.0 - o.beta1) * g;
  const double sign = c > 0.0 ? 1.0 : (c < 0.0 ? -1.0 : 0.0);
  r.x = r.x * (1.0 - o.lr * o.weight_decay) - o.lr * sign;
  m = o.beta2 * m + (1.0 - o.beta2) * g;
}

struct UpdateCase {
  const char* name;
  Optimizer optimizer;
};

void PrintTo(const UpdateCase& c, std::ostream* os) { *os << c.name; }

// The float update and the double reference see the same gradient (at the float x), so
// only the update's rounding differs; x and every slot the optimizer keeps must agree.
// Lion's sign is exact, so its x agrees to float rounding of x itself.
class UpdateMatchesReference : public ::testing::TestWithParam<UpdateCase> {};

TEST_P(UpdateMatchesReference, PerCoordinateOverSeveralSteps) {
  std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        const optex::StateSlots slots = o.state_slots();
        for (std::size_t i = 0; i < kStart.size(); ++i) {
          Reference ref{kStart[i], {}};
          float x = static_cast<float>(kStart[i]);
          optex::SlotValues s = {0.0f, 0.0f, 0.0f};
          for (int t = 0; t < kSteps; ++t) {
            const double g = gradient_at(static_cast<double>(x), i, t);
            reference_step(o, ref, g, t);
            O::update(x, static_cast<float>(g), s, o.coefficients(t));
            ASSERT_NEAR(x, ref.x, tol(ref.x)) << "coordinate " << i << " step " << t;
            for (int j = 0; j < optex::kMaxStateSlots; ++j) {
              if (!slots.uses(j)) continue;
              ASSERT_NEAR(s[j], ref.s[j], tol(ref.s[j]))
                  << "slot " << j << " coordinate " << i << " step " << t;
            }
          }
        }
      },
      GetParam().optimizer);
}

// apply_step is a loop of the same update: bitwise the scalar result, which is what lets
// the CUDA kernel, built on the same update, match the CPU bit for bit.
TEST_P(UpdateMatchesReference, VectorStepIsTheScalarUpdateBitForBit) {
  std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        const std::size_t d = kStart.size();
        std::vector<float> x(kStart.begin(), kStart.end());
        std::vector<float> scalar_x = x;
        std::vector<std::array<float, 3>> scalar_s(d, {0.0f, 0.0f, 0.0f});
        OptimizerState state = optex::init_state(o, d);
        std::vector<float> g(d);
        for (int t = 0; t < kSteps; ++t) {
          for (std::size_t i = 0; i < d; ++i)
            g[i] = static_cast<float>(gradient_at(static_cast<double>(x[i]), i, t));
          optex::apply_step(o, x, state, g);
          ASSERT_EQ(state.step, t + 1);
          for (std::size_t i = 0; i < d; ++i) {
            optex::SlotValues s = {scalar_s[i][0], scalar_s[i][1], scalar_s[i][2]};
            O::update(scalar_x[i], g[i], s, o.coefficients(t));
            for (int j = 0; j < 3; ++j) scalar_s[i][static_cast<std::size_t>(j)] = s[j];
            ASSERT_EQ(bits(x[i]), bits(scalar_x[i])) << "coordinate " << i << " step " << t;
            for (int j = 0; j < optex::kMaxStateSlots; ++j) {
              const auto slot = static_cast<std::size_t>(j);
              if (state.slots[slot].empty()) continue;
              ASSERT_EQ(bits(state.slots[slot][i]), bits(s[j]))
                  << "slot " << j << " coordinate " << i << " step " << t;
            }
          }
        }
      },
      GetParam().optimizer);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, UpdateMatchesReference,
    ::testing::Values(
        UpdateCase{"sgd", Sgd{.lr = 0.1}},
        UpdateCase{"sgd_weight_decay", Sgd{.lr = 0.05, .weight_decay = 0.01}},
        UpdateCase{"sgd_momentum", Sgd{.lr = 0.05, .momentum = 0.9}},
        UpdateCase{"sgd_nesterov", Sgd{.lr = 0.05, .momentum = 0.9, .nesterov = true}},
        UpdateCase{"sgd_nesterov_weight_decay",
                   Sgd{.lr = 0.02, .momentum = 0.8, .nesterov = true, .weight_decay = 0.05}},
        UpdateCase{"adam", Adam{}}, UpdateCase{"adam_large_lr", Adam{.lr = 0.1}},
        UpdateCase{"adam_other_betas_eps",
                   Adam{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6}},
        UpdateCase{"adam_beta1_above_half", Adam{.lr = 0.05, .beta1 = 0.3}},
        UpdateCase{"adam_l2", Adam{.lr = 0.01, .weight_decay = 0.05}},
        UpdateCase{"adamw", optex::adamw(0.01, 0.05)},
        UpdateCase{"adamw_large_eps", Adam{.lr = 0.1,
                                           .beta1 = 0.5,
                                           .beta2 = 0.9,
                                           .eps = 1e-3,
                                           .weight_decay = 0.2,
                                           .decoupled_weight_decay = true}},
        UpdateCase{"rmsprop", RmsProp{.lr = 0.01}},
        UpdateCase{"rmsprop_weight_decay", RmsProp{.lr = 0.01, .weight_decay = 0.05}},
        UpdateCase{"rmsprop_momentum", RmsProp{.lr = 0.005, .momentum = 0.9}},
        UpdateCase{"rmsprop_centered", RmsProp{.lr = 0.005, .alpha = 0.9, .centered = true}},
        UpdateCase{"rmsprop_centered_momentum", RmsProp{.lr = 0.002,
                                                        .alpha = 0.95,
                                                        .eps = 1e-6,
                                                        .weight_decay = 0.01,
                                                        .momentum = 0.5,
                                                        .centered = true}},
        UpdateCase{"lion", Lion{.lr = 0.01}},
        UpdateCase{"lion_betas", Lion{.lr = 0.02, .beta1 = 0.5, .beta2 = 0.9}},
        UpdateCase{"lion_weight_decay", Lion{.lr = 0.01, .weight_decay = 0.5}},
        // torch.optim's boundary values: a learning rate of 0 (the state still advances),
        // betas, eps and alpha at their ends, momentum at and beyond 1.
        UpdateCase{"sgd_lr_zero_nesterov",
                   Sgd{.lr = 0.0, .momentum = 0.9, .nesterov = true, .weight_decay = 0.05}},
        UpdateCase{"sgd_momentum_one", Sgd{.lr = 0.01, .momentum = 1.0}},
        UpdateCase{"adam_lr_zero", Adam{.lr = 0.0, .weight_decay = 0.05}},
        UpdateCase{"adamw_lr_zero", optex::adamw(0.0, 0.05)},
        UpdateCase{"adam_betas_zero_eps_zero",
                   Adam{.lr = 0.01, .beta1 = 0.0, .beta2 = 0.0, .eps = 0.0}},
        UpdateCase{"adamw_decay_times_lr_above_one", optex::adamw(0.5, 3.0)},
        UpdateCase{"rmsprop_lr_zero_centered_momentum",
                   RmsProp{.lr = 0.0, .weight_decay = 0.01, .momentum = 0.5, .centered = true}},
        UpdateCase{"rmsprop_alpha_zero_eps_zero", RmsProp{.lr = 0.01, .alpha = 0.0, .eps = 0.0}},
        UpdateCase{"rmsprop_alpha_one", RmsProp{.lr = 0.01, .alpha = 1.0, .eps = 0.5}},
        UpdateCase{"lion_lr_zero", Lion{.lr = 0.0, .weight_decay = 0.5}}),
    CaseName{});

// torch.optim's step at lr 0: the parameters do not move, bit for bit, while the state
// advances as at any other learning rate (checked against the reference above).
TEST(LearningRateZero, LeavesEveryCoordinateBitForBitAndAdvancesTheState) {
  const std::vector<Optimizer> kinds = {
      Sgd{.lr = 0.0, .momentum = 0.9, .nesterov = true, .weight_decay = 0.1},
      Adam{.lr = 0.0, .weight_decay = 0.1}, optex::adamw(0.0, 0.1),
      RmsProp{.lr = 0.0, .weight_decay = 0.1, .momentum = 0.9, .centered = true},
      Lion{.lr = 0.0, .weight_decay = 0.1}};
  for (const Optimizer& kind : kinds) {
    std::visit(
        [](const auto& o) {
          const std::size_t d = kStart.size();
          const std::vector<float> x0(kStart.begin(), kStart.end());
          std::vector<float> x = x0;
          OptimizerState state = optex::init_state(o, d);
          std::vector<Reference> ref(d);
          for (std::size_t i = 0; i < d; ++i) ref[i].x = kStart[i];
          std::vector<float> g(d);
          for (int t = 0; t < kSteps; ++t) {
            for (std::size_t i = 0; i < d; ++i) {
              g[i] = static_cast<float>(gradient_at(static_cast<double>(x[i]), i, t));
              reference_step(o, ref[i], static_cast<double>(g[i]), t);
            }
            optex::apply_step(o, x, state, g);
            ASSERT_EQ(state.step, t + 1);
            for (std::size_t i = 0; i < d; ++i) {
              ASSERT_EQ(bits(x[i]), bits(x0[i])) << o.name << " coordinate " << i;
              for (int j = 0; j < optex::kMaxStateSlots; ++j) {
                const auto slot = static_cast<std::size_t>(j);
                if (state.slots[slot].empty()) continue;
                ASSERT_NEAR(state.slots[slot][i], ref[i].s[j], tol(ref[i].s[j]))
                    << o.name << " slot " << j << " coordinate " << i << " step " << t;
              }
            }
          }
          // The state moved: a round at lr 0 is not a no-op for the optimizer.
          bool moved = false;
          for (const auto& slot : state.slots)
            for (float v : slot) moved = moved || v != 0.0f;
          EXPECT_TRUE(moved) << o.name;
        },
        kind);
  }
}

// ---- facts about single kinds ----------------------------------------------------------

// The first momentum step overwrites the buffer with the gradient rather than decaying what
// it held: a buffer that is not zeroed (fresh device memory) must not leak into the update.
TEST(Sgd, FirstMomentumStepIgnoresTheOldBuffer) {
  const Sgd o{.lr = 0.1, .momentum = 0.9};
  float x = 2.0f;
  optex::SlotValues s = {123.0f, 0.0f, 0.0f};
  Sgd::update(x, 0.5f, s, o.coefficients(0));
  EXPECT_EQ(s[0], 0.5f);
  EXPECT_FLOAT_EQ(x, 2.0f - 0.1f * 0.5f);
  // From the second step on, the buffer decays: b = 0.9 * 0.5 + 0.25.
  Sgd::update(x, 0.25f, s, o.coefficients(1));
  EXPECT_FLOAT_EQ(s[0], 0.7f);
  EXPECT_FLOAT_EQ(x, 2.0f - 0.1f * 0.5f - 0.1f * 0.7f);
}

// First step in closed form: m_hat = g, v_hat = g^2, so x moves by lr * g / (|g| + eps).
TEST(Adam, FirstStepIsSignedLearningRate) {
  const Adam o{.lr = 0.01};
  std::vector<float> x = {1.0f, 1.0f, 1.0f};
  const std::vector<float> g = {1e-3f, -4.0f, 250.0f};
  OptimizerState s = optex::init_state(o, 3);
  optex::apply_step(o, x, s, g);
  for (std::size_t i = 0; i < 3; ++i) {
    const double gi = g[i];
    EXPECT_NEAR(x[i], 1.0 - 0.01 * gi / (std::abs(gi) + 1e-8), 1e-6);
  }
}

TEST(Adam, AdamwFactorySetsDecoupledDecay) {
  const Adam w = optex::adamw(3e-3, 0.05);
  EXPECT_TRUE(w.decoupled_weight_decay);
  EXPECT_DOUBLE_EQ(w.lr, 3e-3);
  EXPECT_DOUBLE_EQ(w.weight_decay, 0.05);
  const Adam d = optex::adamw();
  EXPECT_DOUBLE_EQ(d.lr, 1e-3);
  EXPECT_DOUBLE_EQ(d.weight_decay, 1e-2);  // PyTorch's AdamW default
  EXPECT_EQ(Adam::python_classes()[1].defaults, d);
}

// PyTorch forms 1 - beta in double and rounds it once; 1.0f - float(beta) differs in the
// last bits (by about 1.3e-5 relative for beta2 = 0.999), which 100 steps would show.
TEST(Adam, CoefficientsAreFormedInDoubleAsPyTorchDoes) {
  const Adam o{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999};
  const Adam::Coefficients c = o.coefficients(0);
  EXPECT_EQ(c.one_minus_beta2, static_cast<float>(1.0 - 0.999));
  EXPECT_NE(c.one_minus_beta2, 1.0f - static_cast<float>(0.999));
  EXPECT_EQ(c.one_minus_beta1, static_cast<float>(1.0 - 0.9));
  EXPECT_EQ(c.step_size, static_cast<float>(1e-3 / (1.0 - std::pow(0.9, 1.0))));
  EXPECT_EQ(c.bias2_sqrt, static_cast<float>(std::pow(1.0 - std::pow(0.999, 1.0), 0.5)));
}

// With a zero gradient, AdamW only shrinks x by (1 - lr * wd); coupled L2 instead feeds wd * x
// through the moments, a different (normalised) move.
TEST(Adam, DecoupledAndCoupledDecayDiffer) {
  const std::vector<float> zero(2, 0.0f);
  const Adam w = optex::adamw(0.1, 0.5);
  std::vector<float> xw = {2.0f, -4.0f};
  OptimizerState sw = optex::init_state(w, 2);
  optex::apply_step(w, xw, sw, zero);
  EXPECT_FLOAT_EQ(xw[0], 2.0f * 0.95f);
  EXPECT_FLOAT_EQ(xw[1], -4.0f * 0.95f);

  const Adam c{.lr = 0.1, .weight_decay = 0.5};
  std::vector<float> xc = {2.0f, -4.0f};
  OptimizerState sc = optex::init_state(c, 2);
  optex::apply_step(c, xc, sc, zero);
  EXPECT_NEAR(xc[0], 2.0 - 0.1, 1e-6);  // first step moves by lr * sign(wd * x)
  EXPECT_NEAR(xc[1], -4.0 + 0.1, 1e-6);
}

// Every coordinate of a Lion step moves by exactly lr (without decay), whatever the
// gradient's size; a zero interpolation moves nothing.
TEST(Lion, EveryCoordinateMovesByTheLearningRate) {
  const Lion o{.lr = 0.125};
  std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<float> g = {1e-6f, -300.0f, 2.0f, 0.0f};
  OptimizerState s = optex::init_state(o, 4);
  optex::apply_step(o, x, s, g);
  EXPECT_EQ(x, (std::vector<float>{0.875f, 1.125f, 0.875f, 1.0f}));
  EXPECT_FLOAT_EQ(s.slots[0][1], -300.0f * 0.01f);  // m = (1 - beta2) g
}

// Without momentum and centering RMSprop keeps one buffer, E[g^2]; its first step is
// lr * g / (sqrt(1 - alpha) |g| + eps).
TEST(RmsProp, FirstStepInClosedForm) {
  const RmsProp o{.lr = 0.01, .alpha = 0.99};
  std::vector<float> x = {1.0f, -1.0f};
  const std::vector<float> g = {2.0f, -0.5f};
  OptimizerState s = optex::init_state(o, 2);
  optex::apply_step(o, x, s, g);
  for (std::size_t i = 0; i < 2; ++i) {
    const double gi = g[i];
    const double expected = (i == 0 ? 1.0 : -1.0) - 0.01 * gi / (std::sqrt(0.01) * std::abs(gi));
    EXPECT_NEAR(x[i], expected, 1e-6);
  }
}

// ---- state layouts ----------------------------------------------------------------------

struct LayoutCase {
  const char* name;
  Optimizer optimizer;
  std::vector<int> slots;  // the slots init_state allocates
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class StateLayout : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(StateLayout, InitStateAllocatesExactlyTheSlotsInUse) {
  const LayoutCase& c = GetParam();
  const OptimizerState s = optex::init_state(c.optimizer, 5);
  EXPECT_EQ(s.step, 0);
  const std::set<int> expected(c.slots.begin(), c.slots.end());
  for (int j = 0; j < optex::kMaxStateSlots; ++j) {
    const auto& slot = s.slots[static_cast<std::size_t>(j)];
    if (expected.count(j) != 0) {
      EXPECT_EQ(slot, std::vector<float>(5, 0.0f)) << "slot " << j;
    } else {
      EXPECT_TRUE(slot.empty()) << "slot " << j;
    }
  }
  EXPECT_EQ(s.used(), optex::state_slots(c.optimizer));
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, StateLayout,
    ::testing::Values(
        LayoutCase{"sgd", Sgd{}, {}}, LayoutCase{"sgd_momentum", Sgd{.momentum = 0.5}, {0}},
        LayoutCase{"adam", Adam{}, {0, 1}}, LayoutCase{"adamw", optex::adamw(), {0, 1}},
        LayoutCase{"rmsprop", RmsProp{}, {0}},
        LayoutCase{"rmsprop_momentum", RmsProp{.momentum = 0.9}, {0, 1}},
        LayoutCase{"rmsprop_centered", RmsProp{.centered = true}, {0, 2}},
        LayoutCase{"rmsprop_both", RmsProp{.momentum = 0.9, .centered = true}, {0, 1, 2}},
        LayoutCase{"lion", Lion{}, {0}}),
    CaseName{});

// A state of the wrong shape is refused before anything is written.
TEST(ApplyStep, RefusesAStateOfAnotherLayout) {
  std::vector<float> x = {1.0f, 2.0f};
  const std::vector<float> g = {0.5f, 0.5f};
  OptimizerState s = optex::init_state(Sgd{}, 2);  // no buffer
  EXPECT_THROW(optex::apply_step(Adam{}, x, s, g), std::invalid_argument);
  EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(s.step, 0);
  OptimizerState a = optex::init_state(Adam{}, 3);  // another dimension
  EXPECT_THROW(optex::apply_step(Adam{}, x, a, g), std::invalid_argument);
}

// ---- replacements in a running engine ---------------------------------------------------

struct ReplacementCase {
  const char* name;
  Optimizer current;
  Optimizer next;
  const char* refusal;  // nullptr: accepted; otherwise a substring of the reason
};

void PrintTo(const ReplacementCase& c, std::ostream* os) { *os << c.name; }

class Replacement : public ::testing::TestWithParam<ReplacementCase> {};

TEST_P(Replacement, KeepsTheStateLayoutAndTheAlgorithm) {
  const ReplacementCase& c = GetParam();
  const std::string why = optex::cannot_replace(c.current, c.next);
  if (c.refusal == nullptr) {
    EXPECT_EQ(why, "");
  } else {
    EXPECT_THAT(why, HasSubstr(c.refusal));
    EXPECT_THAT(why, HasSubstr("start a new engine"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, Replacement,
    ::testing::Values(
        ReplacementCase{"sgd_lr", Sgd{.lr = 0.1}, Sgd{.lr = 0.01}, nullptr},
        ReplacementCase{"sgd_momentum_value", Sgd{.momentum = 0.9}, Sgd{.momentum = 0.5}, nullptr},
        ReplacementCase{"sgd_momentum_on", Sgd{}, Sgd{.momentum = 0.5}, "momentum"},
        ReplacementCase{"sgd_momentum_off", Sgd{.momentum = 0.5}, Sgd{}, "momentum"},
        ReplacementCase{"adam_betas", Adam{}, Adam{.beta1 = 0.5, .beta2 = 0.9}, nullptr},
        ReplacementCase{"adam_to_adamw", Adam{}, optex::adamw(), "AdamW cannot replace Adam"},
        ReplacementCase{"adamw_to_adam", optex::adamw(), Adam{}, "Adam cannot replace AdamW"},
        ReplacementCase{"rmsprop_alpha", RmsProp{}, RmsProp{.alpha = 0.9}, nullptr},
        ReplacementCase{"rmsprop_momentum_on", RmsProp{}, RmsProp{.momentum = 0.9}, "momentum"},
        ReplacementCase{"rmsprop_centered_on", RmsProp{}, RmsProp{.centered = true}, "centered"},
        ReplacementCase{"lion_betas", Lion{}, Lion{.beta1 = 0.5, .weight_decay = 0.1}, nullptr},
        ReplacementCase{"kind", Adam{}, Lion{}, "lion cannot replace adam"},
        ReplacementCase{"kind_rmsprop", Sgd{}, RmsProp{}, "rmsprop cannot replace sgd"}),
    CaseName{});

// ---- the variant ------------------------------------------------------------------------

TEST(Optimizer, EveryKindHasANameATagAndPythonClasses) {
  std::set<std::string> names;
  std::set<int> tags;
  int kinds = 0;
  optex::for_each_optimizer_kind([&](auto kind) {
    using O = typename decltype(kind)::type;
    ++kinds;
    names.insert(std::string(O::name));
    tags.insert(O::checkpoint_tag);
    EXPECT_FALSE(O::python_classes().empty()) << O::name;
    for (const auto& cls : O::python_classes()) EXPECT_NO_THROW(cls.defaults.validate());
  });
  EXPECT_EQ(kinds, 4);
  EXPECT_EQ(names, (std::set<std::string>{"sgd", "adam", "rmsprop", "lion"}));
  EXPECT_EQ(tags, (std::set<int>{0, 1, 2, 3}));  // stored in checkpoints: never renumbered
}

TEST(Optimizer, NamesGiveEachPythonClassWithItsDefaults) {
  EXPECT_EQ(optex::optimizer_names(), "sgd, adam, adamw, rmsprop, lion");
  EXPECT_EQ(optex::optimizer_from_name("sgd"), Optimizer(Sgd{}));
  EXPECT_EQ(optex::optimizer_from_name("adam"), Optimizer(Adam{}));
  EXPECT_EQ(optex::optimizer_from_name("adamw"), Optimizer(optex::adamw()));
  EXPECT_EQ(optex::optimizer_from_name("rmsprop"), Optimizer(RmsProp{}));
  EXPECT_EQ(optex::optimizer_from_name("lion"), Optimizer(Lion{}));
  for (const char* bad : {"", "Adam", "adagrad", "sgd "}) {
    try {
      (void)optex::optimizer_from_name(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("optimizer"), HasSubstr("adamw, rmsprop, lion")));
    }
  }
}

TEST(Optimizer, VariantDispatchesToTheAlternative) {
  const std::vector<float> g = {1.0f, -2.0f, 0.5f};
  for (const Optimizer& opt :
       {Optimizer(Sgd{.lr = 0.1, .momentum = 0.9}), Optimizer(Adam{.lr = 0.01}),
        Optimizer(RmsProp{.momentum = 0.5}), Optimizer(Lion{.lr = 0.01})}) {
    std::vector<float> via_variant = {0.1f, 0.2f, 0.3f};
    std::vector<float> direct = via_variant;
    OptimizerState sv = optex::init_state(opt, 3);
    OptimizerState sd = sv;
    for (int t = 0; t < 3; ++t) {
      optex::apply_step(opt, via_variant, sv, g);
      std::visit([&](const auto& o) { optex::apply_step(o, direct, sd, g); }, opt);
    }
    EXPECT_EQ(via_variant, direct) << optex::optimizer_name(opt);
    EXPECT_EQ(sv, sd);
    EXPECT_NE(via_variant, (std::vector<float>{0.1f, 0.2f, 0.3f}));
  }
}

// ---- validation -------------------------------------------------------------------------

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct BadCase {
  const char* name;
  Optimizer optimizer;
  const char* parameter;  // must appear in what()
  const char* value;      // must appear in what()
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class RejectsBadHyperparameter : public ::testing::TestWithParam<BadCase> {};

TEST_P(RejectsBadHyperparameter, WithInvalidArgumentNamingIt) {
  const BadCase& c = GetParam();
  try {
    optex::validate(c.optimizer);
    FAIL() << "validate() accepted " << c.parameter << " = " << c.value;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(c.parameter), HasSubstr(c.value)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sgd, RejectsBadHyperparameter,
    ::testing::Values(BadCase{"lr_negative", Sgd{.lr = -0.25}, "lr", "-0.25"},
                      BadCase{"lr_negative_zero_point", Sgd{.lr = -1e-300}, "lr", "-1e-300"},
                      BadCase{"lr_nan", Sgd{.lr = kNan}, "lr", "nan"},
                      BadCase{"lr_inf", Sgd{.lr = kInf}, "lr", "inf"},
                      BadCase{"lr_beyond_float32", Sgd{.lr = 1e39}, "lr", "1e+39"},
                      BadCase{"momentum_inf", Sgd{.momentum = kInf}, "momentum", "inf"},
                      BadCase{"momentum_negative", Sgd{.momentum = -0.1}, "momentum", "-0.1"},
                      BadCase{"momentum_nan", Sgd{.momentum = kNan}, "momentum", "nan"},
                      BadCase{"weight_decay_negative", Sgd{.weight_decay = -0.5}, "weight_decay",
                              "-0.5"},
                      BadCase{"weight_decay_inf", Sgd{.weight_decay = kInf}, "weight_decay", "inf"},
                      BadCase{"nesterov_without_momentum", Sgd{.nesterov = true}, "nesterov", "0"}),
    CaseName{});

INSTANTIATE_TEST_SUITE_P(
    Adam, RejectsBadHyperparameter,
    ::testing::Values(
        BadCase{"lr_negative", Adam{.lr = -0.25}, "lr", "-0.25"},
        BadCase{"lr_nan", Adam{.lr = kNan}, "lr", "nan"},
        BadCase{"lr_inf", Adam{.lr = kInf}, "lr", "inf"},
        BadCase{"beta1_one", Adam{.beta1 = 1.0}, "beta1", "1"},
        BadCase{"beta1_above_one", Adam{.beta1 = 1.5}, "beta1", "1.5"},
        BadCase{"beta1_negative", Adam{.beta1 = -0.1}, "beta1", "-0.1"},
        BadCase{"beta2_one", Adam{.beta2 = 1.0}, "beta2", "1"},
        BadCase{"beta2_above_one", Adam{.beta2 = 2.5}, "beta2", "2.5"},
        BadCase{"eps_nan", Adam{.eps = kNan}, "eps", "nan"},
        BadCase{"eps_negative", Adam{.eps = -0.001}, "eps", "-0.001"},
        BadCase{"weight_decay_negative", Adam{.weight_decay = -0.5}, "weight_decay", "-0.5"},
        BadCase{"adamw_weight_decay_negative", optex::adamw(1e-3, -0.75), "weight_decay", "-0.75"},
        BadCase{"adamw_lr_negative", optex::adamw(-1.0, 0.0), "lr", "-1"}),
    CaseName{});

INSTANTIATE_TEST_SUITE_P(
    RmsProp, RejectsBadHyperparameter,
    ::testing::Values(BadCase{"lr_negative", RmsProp{.lr = -1.0}, "lr", "-1"},
                      BadCase{"lr_nan", RmsProp{.lr = kNan}, "lr", "nan"},
                      BadCase{"alpha_negative", RmsProp{.alpha = -0.5}, "alpha", "-0.5"},
                      BadCase{"alpha_inf", RmsProp{.alpha = kInf}, "alpha", "inf"},
                      BadCase{"eps_negative", RmsProp{.eps = -1e-8}, "eps", "-1e-08"},
                      BadCase{"eps_inf", RmsProp{.eps = kInf}, "eps", "inf"},
                      BadCase{"weight_decay_negative", RmsProp{.weight_decay = -1.0},
                              "weight_decay", "-1"},
                      BadCase{"momentum_negative", RmsProp{.momentum = -0.5}, "momentum", "-0.5"},
                      BadCase{"momentum_nan", RmsProp{.momentum = kNan}, "momentum", "nan"}),
    CaseName{});

INSTANTIATE_TEST_SUITE_P(
    Lion, RejectsBadHyperparameter,
    ::testing::Values(BadCase{"lr_negative", Lion{.lr = -0.5}, "lr", "-0.5"},
                      BadCase{"lr_inf", Lion{.lr = kInf}, "lr", "inf"},
                      BadCase{"beta1_one", Lion{.beta1 = 1.0}, "beta1", "1"},
                      BadCase{"beta2_negative", Lion{.beta2 = -0.25}, "beta2", "-0.25"},
                      BadCase{"beta2_nan", Lion{.beta2 = kNan}, "beta2", "nan"},
                      BadCase{"weight_decay_negative", Lion{.weight_decay = -0.5}, "weight_decay",
                              "-0.5"}),
    CaseName{});

// torch.optim's own bounds (torch/optim/{sgd,adam,rmsprop}.py): lr, eps, weight_decay,
// momentum and RMSprop's alpha >= 0 with no upper bound, Adam's betas in [0, 1), nesterov
// with momentum > 0; every one of these values is accepted there and here. Lion (not in
// torch.optim) takes AdamW's bounds.
TEST(Validate, AcceptsTorchOptimsBoundaryValues) {
  EXPECT_NO_THROW((Sgd{.lr = 0.0}.validate()));
  EXPECT_NO_THROW((Sgd{.lr = 0.0, .momentum = 0.9, .nesterov = true}.validate()));
  EXPECT_NO_THROW((Sgd{.lr = 0.1, .momentum = 1.0}.validate()));
  EXPECT_NO_THROW((Sgd{.lr = 0.1, .momentum = 2.5, .nesterov = true}.validate()));
  EXPECT_NO_THROW((Sgd{.lr = 3.4e38, .weight_decay = 0.0}.validate()));
  EXPECT_NO_THROW((Adam{.lr = 0.0}.validate()));
  EXPECT_NO_THROW((Adam{.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .eps = 0.0}.validate()));
  EXPECT_NO_THROW((Adam{.beta1 = std::nextafter(1.0, 0.0)}.validate()));
  EXPECT_NO_THROW(optex::adamw(0.0, 0.0).validate());
  EXPECT_NO_THROW(optex::adamw(0.5, 4.0).validate());  // torch.optim.AdamW has no lr * wd bound
  EXPECT_NO_THROW((RmsProp{.lr = 0.0, .alpha = 0.0, .eps = 0.0}.validate()));
  EXPECT_NO_THROW((RmsProp{.alpha = 1.0, .momentum = 1.0}.validate()));
  EXPECT_NO_THROW((RmsProp{.alpha = 1.5, .momentum = 3.0, .centered = true}.validate()));
  EXPECT_NO_THROW((Lion{.lr = 0.0}.validate()));
  EXPECT_NO_THROW((Lion{.lr = 0.5, .weight_decay = 3.0}.validate()));
}

TEST(Validate, AcceptsGoodHyperparameters) {
  EXPECT_NO_THROW(Sgd{}.validate());
  EXPECT_NO_THROW((Sgd{.lr = 1.0, .momentum = 0.0, .weight_decay = 0.0}.validate()));
  EXPECT_NO_THROW((Sgd{.lr = 0.1, .momentum = 0.99, .nesterov = true}.validate()));
  EXPECT_NO_THROW(Adam{}.validate());
  EXPECT_NO_THROW((Adam{.beta1 = 0.0, .beta2 = 0.0, .weight_decay = 1.0}.validate()));
  EXPECT_NO_THROW(optex::adamw().validate());
  EXPECT_NO_THROW(RmsProp{}.validate());
  EXPECT_NO_THROW((RmsProp{.alpha = 0.0, .momentum = 0.99, .centered = true}.validate()));
  EXPECT_NO_THROW(Lion{}.validate());
  EXPECT_NO_THROW((Lion{.lr = 0.5, .beta1 = 0.0, .beta2 = 0.0, .weight_decay = 1.5}.validate()));
}

}  // namespace
