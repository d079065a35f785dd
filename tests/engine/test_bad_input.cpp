// Bad input never crashes or corrupts (DESIGN.md section 6): each rejected call
// throws the documented exception, whose message names the parameter (and the
// value where there is one), and the engine is exactly as it was before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/engine/minimize.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/throws_with.hpp"

namespace {

using optex::Adam;
using optex::Batch;
using optex::Engine;
using optex::Optimizer;
using optex::OptimizerState;
using optex::Options;
using optex::Sgd;
using optex::test::ThrowsWith;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- helpers ------------------------------------------------------------------

double Sphere(std::span<const float> x, std::span<float> g) {
  double f = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    f += static_cast<double>(x[i]) * x[i];
    g[i] = 2.0f * x[i];
  }
  return f;
}

void EvaluateBatch(Batch& b) {
  for (int i = 0; i < b.size(); ++i) b.loss(i) = Sphere(b.point(i), b.grad(i));
}

Options WithN(int n) {
  Options o;
  o.parallelism = n;
  return o;
}

// Everything observable that determines the rest of a run.
struct Snapshot {
  std::vector<float> x;
  OptimizerState state;
  std::int64_t iteration;
  std::int64_t evaluations;
  std::size_t history_size;
  std::vector<float> history_points;
  bool pending;
  std::uint64_t rng;
  double lengthscale;

  explicit Snapshot(const Engine& e)
      : x(e.iterate().begin(), e.iterate().end()),
        state(e.optimizer_state()),
        iteration(e.iteration()),
        evaluations(e.evaluations()),
        history_size(e.history().size()),
        pending(e.pending()),
        rng(e.rng_state()),
        lengthscale(e.lengthscale()) {
    for (std::size_t j = 0; j < history_size; ++j) {
      const auto p = e.history().point(j);
      history_points.insert(history_points.end(), p.begin(), p.end());
    }
  }
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

::testing::AssertionResult Unchanged(const Snapshot& before, const Engine& e) {
  const Snapshot now(e);
  if (!SameBits(before.x, now.x)) return ::testing::AssertionFailure() << "iterate changed";
  bool same_state = before.state.step == now.state.step;
  for (std::size_t j = 0; j < before.state.slots.size(); ++j)
    same_state = same_state && SameBits(before.state.slots[j], now.state.slots[j]);
  if (!same_state) return ::testing::AssertionFailure() << "optimizer state changed";
  if (before.iteration != now.iteration) return ::testing::AssertionFailure() << "iteration";
  if (before.evaluations != now.evaluations) return ::testing::AssertionFailure() << "evaluations";
  if (before.history_size != now.history_size ||
      !SameBits(before.history_points, now.history_points)) {
    return ::testing::AssertionFailure() << "history changed";
  }
  if (before.pending != now.pending) return ::testing::AssertionFailure() << "pending changed";
  if (before.rng != now.rng) return ::testing::AssertionFailure() << "rng advanced";
  if (std::memcmp(&before.lengthscale, &now.lengthscale, sizeof(double)) != 0) {
    return ::testing::AssertionFailure() << "lengthscale changed";
  }
  return ::testing::AssertionSuccess();
}

// An engine a few iterations in, so that "unchanged" has something to lose.
Engine Warmed(int n = 3, Optimizer opt = Adam{.lr = 0.05}, Options o = WithN(3)) {
  o.parallelism = n;
  const std::vector<float> x0 = {0.5f, -1.0f, 0.25f, 2.0f};
  Engine e(x0, opt, o);
  for (int t = 0; t < 3; ++t) {
    Batch& b = e.ask();
    EvaluateBatch(b);
    e.tell(b);
  }
  return e;
}

// Constructing with bad arguments throws, and an existing engine that the
// result would have been assigned to keeps its state.
template <class MakeBad>
void ExpectConstructorRejects(MakeBad make_bad, const std::vector<std::string>& needles) {
  Engine e = Warmed();
  const Snapshot before(e);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { e = make_bad(); }, needles));
  EXPECT_TRUE(Unchanged(before, e));
}

const std::vector<float> kX0 = {1.0f, 2.0f, 3.0f, 4.0f};

// ---- construction -----------------------------------------------------------------

