// Engine::observe: true pairs that no round committed enter the history as
// the pushes of a commit would, and nothing else changes (engine.hpp,
// DESIGN.md section 2). Held to:
//
//   - the pairs are those GradientHistory::push gives (points, gradients,
//     ring position, statistics), and the rest of the engine is untouched:
//     iterate, optimizer state and step, counters, seeds, lengthscale;
//   - many pairs at once equal as many single observes, and a snapshot whose
//     history was pushed on the host continues bit for bit the same;
//   - the next predictions use the pairs (the GP mean at an observed point
//     reproduces its gradient; a fresh engine leaves its warm-up);
//   - a checkpoint written after observe continues bit for bit;
//   - every refusal throws the named exception and changes nothing, and so
//     does every primitive call that fails (faulty and deferred primitives);
//   - every optimizer kind, per-range hyperparameters, N = 1 (lazy
//     statistics), N > T0, and on a GPU every history storage.
//
// The suite EngineObserve runs once per device (cpu, cpu_deferred, cuda0).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optex/backend/bf16.hpp"
#include "optex/backend/device.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/engine_snapshot.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/sharded/coordinate_shard.hpp"
#include "support/deferred_primitives.hpp"
#include "support/device_fixture.hpp"
#include "support/engine_equality.hpp"
#include "support/faulty_primitives.hpp"
#include "support/gpu_test_support.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"
#include "support/throws_with.hpp"

