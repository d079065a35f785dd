// Tests of the base optimizers (optex/sgd.hpp, optex/adam.hpp, optex/optimizer.hpp): each
// update against an independent double-precision reference written from the PyTorch formulas,
// the state they keep, and hyperparameter validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "optex/adam.hpp"
#include "optex/optimizer.hpp"
#include "optex/optimizer_state.hpp"
#include "optex/sgd.hpp"

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr std::size_t kDim = 7;
constexpr int kSteps = 6;

// A gradient that depends on x and on the step, so that every step matters and an error in
// one step propagates into the next.
double gradient_at(double x, std::size_t i, int t) {
  return 0.5 * static_cast<double>(i + 1) * x + std::sin(static_cast<double>(t + 3 * i) + 0.25);
}

std::vector<double> start_point() {
  std::vector<double> x(kDim);
  for (std::size_t i = 0; i < kDim; ++i) x[i] = 1.5 - 0.4 * static_cast<double>(i);
  return x;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Float tolerance for a double reference value.
double tol(double expected) { return 2e-5 * (1.0 + std::abs(expected)); }

// PyTorch torch.optim.SGD (dampening 0), in double.
struct ReferenceSgd {
  explicit ReferenceSgd(const optex::Sgd& o)
      : lr(o.lr), momentum(o.momentum), weight_decay(o.weight_decay), nesterov(o.nesterov) {}

  double lr, momentum, weight_decay;
  bool nesterov;
  std::vector<double> buf;
  int t = 0;

  void step(std::vector<double>& x, const std::vector<double>& g) {
    if (buf.empty()) buf.assign(x.size(), 0.0);
    for (std::size_t i = 0; i < x.size(); ++i) {
      double d = g[i] + weight_decay * x[i];
      if (momentum != 0.0) {
        buf[i] = t == 0 ? d : momentum * buf[i] + d;  // buffer starts at the first gradient
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      x[i] -= lr * d;
    }
    ++t;
  }
};

// PyTorch torch.optim.Adam / AdamW, in double.
struct ReferenceAdam {
  explicit ReferenceAdam(const optex::Adam& o)
      : lr(o.lr),
        beta1(o.beta1),
        beta2(o.beta2),
        eps(o.eps),
        weight_decay(o.weight_decay),
        decoupled(o.decoupled_weight_decay) {}

  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  std::vector<double> m, v;
  int t = 0;

  void step(std::vector<double>& x, const std::vector<double>& g_in) {
    if (m.empty()) {
      m.assign(x.size(), 0.0);
      v.assign(x.size(), 0.0);
    }
    ++t;
    const double bc1 = 1.0 - std::pow(beta1, t);
    const double bc2 = 1.0 - std::pow(beta2, t);
    for (std::size_t i = 0; i < x.size(); ++i) {
      double g = g_in[i];
      if (decoupled) {
        x[i] *= 1.0 - lr * weight_decay;
      } else {
        g += weight_decay * x[i];
      }
      m[i] = beta1 * m[i] + (1.0 - beta1) * g;
      v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
      const double m_hat = m[i] / bc1;
      const double v_hat = v[i] / bc2;
      x[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

// Runs the library optimizer and the reference side by side, comparing x after every step.
template <class Opt, class Ref>
void expect_matches_reference(const Opt& opt, Ref ref) {
  std::vector<double> xr = start_point();
  std::vector<float> x = to_float(xr);
  optex::OptimizerState s = opt.init(kDim);
  for (int t = 0; t < kSteps; ++t) {
    std::vector<double> gr(kDim);
    std::vector<float> g(kDim);
    for (std::size_t i = 0; i < kDim; ++i) {
      gr[i] = gradient_at(xr[i], i, t);
      g[i] = static_cast<float>(gradient_at(static_cast<double>(x[i]), i, t));
    }
    ref.step(xr, gr);
    opt.step(std::span<float>(x), s, std::span<const float>(g));
    ASSERT_EQ(s.step, t + 1);
    for (std::size_t i = 0; i < kDim; ++i) {
      ASSERT_NEAR(x[i], xr[i], tol(xr[i])) << "step " << t << " coordinate " << i;
    }
  }
}

// Names parameterised cases after their `name` field.
struct CaseName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& p) const {
    return p.param.name;
  }
};

// ---- SGD ------------------------------------------------------------------------

struct SgdCase {
  const char* name;
  optex::Sgd sgd;
};

class SgdMatchesPyTorch : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdMatchesPyTorch, OverSeveralSteps) {
  const optex::Sgd& o = GetParam().sgd;
  expect_matches_reference(o, ReferenceSgd(o));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, SgdMatchesPyTorch,
    ::testing::Values(
        SgdCase{"plain", optex::Sgd{.lr = 0.1}},
        SgdCase{"momentum", optex::Sgd{.lr = 0.05, .momentum = 0.9}},
        SgdCase{"nesterov", optex::Sgd{.lr = 0.05, .momentum = 0.8, .nesterov = true}},
        SgdCase{"weight_decay", optex::Sgd{.lr = 0.1, .weight_decay = 0.3}},
        SgdCase{"momentum_weight_decay",
                optex::Sgd{.lr = 0.05, .momentum = 0.7, .weight_decay = 0.2}},
        SgdCase{"nesterov_weight_decay",
                optex::Sgd{.lr = 0.03, .momentum = 0.6, .nesterov = true, .weight_decay = 0.1}}),
    CaseName{});

// PyTorch starts the buffer at the first gradient: the first momentum step equals a plain
// step (not lr * (1 - momentum) * g, which a zero-initialised EMA would give).
TEST(Sgd, FirstMomentumStepEqualsPlainStep) {
  const optex::Sgd plain{.lr = 0.1};
  const optex::Sgd heavy{.lr = 0.1, .momentum = 0.9};
  std::vector<float> a = {1.0f, -2.0f, 3.0f};
  std::vector<float> b = a;
  const std::vector<float> g = {0.5f, 0.25f, -1.0f};
  optex::OptimizerState sa = plain.init(3);
  optex::OptimizerState sb = heavy.init(3);
  plain.step(a, sa, g);
  heavy.step(b, sb, g);
  EXPECT_EQ(a, b);
  EXPECT_EQ(sb.first_moment, g);
  // Second step: buffer = 0.9 * g + g.
  heavy.step(b, sb, g);
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(sb.first_moment[i], 1.9f * g[i]);
}

TEST(Sgd, InitShapesAndStepCounter) {
  const optex::Sgd plain{.lr = 0.1};
  optex::OptimizerState s = plain.init(5);
  EXPECT_TRUE(s.first_moment.empty());  // no buffer without momentum
  EXPECT_TRUE(s.second_moment.empty());
  EXPECT_EQ(s.step, 0);
  std::vector<float> x(5, 1.0f);
  const std::vector<float> g(5, 1.0f);
  for (int i = 0; i < 3; ++i) plain.step(x, s, g);
  EXPECT_EQ(s.step, 3);

  const optex::Sgd heavy{.lr = 0.1, .momentum = 0.5};
  optex::OptimizerState sm = heavy.init(5);
  EXPECT_EQ(sm.first_moment, std::vector<float>(5, 0.0f));
  EXPECT_TRUE(sm.second_moment.empty());
  EXPECT_EQ(sm.step, 0);
  heavy.step(x, sm, g);
  heavy.step(x, sm, g);
  EXPECT_EQ(sm.step, 2);
}

// ---- Adam -----------------------------------------------------------------------

struct AdamCase {
  const char* name;
  optex::Adam adam;
};

class AdamMatchesPyTorch : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamMatchesPyTorch, OverSeveralSteps) {
  const optex::Adam& o = GetParam().adam;
  ReferenceAdam ref(o);
  std::vector<double> xr = start_point();
  std::vector<float> x = to_float(xr);
  optex::OptimizerState s = o.init(kDim);
  for (int t = 0; t < kSteps; ++t) {
    std::vector<double> gr(kDim);
    std::vector<float> g(kDim);
    for (std::size_t i = 0; i < kDim; ++i) {
      gr[i] = gradient_at(xr[i], i, t);
      g[i] = static_cast<float>(gradient_at(static_cast<double>(x[i]), i, t));
    }
    ref.step(xr, gr);
    o.step(x, s, g);
    ASSERT_EQ(s.step, t + 1);
    for (std::size_t i = 0; i < kDim; ++i) {
      ASSERT_NEAR(x[i], xr[i], tol(xr[i])) << "step " << t << " coordinate " << i;
      ASSERT_NEAR(s.first_moment[i], ref.m[i], tol(ref.m[i])) << "m, step " << t;
      ASSERT_NEAR(s.second_moment[i], ref.v[i], tol(ref.v[i])) << "v, step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, AdamMatchesPyTorch,
    ::testing::Values(AdamCase{"plain", optex::Adam{.lr = 0.05}},
                      AdamCase{"betas", optex::Adam{.lr = 0.02, .beta1 = 0.5, .beta2 = 0.9}},
                      AdamCase{"large_eps", optex::Adam{.lr = 0.05, .eps = 0.1}},
                      AdamCase{"coupled_l2", optex::Adam{.lr = 0.05, .weight_decay = 0.3}},
                      AdamCase{"adamw", optex::adamw(0.05, 0.3)},
                      AdamCase{"adamw_defaults", optex::adamw()}),
    CaseName{});

// First step in closed form: m_hat = g, v_hat = g^2, so x moves by lr * g / (|g| + eps).
TEST(Adam, FirstStepIsSignedLearningRate) {
  const optex::Adam o{.lr = 0.01};
  std::vector<float> x = {1.0f, 1.0f, 1.0f};
  const std::vector<float> g = {1e-3f, -4.0f, 250.0f};
  optex::OptimizerState s = o.init(3);
  o.step(x, s, g);
  for (std::size_t i = 0; i < 3; ++i) {
    const double gi = g[i];
    EXPECT_NEAR(x[i], 1.0 - 0.01 * gi / (std::abs(gi) + 1e-8), 1e-6);
  }
}

TEST(Adam, AdamwFactorySetsDecoupledDecay) {
  const optex::Adam w = optex::adamw(3e-3, 0.05);
  EXPECT_TRUE(w.decoupled_weight_decay);
  EXPECT_DOUBLE_EQ(w.lr, 3e-3);
  EXPECT_DOUBLE_EQ(w.weight_decay, 0.05);
  const optex::Adam d = optex::adamw();
  EXPECT_DOUBLE_EQ(d.lr, 1e-3);
  EXPECT_DOUBLE_EQ(d.weight_decay, 1e-2);  // PyTorch's AdamW default
}

// With a zero gradient, AdamW only shrinks x by (1 - lr * wd); coupled L2 instead feeds wd * x
// through the moments, a different (normalised) move.
TEST(Adam, DecoupledAndCoupledDecayDiffer) {
  const std::vector<float> zero(2, 0.0f);
  const optex::Adam w = optex::adamw(0.1, 0.5);
  std::vector<float> xw = {2.0f, -4.0f};
  optex::OptimizerState sw = w.init(2);
  w.step(xw, sw, zero);
  EXPECT_FLOAT_EQ(xw[0], 2.0f * 0.95f);
  EXPECT_FLOAT_EQ(xw[1], -4.0f * 0.95f);

  const optex::Adam c{.lr = 0.1, .weight_decay = 0.5};
  std::vector<float> xc = {2.0f, -4.0f};
  optex::OptimizerState sc = c.init(2);
  c.step(xc, sc, zero);
  EXPECT_NEAR(xc[0], 2.0 - 0.1, 1e-6);  // first step moves by lr * sign(wd * x)
  EXPECT_NEAR(xc[1], -4.0 + 0.1, 1e-6);
}

TEST(Adam, InitShapesAndStepCounter) {
  const optex::Adam o{};
  optex::OptimizerState s = o.init(4);
  EXPECT_EQ(s.first_moment, std::vector<float>(4, 0.0f));
  EXPECT_EQ(s.second_moment, std::vector<float>(4, 0.0f));
  EXPECT_EQ(s.step, 0);
  std::vector<float> x(4, 1.0f);
  const std::vector<float> g(4, 0.5f);
  for (int i = 0; i < 4; ++i) o.step(x, s, g);
  EXPECT_EQ(s.step, 4);
}

// ---- the variant ------------------------------------------------------------------

TEST(Optimizer, VariantDispatchesToTheAlternative) {
  const optex::Optimizer sgd = optex::Sgd{.lr = 0.1, .momentum = 0.9};
  const optex::Optimizer adam = optex::Adam{.lr = 0.01};
  EXPECT_EQ(optex::optimizer_name(sgd), "sgd");
  EXPECT_EQ(optex::optimizer_name(adam), "adam");
  EXPECT_EQ(optex::init_state(sgd, 3).first_moment.size(), 3u);
  EXPECT_EQ(optex::init_state(adam, 3).second_moment.size(), 3u);

  const std::vector<float> g = {1.0f, -2.0f, 0.5f};
  for (const optex::Optimizer& opt : {sgd, adam}) {
    std::vector<float> via_variant = {0.1f, 0.2f, 0.3f};
    std::vector<float> direct = via_variant;
    optex::OptimizerState sv = optex::init_state(opt, 3);
    optex::OptimizerState sd = sv;
    for (int t = 0; t < 3; ++t) {
      optex::apply_step(opt, via_variant, sv, g);
      std::visit([&](const auto& o) { o.step(direct, sd, g); }, opt);
    }
    EXPECT_EQ(via_variant, direct);
    EXPECT_EQ(sv, sd);
  }
}

// ---- validation -------------------------------------------------------------------

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct BadCase {
  const char* name;
  std::function<void()> validate;
  const char* parameter;  // must appear in what()
  const char* value;      // must appear in what()
};

class RejectsBadHyperparameter : public ::testing::TestWithParam<BadCase> {};

TEST_P(RejectsBadHyperparameter, WithInvalidArgumentNamingIt) {
  const BadCase& c = GetParam();
  try {
    c.validate();
    FAIL() << "validate() accepted " << c.parameter << " = " << c.value;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(c.parameter), HasSubstr(c.value)));
  }
}

// Also through the variant, which the engine uses.
template <class Opt>
std::function<void()> check(Opt o) {
  return [o] { optex::validate(optex::Optimizer(o)); };
}

INSTANTIATE_TEST_SUITE_P(
    Sgd, RejectsBadHyperparameter,
    ::testing::Values(
        BadCase{"lr_zero", check(optex::Sgd{.lr = 0.0}), "lr", "0"},
        BadCase{"lr_negative", check(optex::Sgd{.lr = -0.25}), "lr", "-0.25"},
        BadCase{"lr_nan", check(optex::Sgd{.lr = kNan}), "lr", "nan"},
        BadCase{"lr_inf", check(optex::Sgd{.lr = kInf}), "lr", "inf"},
        BadCase{"momentum_one", check(optex::Sgd{.momentum = 1.0}), "momentum", "1"},
        BadCase{"momentum_negative", check(optex::Sgd{.momentum = -0.1}), "momentum", "-0.1"},
        BadCase{"momentum_nan", check(optex::Sgd{.momentum = kNan}), "momentum", "nan"},
        BadCase{"weight_decay_negative", check(optex::Sgd{.weight_decay = -0.5}), "weight_decay",
                "-0.5"},
        BadCase{"weight_decay_inf", check(optex::Sgd{.weight_decay = kInf}), "weight_decay", "inf"},
        BadCase{"nesterov_without_momentum", check(optex::Sgd{.nesterov = true}), "nesterov", "0"}),
    CaseName{});

INSTANTIATE_TEST_SUITE_P(
    Adam, RejectsBadHyperparameter,
    ::testing::Values(BadCase{"lr_zero", check(optex::Adam{.lr = 0.0}), "lr", "0"},
                      BadCase{"lr_negative", check(optex::Adam{.lr = -0.25}), "lr", "-0.25"},
                      BadCase{"lr_nan", check(optex::Adam{.lr = kNan}), "lr", "nan"},
                      BadCase{"lr_inf", check(optex::Adam{.lr = kInf}), "lr", "inf"},
                      BadCase{"beta1_one", check(optex::Adam{.beta1 = 1.0}), "beta1", "1"},
                      BadCase{"beta1_above_one", check(optex::Adam{.beta1 = 1.5}), "beta1", "1.5"},
                      BadCase{"beta1_negative", check(optex::Adam{.beta1 = -0.1}), "beta1", "-0.1"},
                      BadCase{"beta2_one", check(optex::Adam{.beta2 = 1.0}), "beta2", "1"},
                      BadCase{"beta2_above_one", check(optex::Adam{.beta2 = 2.5}), "beta2", "2.5"},
                      BadCase{"eps_zero", check(optex::Adam{.eps = 0.0}), "eps", "0"},
                      BadCase{"eps_negative", check(optex::Adam{.eps = -0.001}), "eps", "-0.001"},
                      BadCase{"weight_decay_negative", check(optex::Adam{.weight_decay = -0.5}),
                              "weight_decay", "-0.5"},
                      BadCase{"adamw_weight_decay_negative", check(optex::adamw(1e-3, -0.75)),
                              "weight_decay", "-0.75"},
                      // (1 - lr * wd) <= 0 would flip or zero x every step.
                      BadCase{"adamw_decay_too_strong", check(optex::adamw(0.5, 4.0)),
                              "weight_decay", "4"}),
    CaseName{});

TEST(Validate, AcceptsGoodHyperparameters) {
  EXPECT_NO_THROW(optex::Sgd{}.validate());
  EXPECT_NO_THROW((optex::Sgd{.lr = 1.0, .momentum = 0.0, .weight_decay = 0.0}.validate()));
  EXPECT_NO_THROW((optex::Sgd{.lr = 0.1, .momentum = 0.99, .nesterov = true}.validate()));
  EXPECT_NO_THROW(optex::Adam{}.validate());
  EXPECT_NO_THROW((optex::Adam{.beta1 = 0.0, .beta2 = 0.0, .weight_decay = 1.0}.validate()));
  EXPECT_NO_THROW(optex::adamw().validate());
}

}  // namespace