TEST(BadInput, EmptyStart) {
  ExpectConstructorRejects([] { return Engine(std::span<const float>{}, Adam{}, Options{}); },
                           {"x0", "0"});
}

TEST(BadInput, NonFiniteStart) {
  const std::vector<float> nan_x = {1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
  ExpectConstructorRejects([&] { return Engine(nan_x, Adam{}, Options{}); },
                           {"x0", "element 1", "nan"});
  const std::vector<float> inf_x = {-std::numeric_limits<float>::infinity()};
  ExpectConstructorRejects([&] { return Engine(inf_x, Sgd{}, Options{}); }, {"x0", "inf"});
}

// Finite but above the magnitude bound (about 6.5e18 at d = 1): no history could hold it.
TEST(BadInput, StartAboveTheMagnitudeBound) {
  const std::vector<float> huge_x = {1e19f};
  ExpectConstructorRejects([&] { return Engine(huge_x, Adam{}, Options{}); },
                           {"x0", "element 0", "1e+19", "at most"});
  const std::vector<float> at_bound = {optex::magnitude_bound(1)};
  EXPECT_NO_THROW(Engine(at_bound, Adam{}, Options{}));
}

// A moved-from engine refuses every use instead of dereferencing nothing.
TEST(BadInput, AMovedFromEngine) {
  Engine engine(kX0, Adam{}, Options{});
  Engine moved = std::move(engine);
  for (const auto& use : std::vector<std::function<void()>>{
           [&] { engine.ask(); }, [&] { (void)engine.iterate(); }, [&] { (void)engine.dim(); },
           [&] { engine.set_optimizer(Adam{}); }}) {
    try {
      use();
      ADD_FAILURE() << "a moved-from engine was used";
    } catch (const std::logic_error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("moved from"));
    }
  }
  EXPECT_NO_THROW(moved.ask());
}

TEST(BadInput, Parallelism) {
  for (int n : {0, -2, optex::kMaxParallelism + 1, 1'000'000}) {
    ExpectConstructorRejects([n] { return Engine(kX0, Adam{}, WithN(n)); },
                             {"parallelism", std::to_string(n), "65536"});
  }
  // An absurd N is refused before its batch is allocated.
  for (int n : {optex::kMaxParallelism + 1, 2147483647}) {
    ExpectConstructorRejects([n] { return Engine(kX0, Adam{}, WithN(n)); },
                             {"parallelism", std::to_string(n), "65536"});
  }
  EXPECT_NO_THROW(WithN(optex::kMaxParallelism).validate());
}

// The preset refuses a bad parallelism itself, not at the first Engine built from it.
TEST(BadInput, ReferenceParallelism) {
  for (int n : {0, -3}) {
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>([n] { (void)Options::reference(n); },
                                                  {"parallelism", std::to_string(n)}));
  }
  EXPECT_EQ(Options::reference(1).parallelism, 1);
}

TEST(BadInput, History) {
  for (int t0 : {0, -1, optex::kMaxHistory + 1, 1'000'000}) {
    Options o;
    o.history = t0;
    ExpectConstructorRejects([&] { return Engine(kX0, Adam{}, o); },
                             {"history", std::to_string(t0), "4096"});
  }
  Options largest;
  largest.history = optex::kMaxHistory;
  EXPECT_NO_THROW(largest.validate());
}

// An enumeration value outside ProxyDistances (a cast through the C++ API) is
// refused naming the field and the value; both values are accepted, the default and
// the reference are direct.
TEST(BadInput, ProxyDistances) {
  for (const int value : {-1, 2, 255}) {
    Options o;
    o.proxy_distances = static_cast<optex::ProxyDistances>(value);
    ExpectConstructorRejects([&] { return Engine(kX0, Adam{}, o); },
                             {"proxy_distances", std::to_string(value)});
  }
  for (const auto value : {optex::ProxyDistances::direct, optex::ProxyDistances::coefficients}) {
    Options o;
    o.proxy_distances = value;
    EXPECT_EQ(Engine(kX0, Sgd{.lr = 0.1, .momentum = 0.9}, o).options().proxy_distances, value);
  }
  EXPECT_EQ(Options{}.proxy_distances, optex::ProxyDistances::direct);
  EXPECT_EQ(Options::reference().proxy_distances, optex::ProxyDistances::direct);
}