namespace {

namespace fs = std::filesystem;

using optex::Adam;
using optex::Batch;
using optex::CoordinateShard;
using optex::Device;
using optex::Engine;
using optex::EngineSnapshot;
using optex::GradientHistory;
using optex::Optimizer;
using optex::OptimizerRanges;
using optex::Options;
using optex::Precision;
using optex::Sgd;
using optex::detail::ScopedPrimitives;
using optex::test::BitEqual;
using optex::test::DeferredPrimitives;
using optex::test::DeferredStats;
using optex::test::DeviceName;
using optex::test::FaultControl;
using optex::test::FaultyPrimitives;
using optex::test::InjectedFault;
using optex::test::kDevices;
using optex::test::OnDevice;
using optex::test::OptimizerConfig;
using optex::test::Quartic;
using optex::test::SameBits;
using optex::test::SameEngine;
using optex::test::StateBitEqual;
using optex::test::ThrowsWith;
using optex::test::UniformStart;
using optex::test::WithN;

constexpr std::size_t kDim = 40;

// ---- helpers --------------------------------------------------------------------------------

// One round: every point evaluated with f through the host views.
template <class F>
void Round(Engine& e, const F& f) {
  Batch& b = e.ask();
  for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  e.tell(b);
}

// m true pairs of Quartic (row-major m x d), at points drawn from `seed`.
struct Pairs {
  std::vector<float> points;
  std::vector<float> gradients;
  std::size_t size(std::size_t d) const { return points.size() / d; }
  std::span<const float> point(std::size_t k, std::size_t d) const {
    return std::span<const float>(points).subspan(k * d, d);
  }
  std::span<const float> gradient(std::size_t k, std::size_t d) const {
    return std::span<const float>(gradients).subspan(k * d, d);
  }
  // Pairs [first, first + count) as their own Pairs.
  Pairs slice(std::size_t first, std::size_t count, std::size_t d) const {
    Pairs p;
    p.points.assign(points.begin() + static_cast<std::ptrdiff_t>(first * d),
                    points.begin() + static_cast<std::ptrdiff_t>((first + count) * d));
    p.gradients.assign(gradients.begin() + static_cast<std::ptrdiff_t>(first * d),
                       gradients.begin() + static_cast<std::ptrdiff_t>((first + count) * d));
    return p;
  }
};

Pairs TruePairs(std::size_t m, std::size_t d, std::uint64_t seed) {
  const Quartic f;
  Pairs p;
  p.points = UniformStart(m * d, seed, -0.5, 1.5);
  p.gradients.resize(m * d);
  for (std::size_t k = 0; k < m; ++k) {
    f.EvaluateWithGradient(std::span<const float>(p.points).subspan(k * d, d),
                           std::span<float>(p.gradients).subspan(k * d, d));
  }
  return p;
}

void Observe(Engine& e, const Pairs& p) { e.observe(p.points, p.gradients); }

// The values a history of this precision stores: bf16-rounded where it rounds.
float Stored(float v, bool rounds) {
  return rounds ? optex::detail::from_bf16(optex::detail::to_bf16(v)) : v;
}

// `history` with the pairs pushed, as a history of `precision` stores them.
GradientHistory Pushed(GradientHistory history, const Pairs& p, Precision precision) {
  const std::size_t d = history.dim();
  const bool points_round = precision == Precision::bf16;
  const bool gradients_round = precision != Precision::fp32;
  std::vector<float> x(d), g(d);
  for (std::size_t k = 0; k < p.size(d); ++k) {
    for (std::size_t i = 0; i < d; ++i) {
      x[i] = Stored(p.point(k, d)[i], points_round);
      g[i] = Stored(p.gradient(k, d)[i], gradients_round);
    }
    history.push(x, g);
  }
  return history;
}

// Two histories hold the same pairs in the same slots, with the same ring
// position and push count; their statistics agree bit for bit (tolerance 0)
// or within a relative tolerance (another device's reduction order).
::testing::AssertionResult SameHistory(const GradientHistory& a, const GradientHistory& b,
                                       double tolerance) {
  if (a.size() != b.size() || a.next_slot() != b.next_slot() || a.version() != b.version()) {
    return ::testing::AssertionFailure()
           << "size " << a.size() << " vs " << b.size() << ", next slot " << a.next_slot() << " vs "
           << b.next_slot() << ", version " << a.version() << " vs " << b.version();
  }
  const auto close = [tolerance](double u, double v, double scale = 0.0) {
    if (tolerance == 0.0) return SameBits(u, v);
    return std::abs(u - v) <= tolerance * std::max({1.0, std::abs(u), std::abs(v), scale});
  };
  // An inner product summed in fp32 errs relative to the sum of |a_i b_i|, which
  // can far exceed |<a, b>|: bounded by ||a|| ||b|| (Cauchy-Schwarz).
  const auto norms = [&b](std::size_t j, std::size_t k) {
    return std::sqrt(std::abs(b.gradient_inner(j, j)) * std::abs(b.gradient_inner(k, k)));
  };
  for (std::size_t j = 0; j < a.size(); ++j) {
    auto r = BitEqual(a.point(j), b.point(j));
    if (!r) return r << " (point in slot " << j << ")";
    r = BitEqual(a.gradient(j), b.gradient(j));
    if (!r) return r << " (gradient in slot " << j << ")";
    if (!close(a.squared_norm(j), b.squared_norm(j))) {
      return ::testing::AssertionFailure()
             << "squared norm " << j << ": " << a.squared_norm(j) << " vs " << b.squared_norm(j);
    }
    for (std::size_t k = 0; k < a.size(); ++k) {
      if (!close(a.squared_distance(j, k), b.squared_distance(j, k)) ||
          !close(a.gradient_inner(j, k), b.gradient_inner(j, k), norms(j, k))) {
        return ::testing::AssertionFailure()
               << "statistics " << j << ", " << k << ": " << a.squared_distance(j, k) << " vs "
               << b.squared_distance(j, k) << ", " << a.gradient_inner(j, k) << " vs "
               << b.gradient_inner(j, k);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Everything but the history agrees bit for bit (what observe must not touch).
::testing::AssertionResult SameApartFromHistory(const Engine& a, const Engine& b) {
  auto r = BitEqual(a.iterate(), b.iterate());
  if (!r) return r << " (iterate)";
  r = StateBitEqual(a.optimizer_state(), b.optimizer_state());
  if (!r) return r << " (optimizer state)";
  if (a.optimizer_step() != b.optimizer_step()) return ::testing::AssertionFailure() << "step";
  if (!SameBits(a.lengthscale(), b.lengthscale())) {
    return ::testing::AssertionFailure() << "lengthscale";
  }
  if (a.rng_state() != b.rng_state()) return ::testing::AssertionFailure() << "rng state";
  if (a.iteration() != b.iteration()) return ::testing::AssertionFailure() << "iteration";
  if (a.evaluations() != b.evaluations()) return ::testing::AssertionFailure() << "evaluations";
  if (a.pending() != b.pending()) return ::testing::AssertionFailure() << "pending";
  return ::testing::AssertionSuccess();
}

// An engine continuing `e`'s snapshot whose history had the pairs pushed on
// the host by GradientHistory::push: the other path to the same state.
Engine ViaSnapshot(const Engine& e, const Pairs& p) {
  EngineSnapshot s = e.snapshot();
  const GradientHistory h = Pushed(e.history(), p, Precision::fp32);
  const std::size_t d = e.dim();
  const std::size_t t0 = h.capacity();
  s.history_size = h.size();
  s.history_next = h.next_slot();
  s.points.assign(h.points_data(), h.points_data() + h.size() * d);
  s.gradients.assign(h.gradients_data(), h.gradients_data() + h.size() * d);
  for (std::size_t i = 0; i < t0; ++i) {
    s.squared_norms[i] = h.squared_norm(i);
    for (std::size_t j = 0; j < t0; ++j) {
      s.squared_distances[i * t0 + j] = h.squared_distance(i, j);
      s.gradient_gram[i * t0 + j] = h.gradient_inner(i, j);
    }
  }
  return Engine::from_snapshot(std::move(s));
}

// Both engines take `rounds` rounds of f; they must stay the same engine.
template <class F>
::testing::AssertionResult ContinueAlike(Engine& a, Engine& b, const F& f, int rounds) {
  for (int t = 0; t < rounds; ++t) {
    Round(a, f);
    Round(b, f);
    auto r = SameEngine(a, b);
    if (!r) return r << " (after " << t + 1 << " more rounds)";
  }
  return ::testing::AssertionSuccess();
}

// ---- the device suite ------------------------------------------------------------------------

class EngineObserve : public OnDevice {
 protected:
  // Statistics computed by another device's reductions than the host's
  // GradientHistory agree to rounding; the CPU's are the same bits.
  double Tolerance() const { return on_gpu() ? 1e-5 : 0.0; }
};

INSTANTIATE_TEST_SUITE_P(Devices, EngineObserve, ::testing::ValuesIn(kDevices), DeviceName);

// The shapes that take each path of the backend's push: N = 4 and T0 = 8
// (the commit's backup rows hold 4 slots, a fetch the Gram rows of 5 pairs),
// N = 1 (lazy statistics), N = 12 > T0 = 8.
struct Shape {
  int n;
  int history;
};
const Shape kShapes[] = {{4, 8}, {1, 6}, {12, 8}};

// observe(P) leaves the history GradientHistory::push(P) gives, and nothing
// else changes: the same iterate, state, step, counters, seeds and lengthscale
// as a twin that did not observe, for m below, at and beyond N and T0.
TEST_P(EngineObserve, ThePairsArePushedAsAGradientHistoryPushesThem) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 3, -0.5, 1.5);
  for (const Shape shape : kShapes) {
    for (const Precision precision : Precisions()) {
      for (const std::size_t m : {1u, 3u, 5u, 8u, 13u, 21u}) {
        SCOPED_TRACE("N " + std::to_string(shape.n) + ", T0 " + std::to_string(shape.history) +
                     ", " + optex::precision_name(precision) + ", m " + std::to_string(m));
        Options o = On(WithN(shape.n, 5));
        o.history = shape.history;
        o.history_precision = precision;
        Engine engine(x0, Adam{.lr = 1e-2}, o);
        Engine twin(x0, Adam{.lr = 1e-2}, o);
        for (int t = 0; t < 3; ++t) {
          Round(engine, f);
          Round(twin, f);
        }
        const Pairs p = TruePairs(m, kDim, 100 + m);
        const GradientHistory expected = Pushed(twin.history(), p, precision);
        Observe(engine, p);
        ASSERT_TRUE(SameHistory(engine.history(), expected, Tolerance()));
        ASSERT_TRUE(SameApartFromHistory(engine, twin));
        EXPECT_FALSE(engine.pending());
      }
    }
  }
}

// m pairs at once, in two calls, or one by one: the same engine, bit for bit,
// and the same rounds after it (on a GPU the inner products of pairs pushed
// together come from a cuBLAS GEMM of another shape, whose kernel sums in
// another order: within fp32 rounding).
TEST_P(EngineObserve, ManyPairsAtOnceAreSuccessiveSingleObserves) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 4, -0.5, 1.5);
  for (const Shape shape : kShapes) {
    for (const Precision precision : Precisions()) {
      const auto t0 = static_cast<std::size_t>(shape.history);
      for (const std::size_t m : {t0 - 1, t0, t0 + 5, 2 * t0 + 3}) {
        SCOPED_TRACE("N " + std::to_string(shape.n) + ", T0 " + std::to_string(t0) + ", " +
                     optex::precision_name(precision) + ", m " + std::to_string(m));
        Options o = On(WithN(shape.n, 6));
        o.history = shape.history;
        o.history_precision = precision;
        Engine at_once(x0, Sgd{.lr = 1e-2, .momentum = 0.9}, o);
        Engine in_two(x0, Sgd{.lr = 1e-2, .momentum = 0.9}, o);
        Engine singly(x0, Sgd{.lr = 1e-2, .momentum = 0.9}, o);
        for (Engine* e : {&at_once, &in_two, &singly}) Round(*e, f);
        const Pairs p = TruePairs(m, kDim, 200 + m);
        Observe(at_once, p);
        Observe(in_two, p.slice(0, m / 2, kDim));
        Observe(in_two, p.slice(m / 2, m - m / 2, kDim));
        for (std::size_t k = 0; k < m; ++k) Observe(singly, p.slice(k, 1, kDim));
        if (on_gpu()) {
          EXPECT_TRUE(SameHistory(at_once.history(), singly.history(), Tolerance()));
          EXPECT_TRUE(SameHistory(in_two.history(), singly.history(), Tolerance()));
          continue;
        }
        ASSERT_TRUE(SameEngine(at_once, singly));
        ASSERT_TRUE(SameEngine(in_two, singly));
        ASSERT_TRUE(ContinueAlike(at_once, singly, f, 3));
      }
    }
  }
}

// The relative error of the next round's first prediction (the GP mean at
// point 0, the iterate) against g.
double FirstPredictionError(Engine& e, std::span<const float> g) {
  const std::span<const float> p = e.ask().predicted_gradient(0);
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    err += (static_cast<double>(p[i]) - g[i]) * (static_cast<double>(p[i]) - g[i]);
    norm += static_cast<double>(g[i]) * g[i];
  }
  return std::sqrt(err / norm);
}

// Observed pairs are history: for the warm-up rules (a new engine holds its
// first round's points at the iterate, and after observing pairs near it makes
// GP proxy steps instead) and for the predictions (the GP mean at an observed
// point reproduces its gradient). Evaluations, iteration, step and seeds stay.
TEST_P(EngineObserve, ObservedPairsEndTheWarmUpAndReachThePredictions) {
  optex::test::NoisyQuadratic f;
  f.sigma = 0.0;  // exact gradients
  const std::vector<float> x0 = UniformStart(kDim, 10);
  Engine engine(x0, Adam{.lr = 1e-2}, On(WithN(4, 11)));
  Engine twin(x0, Adam{.lr = 1e-2}, On(WithN(4, 11)));
  engine.observe(std::span<const float>(), std::span<const float>());  // m = 0: nothing
  EXPECT_TRUE(SameEngine(engine, twin));
  // The iterate and two points near it, with their true gradients.
  Pairs p;
  const std::vector<float> shift = UniformStart(2 * kDim, 12, -0.05, 0.05);
  for (std::size_t k = 0; k < 3; ++k) {
    for (std::size_t i = 0; i < kDim; ++i) {
      p.points.push_back(x0[i] + (k == 0 ? 0.0f : shift[(k - 1) * kDim + i]));
    }
  }
  p.gradients.resize(p.points.size());
  for (std::size_t k = 0; k < 3; ++k) {
    f.EvaluateWithGradient(p.point(k, kDim), std::span<float>(p.gradients).subspan(k * kDim, kDim),
                           0);
  }
  Observe(engine, p);
  EXPECT_EQ(engine.history().size(), 3u);
  EXPECT_EQ(engine.evaluations(), 0);
  EXPECT_EQ(engine.iteration(), 0);
  EXPECT_EQ(engine.optimizer_step(), 0);
  EXPECT_TRUE(SameApartFromHistory(engine, twin));

  EXPECT_LT(FirstPredictionError(engine, p.gradient(0, kDim)), 5e-2)
      << "the GP mean at the observed iterate";
  Batch& held = twin.ask();
  Batch& stepped = engine.ask();
  EXPECT_TRUE(BitEqual(held.point(3), held.point(0))) << "the twin warms up";
  const std::span<const float> none = held.predicted_gradient(0);
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](float v) { return v == 0.0f; }));
  EXPECT_FALSE(BitEqual(stepped.point(3), stepped.point(0))) << "the observed engine does not";
  for (int i = 0; i < held.size(); ++i) EXPECT_EQ(stepped.seed(i), held.seed(i));
}