TEST(BadInput, Lengthscale) {
  for (auto [value, text] : {std::pair{0.0, "0"}, std::pair{-0.5, "-0.5"}, std::pair{kNaN, "nan"},
                             std::pair{kInf, "inf"}}) {
    Options o;
    o.lengthscale = value;
    ExpectConstructorRejects([&] { return Engine(kX0, Adam{}, o); }, {"lengthscale", text});
  }
}

TEST(BadInput, LengthscaleGrid) {
  Options o;
  o.lengthscale_grid = {0.5, 1.0, -2.0};
  ExpectConstructorRejects([&] { return Engine(kX0, Adam{}, o); }, {"lengthscale_grid", "-2"});
}

TEST(BadInput, Noise) {
  for (auto [value, text] : {std::pair{-1.0, "-1"}, std::pair{kNaN, "nan"}}) {
    Options o;
    o.noise = value;
    ExpectConstructorRejects([&] { return Engine(kX0, Adam{}, o); }, {"noise", text});
  }
}

TEST(BadInput, SelectionInterval) {
  Options o;
  o.selection_interval = 0;
  ExpectConstructorRejects([&] { return Engine(kX0, Adam{}, o); }, {"selection_interval", "0"});
}

// torch.optim's bound, lr >= 0, plus finiteness: 0 (where schedules start and end) is
// accepted, a negative, NaN or infinite one is not.
TEST(BadInput, LearningRate) {
  EXPECT_NO_THROW(Engine(kX0, Sgd{.lr = 0.0}, Options{}));
  EXPECT_NO_THROW(Engine(kX0, Adam{.lr = 0.0}, Options{}));
  for (auto [value, text] : {std::pair{-1e-300, "-1e-300"}, std::pair{kNaN, "nan"},
                             std::pair{kInf, "inf"}, std::pair{-0.1, "-0.1"}}) {
    SCOPED_TRACE(text);
    ExpectConstructorRejects([&] { return Engine(kX0, Sgd{.lr = value}, Options{}); },
                             {"lr", text});
    ExpectConstructorRejects([&] { return Engine(kX0, Adam{.lr = value}, Options{}); },
                             {"lr", text});
  }
}

// The steps run in float32: a hyperparameter beyond its range would be infinite there.
TEST(BadInput, HyperparametersBeyondFloat32) {
  ExpectConstructorRejects([] { return Engine(kX0, Sgd{.lr = 1e39}, Options{}); },
                           {"lr", "1e+39", "float32"});
  ExpectConstructorRejects([] { return Engine(kX0, Adam{.weight_decay = 1e300}, Options{}); },
                           {"weight_decay", "1e+300", "float32"});
  EXPECT_NO_THROW(Engine(kX0, Sgd{.lr = std::numeric_limits<float>::max()}, Options{}));
}

TEST(BadInput, OtherHyperparameters) {
  ExpectConstructorRejects([] { return Engine(kX0, Adam{.beta1 = 1.0}, Options{}); },
                           {"beta1", "1"});
  ExpectConstructorRejects([] { return Engine(kX0, Adam{.beta2 = -0.5}, Options{}); },
                           {"beta2", "-0.5"});
  ExpectConstructorRejects([] { return Engine(kX0, Adam{.eps = -1e-8}, Options{}); },
                           {"eps", "-1e-08"});
  ExpectConstructorRejects([] { return Engine(kX0, Sgd{.momentum = -0.5}, Options{}); },
                           {"momentum", "-0.5"});
  // torch.optim's bounds accept eps 0 and momentum of 1 or more.
  EXPECT_NO_THROW(Engine(kX0, Adam{.eps = 0.0}, Options{}));
  EXPECT_NO_THROW(Engine(kX0, Sgd{.momentum = 1.5}, Options{}));
  // Nesterov needs momentum.
  ExpectConstructorRejects([] { return Engine(kX0, Sgd{.nesterov = true}, Options{}); },
                           {"momentum"});
  ExpectConstructorRejects([] { return Engine(kX0, Sgd{.weight_decay = -1.0}, Options{}); },
                           {"weight_decay", "-1"});
}

// eps = 0 is accepted, as torch.optim accepts it; a coordinate whose gradient has been 0
// from the start then steps 0 / 0 (torch.optim writes NaN into the parameter, at lr 0 too).
// The engine refuses that step by its non-finite rules: no pair can be committed, tell()
// throws and changes nothing, and the round commits once the gradient is non-zero there.
TEST(BadInput, EpsZeroStepsZeroOverZeroAndTheNonFiniteRulesRefuseIt) {
  for (const double lr : {0.1, 0.0}) {
    SCOPED_TRACE(lr);
    Engine e(kX0, Adam{.lr = lr, .eps = 0.0}, WithN(2));
    Batch& b = e.ask();
    for (int i = 0; i < b.size(); ++i) {
      b.loss(i) = 1.0;
      for (std::size_t j = 0; j < kX0.size(); ++j) b.grad(i)[j] = j == 0 ? 0.0f : 1.0f;
    }
    const Snapshot before(e);
    EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.tell(b); }, {"committed"}));
    EXPECT_TRUE(Unchanged(before, e));
    for (int i = 0; i < b.size(); ++i) b.grad(i)[0] = 0.5f;
    e.tell(b);
    for (float v : e.iterate()) EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(e.iterate()[0] == kX0[0], lr == 0.0);
  }
}

TEST(BadInput, OptimizerRangeSizesThatWrapAround) {
  // SIZE_MAX + SIZE_MAX + 6 is 4 modulo 2^64, the dimension of kX0: a sum that
  // wrapped around would let the second range step memory past x.
  constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max();
  const optex::OptimizerRanges wrapping{{kHuge, Sgd{}}, {kHuge, Sgd{}}, {6, Sgd{}}};
  ExpectConstructorRejects([&] { return Engine(kX0, wrapping, Options{}); },
                           {"optimizer ranges", "more than", "dimension is 4"});
  Engine e = Warmed();
  const Snapshot before(e);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { e.set_optimizer(wrapping); },
                                                {"optimizer ranges", "more than"}));
  EXPECT_TRUE(Unchanged(before, e));
  std::vector<float> x(kX0);
  OptimizerState s = optex::init_state(Sgd{}, x.size());
  const std::vector<float> g(x.size(), 1.0f);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { optex::apply_step(wrapping, x, s, g); },
                                                {"apply_step", "more than any dimension"}));
  EXPECT_EQ(x, kX0);
  EXPECT_EQ(s.step, 0);
}

// ---- gradients of the wrong size -------------------------------------------------

TEST(BadInput, SetGradientOfTheWrongSize) {
  Engine e = Warmed();
  Batch& b = e.ask();
  EvaluateBatch(b);
  const Snapshot before(e);
  const std::vector<float> grads(b.grads().begin(), b.grads().end());
  for (std::size_t size : {std::size_t{0}, std::size_t{3}, std::size_t{5}}) {
    const std::vector<float> g(size, 7.0f);
    EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
        [&] { b.set_gradient(1, g); }, {"gradient", "size " + std::to_string(size), "4"}));
  }
  EXPECT_TRUE(SameBits(std::vector<float>(b.grads().begin(), b.grads().end()), grads));
  EXPECT_TRUE(Unchanged(before, e));
  // The right size is accepted.
  const std::vector<float> g = {1.0f, 2.0f, 3.0f, 4.0f};
  b.set_gradient(1, g);
  EXPECT_EQ(b.grad(1)[3], 4.0f);
}

TEST(BadInput, FlatTellWithWrongSizes) {
  Engine e = Warmed();
  Batch& b = e.ask();
  EvaluateBatch(b);
  const std::vector<float> grads(b.grads().begin(), b.grads().end());
  const std::vector<double> losses(b.losses().begin(), b.losses().end());
  const Snapshot before(e);
  ASSERT_EQ(grads.size(), 12u);

  const std::vector<float> short_grads(grads.begin(), grads.end() - 1);
  std::vector<float> long_grads = grads;
  long_grads.push_back(0.0f);
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([&] { e.tell(short_grads, losses); }, {"gradients", "11"}));
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([&] { e.tell(long_grads, losses); }, {"gradients", "13"}));
  EXPECT_TRUE(Unchanged(before, e));

  const std::vector<double> short_losses(losses.begin(), losses.end() - 1);
  std::vector<double> long_losses = losses;
  long_losses.push_back(0.0);
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([&] { e.tell(grads, short_losses); }, {"losses", "2"}));
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([&] { e.tell(grads, long_losses); }, {"losses", "4"}));
  EXPECT_TRUE(Unchanged(before, e));

  // Still pending; the right sizes commit.
  e.tell(grads, losses);
  EXPECT_EQ(e.iteration(), before.iteration + 1);
  EXPECT_FALSE(e.pending());
}