// Mid-run: after observing the true gradient at the iterate, the next round's
// first prediction (the GP mean there) reproduces it and differs from the
// prediction of a twin that did not observe, and so do the next points.
TEST_P(EngineObserve, TheNextPredictionsUseThePairs) {
  optex::test::NoisyQuadratic f;
  f.sigma = 0.0;
  const std::vector<float> x0 = UniformStart(kDim, 8);
  Options o = On(WithN(4, 9));
  o.history = 16;
  Engine engine(x0, Adam{.lr = 5e-2}, o);
  Engine twin(x0, Adam{.lr = 5e-2}, o);
  const auto round = [&](Engine& e) {
    Batch& b = e.ask();
    for (int i = 0; i < b.size(); ++i) {
      b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
    }
    e.tell(b);
  };
  for (int t = 0; t < 3; ++t) {
    round(engine);
    round(twin);
  }
  const std::vector<float> x(engine.iterate().begin(), engine.iterate().end());
  std::vector<float> g(kDim);
  f.EvaluateWithGradient(x, g, 0);
  engine.observe(x, g);
  EXPECT_EQ(engine.evaluations(), twin.evaluations());
  EXPECT_LT(FirstPredictionError(engine, g), 5e-2) << "the GP mean at the observed point";
  EXPECT_FALSE(BitEqual(engine.ask().predicted_gradient(0), twin.ask().predicted_gradient(0)))
      << "the observed engine predicts what the twin predicts";
  EXPECT_FALSE(BitEqual(engine.ask().point(1), twin.ask().point(1)))
      << "the observed engine's next points are the twin's";
}