// ---- protocol errors ---------------------------------------------------------------

TEST(BadInput, TellWithoutAsk) {
  Engine e = Warmed();
  Batch& b = e.ask();
  EvaluateBatch(b);
  e.tell(b);
  const Snapshot before(e);
  // The batch of the last (committed) iteration cannot be told again.
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.tell(b); }, {"tell", "ask()"}));
  const std::vector<float> grads(12, 0.0f);
  const std::vector<double> losses(3, 0.0);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.tell(grads, losses); }, {"tell", "ask()"}));
  EXPECT_TRUE(Unchanged(before, e));
}

TEST(BadInput, TellBeforeTheFirstAsk) {
  Engine e(kX0, Sgd{.lr = 0.1}, WithN(2));
  const Snapshot before(e);
  const std::vector<float> grads(8, 1.0f);
  const std::vector<double> losses(2, 1.0);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.tell(grads, losses); }, {"tell"}));
  EXPECT_TRUE(Unchanged(before, e));
}

TEST(BadInput, ABatchOfAnotherEngine) {
  Engine a = Warmed();
  Engine b = Warmed();
  Batch& mine = a.ask();
  Batch& theirs = b.ask();
  EvaluateBatch(mine);
  EvaluateBatch(theirs);
  const Snapshot before_a(a);
  const Snapshot before_b(b);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { a.tell(theirs); }, {"batch"}));
  EXPECT_TRUE(Unchanged(before_a, a));
  EXPECT_TRUE(Unchanged(before_b, b));
  // Also when the engine has nothing pending.
  a.tell(mine);
  const Snapshot after_a(a);
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { a.tell(theirs); }, {"batch"}));
  EXPECT_TRUE(Unchanged(after_a, a));
  // Both engines still work.
  b.tell(theirs);
  EXPECT_EQ(a.iteration(), b.iteration());
}

// Batch is copyable; a copy kept from an earlier iteration (a late worker's
// result) must not be committed into the current one, whose proxy state differs.
TEST(BadInput, ABatchOfAnEarlierIteration) {
  Engine e = Warmed();
  Batch& first = e.ask();
  EvaluateBatch(first);
  const Batch stale = first;  // iteration 3's batch, evaluated
  e.tell(first);
  Batch& current = e.ask();
  EvaluateBatch(current);
  const Snapshot before(e);
  Batch late = stale;
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>([&] { e.tell(late); }, {"batch", "iteration"}));
  EXPECT_TRUE(Unchanged(before, e));
  // The current batch still commits.
  EXPECT_NO_THROW(e.tell(current));
}

TEST(BadInput, OutOfRangeBatchIndex) {
  Engine e = Warmed();
  Batch& b = e.ask();
  const Snapshot before(e);
  const std::vector<float> g(4, 1.0f);
  for (int i : {-1, 3, 100}) {
    const std::string v = std::to_string(i);
    EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { (void)b.point(i); }, {"i", v}));
    EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { (void)b.grad(i); }, {"i", v}));
    EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { (void)b.loss(i); }, {"i", v}));
    EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { (void)b.seed(i); }, {"i", v}));
    EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { b.set_gradient(i, g); }, {"i", v}));
    EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { (void)b.predicted_gradient(i); }, {"i", v}));
  }
  // The last point has no predicted gradient.
  EXPECT_TRUE(ThrowsWith<std::out_of_range>([&] { (void)b.predicted_gradient(2); }, {"i", "2"}));
  EXPECT_TRUE(Unchanged(before, e));
  EXPECT_NO_THROW((void)b.predicted_gradient(1));
}