// Saved after observe and loaded on the same device, the run continues bit for
// bit; the file loads on the CPU as the same engine.
TEST_P(EngineObserve, ACheckpointAfterObserveContinuesBitForBit) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 13, -0.5, 1.5);
  for (const Shape shape : kShapes) {
    for (const Precision precision : Precisions()) {
      std::string label = std::to_string(shape.n);
      label += std::string("_") + optex::precision_name(precision);
      SCOPED_TRACE(label);
      Options o = On(WithN(shape.n, 14));
      o.history = shape.history;
      o.history_precision = precision;
      Engine original(x0, Adam{.lr = 1e-2}, o);
      for (int t = 0; t < 2; ++t) Round(original, f);
      Observe(original, TruePairs(static_cast<std::size_t>(shape.history) + 3, kDim, 15));
      const std::string path = Path(label + ".ckpt");
      original.save(path);
      Engine restored = Engine::load(path);
      ASSERT_TRUE(SameEngine(restored, original));
      Engine on_cpu = Engine::load(path, Device::cpu());
      EXPECT_TRUE(SameEngine(on_cpu, original));
      ASSERT_TRUE(ContinueAlike(original, restored, f, 5));
    }
  }
}

// Every refusal throws what engine.hpp says, naming the argument, the row,
// the element and the value, and changes nothing: the engine equals a twin
// that never made the call, also after more rounds and a valid observe.
TEST_P(EngineObserve, EveryRefusalChangesNothing) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 16, -0.5, 1.5);
  Options o = On(WithN(4, 17));
  o.history = 8;
  Engine engine(x0, Adam{.lr = 1e-2}, o);
  Engine twin(x0, Adam{.lr = 1e-2}, o);
  for (int t = 0; t < 2; ++t) {
    Round(engine, f);
    Round(twin, f);
  }
  const Pairs good = TruePairs(3, kDim, 18);

  // Between ask() and tell(): the pending batch is untouched too.
  Batch& pending = engine.ask();
  Batch& twin_pending = twin.ask();
  EXPECT_TRUE(ThrowsWith<std::runtime_error>(
      [&] { Observe(engine, good); },
      {"observe: between ask() and tell() (iteration 2)", "call it after tell()"}));
  EXPECT_THROW(engine.observe(std::span<const float>(), std::span<const float>()),
               std::runtime_error);
  for (int i = 0; i < pending.size(); ++i) {
    ASSERT_TRUE(BitEqual(pending.point(i), twin_pending.point(i)));
  }
  for (Batch* b : {&pending, &twin_pending}) {
    for (int i = 0; i < b->size(); ++i)
      b->loss(i) = f.EvaluateWithGradient(b->point(i), b->grad(i));
  }
  engine.tell(pending);
  twin.tell(twin_pending);
  ASSERT_TRUE(SameEngine(engine, twin));

  // Sizes.
  const std::vector<float> short_points(good.points.begin(), good.points.end() - 1);
  EXPECT_TRUE(
      ThrowsWith<std::invalid_argument>([&] { engine.observe(short_points, good.gradients); },
                                        {"points has 119 values", "gradients 120", "d = 40"}));
  EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
      [&] { engine.observe(good.points, std::span<const float>(good.gradients).first(80)); },
      {"points has 120 values", "gradients 80", "d = 40"}));
  EXPECT_THROW(engine.observe(short_points, std::span<const float>(good.gradients).first(119)),
               std::invalid_argument);

  // Values: non-finite or above the bound, in points and in gradients, at
  // row 1, element 7.
  const float bound = optex::magnitude_bound(kDim);
  const std::vector<std::pair<float, std::string>> bad = {
      {std::numeric_limits<float>::quiet_NaN(), "is nan"},
      {std::numeric_limits<float>::infinity(), "is inf"},
      {-std::numeric_limits<float>::infinity(), "is -inf"},
      {3e38f, "is 3e+38"},
      {std::nextafter(bound, FLT_MAX), "must be finite and at most"}};
  for (const auto& [value, text] : bad) {
    for (const bool in_points : {true, false}) {
      SCOPED_TRACE(text + (in_points ? " in points" : " in gradients"));
      Pairs p = good;
      (in_points ? p.points : p.gradients)[1 * kDim + 7] = value;
      EXPECT_TRUE(ThrowsWith<std::invalid_argument>(
          [&] { Observe(engine, p); },
          {std::string("observe: ") + (in_points ? "points" : "gradients") + " row 1, element 7",
           text, "nothing was observed"}));
    }
  }
  // The bound itself is admissible.
  Pairs at_bound = good;
  at_bound.gradients[5] = bound;
  at_bound.points[6] = -bound;
  ASSERT_TRUE(SameEngine(engine, twin));

  // m = 0 is a no-op.
  engine.observe(std::span<const float>(), std::span<const float>());
  ASSERT_TRUE(SameEngine(engine, twin));

  // Nothing was left behind: a valid observe and more rounds go as the twin's.
  Observe(engine, at_bound);
  Observe(twin, at_bound);
  ASSERT_TRUE(SameEngine(engine, twin));
  ASSERT_TRUE(ContinueAlike(engine, twin, f, 3));
}