// Proxy::target without an oracle: ask() throws, and the rng is rewound, so the
// first successful ask matches a fresh engine's.
TEST(BadInput, TargetProxyWithoutAnOracle) {
  Options o = WithN(4);
  o.proxy = optex::Proxy::target;
  o.seed = 77;
  Engine e(kX0, Adam{.lr = 0.05}, o);
  const Snapshot before(e);
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.ask(); }, {"oracle"}));
    EXPECT_TRUE(Unchanged(before, e));
    EXPECT_FALSE(e.pending());
  }
  e.set_gradient_oracle(Sphere);
  Engine fresh(kX0, Adam{.lr = 0.05}, o);
  fresh.set_gradient_oracle(Sphere);
  Batch& b = e.ask();
  Batch& f = fresh.ask();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b.seed(i), f.seed(i));
    EXPECT_TRUE(
        SameBits({b.point(i).begin(), b.point(i).end()}, {f.point(i).begin(), f.point(i).end()}));
  }
  EXPECT_EQ(e.rng_state(), fresh.rng_state());
}

// An oracle that throws part-way through the proxy steps: its exception comes
// out of ask() and the engine is as before (the rng included).
TEST(BadInput, TargetProxyWithAThrowingOracle) {
  Options o = WithN(4);
  o.proxy = optex::Proxy::target;
  Engine t(kX0, Adam{.lr = 0.05}, o);
  int calls = 0;
  t.set_gradient_oracle([&calls](std::span<const float> x, std::span<float> g) {
    if (++calls == 2) throw std::domain_error("simulator crashed");
    return Sphere(x, g);
  });
  const Snapshot before(t);
  EXPECT_TRUE(ThrowsWith<std::domain_error>([&] { t.ask(); }, {"simulator crashed"}));
  EXPECT_TRUE(Unchanged(before, t));
  // The next ask (the oracle now works) matches a fresh engine's.
  Engine fresh(kX0, Adam{.lr = 0.05}, o);
  fresh.set_gradient_oracle(Sphere);
  Batch& b = t.ask();
  Batch& f = fresh.ask();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b.seed(i), f.seed(i));
    EXPECT_TRUE(
        SameBits({b.point(i).begin(), b.point(i).end()}, {f.point(i).begin(), f.point(i).end()}));
  }
  EXPECT_EQ(t.rng_state(), fresh.rng_state());
}

// An oracle that fails (non-finite) is rejected the same way.
TEST(BadInput, TargetProxyWithANonFiniteOracle) {
  Options o = WithN(3);
  o.proxy = optex::Proxy::target;
  Engine e(kX0, Adam{.lr = 0.05}, o);
  e.set_gradient_oracle([](std::span<const float>, std::span<float> g) {
    for (float& v : g) v = 0.0f;
    return kNaN;
  });
  const Snapshot before(e);
  EXPECT_TRUE(ThrowsWith<std::runtime_error>([&] { e.ask(); }, {"oracle", "non-finite"}));
  EXPECT_TRUE(Unchanged(before, e));
}

// ---- minimize's Stop ------------------------------------------------------------

TEST(BadInput, StopCriteriaInMinimize) {
  int calls = 0;
  auto f = [&calls](std::span<const float> x, std::span<float> g) {
    ++calls;
    return Sphere(x, g);
  };
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { optex::minimize(f, kX0, Adam{}, Options{}, optex::Stop{.max_iters = -1}); },
      {"max_iters", "-1"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { optex::minimize(f, kX0, Adam{}, Options{}, optex::Stop{.target_loss = kNaN}); },
      {"target_loss", "nan"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { optex::minimize(f, kX0, Adam{}, Options{}, optex::Stop{.grad_tol = -1e-3}); },
      {"grad_tol", "-0.001"}));
  // Bad options and optimizers are rejected by minimize too.
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { optex::minimize(f, kX0, Adam{.lr = -1.0}, Options{}, optex::Stop{}); }, {"lr", "-1"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { optex::minimize(f, kX0, Adam{}, WithN(0), optex::Stop{}); }, {"parallelism", "0"}));
  EXPECT_EQ(calls, 0);  // rejected before any evaluation
}

}  // namespace