// Every optimizer kind and per-range hyperparameters: observe leaves the
// optimizer state and its step untouched, and the engine equals the one built
// from its snapshot with the pairs pushed on the host, before and after more
// rounds (on the CPU, where the host's statistics are the engine's bits).
TEST_P(EngineObserve, EveryOptimizerKindMatchesTheSnapshotPath) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 19, -0.5, 1.5);
  std::vector<OptimizerConfig> configs = optex::test::EveryKind();
  for (OptimizerConfig& c : optex::test::EveryKindInRanges(kDim)) configs.push_back(std::move(c));
  for (const OptimizerConfig& config : configs) {
    SCOPED_TRACE(config.name);
    Options o = On(WithN(4, 20));
    o.history = 8;
    Engine engine(x0, config.optimizer, o);
    for (int t = 0; t < 2; ++t) Round(engine, f);
    const optex::OptimizerState before = engine.optimizer_state();
    const Pairs p = TruePairs(11, kDim, 21);
    if (on_gpu()) {
      Observe(engine, p);
      EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), before));
      continue;
    }
    Engine via_snapshot = ViaSnapshot(engine, p);
    Observe(engine, p);
    ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), before));
    ASSERT_TRUE(SameEngine(engine, via_snapshot));
    ASSERT_TRUE(ContinueAlike(engine, via_snapshot, f, 3));
  }
}

// ---- refusals that need no device ------------------------------------------------------------

// Identity sums: one slice that is the whole vector (W = 1).
class OneSliceSums final : public optex::ShardSums {
 public:
  void sum(std::span<double>) override {}
  void all(std::span<char>) override {}
};

TEST(EngineObserveRefusals, ASliceOfAShardedEngineRefuses) {
  OneSliceSums sums;
  const std::vector<float> x0 = UniformStart(kDim, 22);
  const CoordinateShard shard{kDim, 0, kDim, &sums};
  Engine slice(x0, Adam{.lr = 1e-2}, WithN(2, 23), shard);
  Engine twin(x0, Adam{.lr = 1e-2}, WithN(2, 23), shard);
  const Pairs p = TruePairs(2, kDim, 24);
  EXPECT_TRUE(ThrowsWith<std::logic_error>([&] { Observe(slice, p); },
                                           {"observe", "slice of a sharded engine"}));
  EXPECT_TRUE(SameEngine(slice, twin));
}

TEST(EngineObserveRefusals, AMovedFromEngineRefuses) {
  const std::vector<float> x0 = UniformStart(kDim, 25);
  Engine engine(x0, Adam{.lr = 1e-2}, WithN(2, 26));
  Engine moved = std::move(engine);
  const Pairs p = TruePairs(1, kDim, 27);
  EXPECT_THROW(Observe(engine, p), std::logic_error);  // NOLINT(bugprone-use-after-move)
}

// The one check, for the distributed engine too: "" for good pairs.
TEST(EngineObserveRefusals, TheSharedCheckNamesTheFirstBadValue) {
  const Pairs p = TruePairs(2, 3, 28);
  EXPECT_EQ(optex::detail::observed_pairs_refusal(p.points, p.gradients, 3), "");
  EXPECT_EQ(optex::detail::observed_pairs_refusal({}, {}, 3), "");
  Pairs q = p;
  q.gradients[4] = std::numeric_limits<float>::quiet_NaN();
  q.points[5] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(optex::detail::observed_pairs_refusal(q.points, q.gradients, 3),
              ::testing::HasSubstr("points row 1, element 2 is inf"));
  q.points = p.points;
  EXPECT_THAT(optex::detail::observed_pairs_refusal(q.points, q.gradients, 3),
              ::testing::HasSubstr("gradients row 1, element 1 is nan"));
}

// ---- every primitive call may fail ---------------------------------------------------------

// For each k, the k-th primitive call of observe() throws (at once, or as a
// device's asynchronous error at the next wait): the engine is exactly as it
// was, and the repeated call ends as an untouched twin's on the CPU. The
// shapes take the commit's backup rows (m <= min(N, T0)), the host copies of
// what a longer push overwrites, several fetches of Gram rows, the lazy
// statistics of N = 1, and N > T0 with more pairs than T0.
struct FaultCase {
  int n;
  int history;
  int rounds;  // before the observe
  std::size_t m;
  const char* keeps;  // the primitive that keeps what the push overwrites
};

void DriveObserveFaults(const FaultCase& c, bool deferred, bool asynchronous) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 30, -0.5, 1.5);
  Options o = WithN(c.n, 31);
  o.history = c.history;
  const Pairs p = TruePairs(c.m, kDim, 32);
  Engine before(x0, Adam{.lr = 1e-2}, o);  // the plain CPU's
  for (int t = 0; t < c.rounds; ++t) Round(before, f);
  Engine after(x0, Adam{.lr = 1e-2}, o);
  for (int t = 0; t < c.rounds; ++t) Round(after, f);
  Observe(after, p);
  Engine next(x0, Adam{.lr = 1e-2}, o);  // and one more round
  for (int t = 0; t < c.rounds; ++t) Round(next, f);
  Observe(next, p);
  Round(next, f);

  FaultControl control;
  control.deferred = deferred;
  control.asynchronous = asynchronous;
  const ScopedPrimitives scope(&FaultyPrimitives::factory, &control);
  std::int64_t calls = 0;
  {
    Engine clean(x0, Adam{.lr = 1e-2}, o);
    for (int t = 0; t < c.rounds; ++t) Round(clean, f);
    control.reset();
    control.log = true;
    Observe(clean, p);
    control.log = false;
    calls = control.calls();
    const std::vector<const char*>& names = control.names();
    EXPECT_TRUE(std::any_of(names.begin(), names.end(),
                            [&](const char* name) { return std::string(name) == c.keeps; }))
        << "observe never called " << c.keeps;
    const FaultControl::Pause pause(control);
    ASSERT_TRUE(SameEngine(clean, after)) << "without a fault";
  }
  ASSERT_GT(calls, 0);
  for (std::int64_t k = 1; k <= calls; ++k) {
    SCOPED_TRACE("fault at call " + std::to_string(k) + " of " + std::to_string(calls));
    Engine engine(x0, Adam{.lr = 1e-2}, o);
    for (int t = 0; t < c.rounds; ++t) Round(engine, f);
    control.reset();
    control.arm(k);
    bool threw = false;
    try {
      Observe(engine, p);
    } catch (const InjectedFault&) {
      threw = true;
    }
    control.disarm();
    const FaultControl::Pause pause(control);
    ASSERT_TRUE(threw) << "call " << k << " never came or did not surface";
    ASSERT_TRUE(SameEngine(engine, before)) << "observe threw and changed the engine";
    Observe(engine, p);
    ASSERT_TRUE(SameEngine(engine, after)) << "the repeated observe";
    Round(engine, f);
    ASSERT_TRUE(SameEngine(engine, next)) << "the round after the repeated observe";
  }
}

const FaultCase kFaultCases[] = {
    {4, 8, 3, 3, "copy_stored"},    // the commit's backup rows, a full ring
    {4, 8, 3, 13, "view_stored"},   // host copies, more pairs than T0, several fetches
    {4, 8, 1, 6, "view_stored"},    // host copies of filled slots, empty ones, two fetches
    {1, 6, 3, 4, "view_stored"},    // N = 1: lazy statistics, host copies
    {12, 8, 1, 20, "copy_stored"},  // N > T0: the backup rows hold every slot
};

TEST(EngineObserveFaults, EveryPrimitiveCallMayFailOnTheCpusPrimitives) {
  for (const FaultCase& c : kFaultCases) {
    SCOPED_TRACE("N " + std::to_string(c.n) + ", T0 " + std::to_string(c.history) + ", m " +
                 std::to_string(c.m));
    DriveObserveFaults(c, false, false);
  }
}

TEST(EngineObserveFaults, EveryPrimitiveCallMayFailOnDeferredPrimitives) {
  for (const FaultCase& c : kFaultCases) {
    SCOPED_TRACE("N " + std::to_string(c.n) + ", T0 " + std::to_string(c.history) + ", m " +
                 std::to_string(c.m));
    DriveObserveFaults(c, true, false);
  }
}

TEST(EngineObserveFaults, EveryPrimitiveCallMayFailAsynchronously) {
  for (const FaultCase& c : kFaultCases) {
    SCOPED_TRACE("N " + std::to_string(c.n) + ", T0 " + std::to_string(c.history) + ", m " +
                 std::to_string(c.m));
    DriveObserveFaults(c, true, true);
  }
}

}  // namespace
