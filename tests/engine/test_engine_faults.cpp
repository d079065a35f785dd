// Every primitive call of a run may fail (DESIGN.md section 7): for each k,
// an engine whose k-th primitive call throws (tests/support/faulty_primitives.hpp),
// over the CPU's primitives and over deferred ones (tests/support/deferred_primitives.hpp,
// a device's late results and asynchronous errors on the CPU), must
//
//   - leave the engine bit for bit as it was before the ask() or tell() that
//     threw: iterate, optimizer state and step, history and its statistics,
//     counters, random state, pending batch and, for tell(), the batch's rows;
//   - accept the same call again, and end the run bit for bit where an
//     untouched twin on the plain CPU primitives ends it.
//
// The configurations together take every path of the device backend: the GP
// proxy with a ring that wraps and overwrites (N > T0), N = 1 and its lazy
// statistics, several evaluations per point, the adaptive strategy, both
// safeguards, the warm-up variants, the last-gradient and oracle proxies,
// unchanged coordinates, dropped rows, the flat tell(), several optimizers.
// Also the helpers themselves: deferred results are poisoned until the fetch,
// a faulty call throws before it forwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optex/backend/device_primitives.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/coordinate_range.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/history_gram.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/deferred_primitives.hpp"
#include "support/engine_equality.hpp"
#include "support/faulty_primitives.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Batch;
using optex::CoordinateRange;
using optex::Engine;
using optex::HistoryGram;
using optex::IterationInfo;
using optex::OptimizerRanges;
using optex::Options;
using optex::detail::ScopedPrimitives;
using optex::test::BitEqual;
using optex::test::DeferredPrimitives;
using optex::test::DeferredStats;
using optex::test::FaultControl;
using optex::test::FaultyPrimitives;
using optex::test::InjectedFault;
using optex::test::NoisyQuadratic;
using optex::test::SameBits;
using optex::test::SameEngine;
using optex::test::UniformStart;

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

// ---- the configurations -----------------------------------------------------------------

struct Scenario {
  std::string name;
  std::size_t d = 9;
  OptimizerRanges optimizer = optex::Sgd{.lr = 1e-2};
  Options options;
  int rounds = 5;
  bool flat = false;    // the flat tell(gradients, losses)
  bool oracle = false;  // Proxy::target's gradient oracle
  // The oracle's gradients are 1e9 before round `huge_rounds` (1e-6 from
  // then on), the caller's 1e-4 everywhere: with a large learning rate each
  // proxy step leaves the magnitude bound and ask() holds the batch at the
  // iterate, until the oracle's gradients shrink.
  int huge_rounds = 0;
  // Rows whose gradient is NaN in round nan_round (dropped).
  int nan_round = -1;
  std::vector<int> nan_rows;
  // Coordinates the tell of these rounds leaves as they are.
  std::vector<int> unchanged_rounds;
  std::vector<CoordinateRange> unchanged;
  // What the run must take: these primitives, and these safeguard stops.
  std::vector<std::string> primitives;
  std::vector<std::string> chain_stops;
};

// One of tests/support/optimizer_configs.hpp's (the ranges ones need d >= 20).
OptimizerRanges Config(const std::string& name, std::size_t d) {
  for (optex::test::OptimizerConfig& c : optex::test::EveryKind()) {
    if (c.name == name) return c.optimizer;
  }
  for (optex::test::OptimizerConfig& c : optex::test::EveryKindInRanges(d)) {
    if (c.name == name) return c.optimizer;
  }
  throw std::invalid_argument("no optimizer config " + name);
}

Options Small(Options o, int n, int history) {
  o.parallelism = n;
  o.history = history;
  o.threads = 1;
  o.seed = 5;
  return o;
}

Scenario Make(std::string name, std::size_t d, OptimizerRanges optimizer) {
  Scenario s;
  s.name = std::move(name);
  s.d = d;
  s.optimizer = std::move(optimizer);
  return s;
}

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> all;
  {  // The library's defaults: the GP proxy, N = 4 over T0 = 3, so that every
     // commit's pushes wrap the ring and the first ones are skipped; a NaN in
     // the last row (the commit steps from point 2, whose statistics it
     // compared), and unchanged coordinates.
    Scenario s = Make("defaults", 9, Config("adam", 9));
    s.options = Small(Options{}, 4, 3);
    s.nan_round = 3;
    s.nan_rows = {3};
    s.unchanged_rounds = {2, 4};
    s.unchanged = {{1, 2}, {6, 1}};
    s.primitives = {"factor",         "gp_weights",      "squared_distances",
                    "inner_products", "pair_statistics", "copy_stored",
                    "store",          "within_bound",    "step"};
    all.push_back(s);
  }
  // The same with other optimizers: a state of one slot and of none.
  for (const char* kind : {"adamw", "sgd_weight_decay_no_momentum"}) {
    Scenario s = all.front();
    s.name = std::string("defaults_") + kind;
    s.optimizer = Config(kind, 9);
    all.push_back(s);
  }
  {  // A wider engine whose history fills over several rounds (N = 4 over
     // T0 = 6), the marginal likelihood's lengthscale, the reference's input
     // scaling, commits from the last point, 20 optimizer ranges.
    Scenario s = Make("wide", 300, Config("adamw_20_ranges", 300));
    s.options = Small(Options{}, 4, 6);
    s.options.lengthscale_selection = optex::LengthscaleSelection::marginal_likelihood;
    s.options.input_scaling = optex::InputScaling::reference_mean_sqrt_norm;
    s.options.continue_from = optex::ContinueFrom::last;
    s.rounds = 7;
    s.nan_round = 5;
    s.nan_rows = {1, 2};
    s.unchanged_rounds = {4};
    s.unchanged = {{0, 16}, {200, 100}};
    s.primitives = {"factor", "gp_weights", "pair_statistics", "copy_stored"};
    all.push_back(s);
  }
  {  // GP steps whose distances come from the anchor products (coefficient
     // space): the products' pass, the weights' wait between the steps, a
     // commit that renews slots whose pair products must then be redone.
    Scenario s = Make("coefficients", 9, Config("sgd_weight_decay", 9));
    s.options = Small(Options{}, 4, 3);
    s.options.proxy_distances = optex::ProxyDistances::coefficients;
    s.nan_round = 3;
    s.nan_rows = {2};
    s.primitives = {"anchor_products", "gp_weights", "fetch", "step", "store"};
    all.push_back(s);
  }
  {  // N = 1: no proxy step, the statistics left to the first reader.
    Scenario s = Make("n1", 9, Config("sgd_nesterov", 9));
    s.options = Small(Options{}, 1, 3);
    s.rounds = 6;
    s.unchanged_rounds = {3};
    s.unchanged = {{0, 4}};
    s.primitives = {"squared_distances", "store", "copy_stored", "step"};
    all.push_back(s);
  }
  {  // Two evaluations per point: the chain, its expansion and the means; in
     // round 3 both evaluations of point 0 are NaN, in round 4 one of point 1.
    Scenario s = Make("two_evaluations", 9, Config("rmsprop_centered_momentum", 9));
    s.options = Small(Options{}, 4, 3);
    s.options.evaluations_per_point = 2;
    s.rounds = 6;
    s.nan_round = 3;
    s.nan_rows = {0, 1};
    s.primitives = {"mean_of_rows", "zero", "copy", "gp_weights", "fetch"};
    all.push_back(s);
  }
  {  // The adaptive strategy: a warm-up round on one point, then the split.
    Scenario s = Make("adaptive", 9, Config("lion", 9));
    s.options = Small(Options::adaptive(4), 4, 3);
    s.rounds = 6;
    s.nan_round = 4;
    s.nan_rows = {2};
    s.primitives = {"mean_of_rows", "gp_weights", "factor"};
    all.push_back(s);
  }
  {  // Both safeguards, finite: the posterior variance read during the chain,
     // the distance from the iterate; each cuts the chain at least once.
    Scenario s = Make("safeguards", 300, Config("adamw_ranges", 300));
    s.options = Small(Options{}, 4, 4);
    s.options.max_posterior_variance = 0.05;
    s.options.trust_region = 0.9;
    s.rounds = 6;
    s.primitives = {"gp_weights", "squared_distances", "fetch"};
    s.chain_stops = {"posterior_variance", "trust_region"};
    all.push_back(s);
  }
  {  // The reference's warm-up: zero predictions that still step.
    Scenario s = Make("reference_warmup", 9, Config("sgd_momentum", 9));
    s.options = Small(Options::reference(4), 4, 3);
    s.primitives = {"zero", "gp_weights"};
    all.push_back(s);
  }
  {  // The last history gradient as the proxy, per-range hyperparameters,
     // unchanged coordinates that cross the ranges.
    Scenario s = Make("last_gradient", 300, Config("sgd_ranges_with_and_without_momentum", 300));
    s.options = Small(Options{}, 3, 3);
    s.options.proxy = optex::Proxy::last_gradient;
    s.options.warmup = optex::Warmup::zero_gradient;
    s.nan_round = 2;
    s.nan_rows = {1};
    s.unchanged_rounds = {1, 3};
    s.unchanged = {{0, 5}, {95, 20}, {299, 1}};
    s.primitives = {"load", "zero", "step"};
    all.push_back(s);
  }
  {  // Proxy::target: the oracle reads each proxy point on the host.
    Scenario s = Make("oracle", 9, Config("adam_l2", 9));
    s.options = Small(Options{}, 3, 3);
    s.options.proxy = optex::Proxy::target;
    s.oracle = true;
    s.primitives = {"view", "put", "step"};
    all.push_back(s);
  }
  {  // Proxy steps that leave the magnitude bound: ask() holds the batch.
    Scenario s = Make("held", 9, optex::Sgd{.lr = 1e10});
    s.options = Small(Options{}, 3, 3);
    s.options.proxy = optex::Proxy::target;
    s.oracle = true;
    s.huge_rounds = 3;
    s.primitives = {"view", "put", "within_bound", "copy", "zero"};
    all.push_back(s);
  }
  {  // The flat tell(gradients, losses), N = 2 over T0 = 3, a dropped row and
     // unchanged coordinates.
    Scenario s = Make("flat", 300, Config("rmsprop_ranges", 300));
    s.options = Small(Options{}, 2, 3);
    s.flat = true;
    s.rounds = 6;
    s.nan_round = 2;
    s.nan_rows = {0};
    s.unchanged_rounds = {3};
    s.unchanged = {{10, 100}};
    s.primitives = {"gp_weights", "inner_products", "copy_stored"};
    all.push_back(s);
  }
  return all;
}

const NoisyQuadratic kObjective{.sigma = 0.05};

// Round t's gradients and losses at the batch's points (rows N x d).
void Evaluate(const Scenario& s, int t, const Batch& b, std::vector<float>& g,
              std::vector<double>& losses) {
  const std::size_t d = b.dim();
  g.assign(static_cast<std::size_t>(b.size()) * d, 0.0f);
  losses.assign(static_cast<std::size_t>(b.size()), 0.0);
  if (s.huge_rounds > 0) {
    std::fill(g.begin(), g.end(), 1e-4f);
    std::fill(losses.begin(), losses.end(), 1.0);
    return;
  }
  for (int i = 0; i < b.size(); ++i) {
    const auto r = static_cast<std::size_t>(i);
    losses[r] = kObjective.EvaluateWithGradient(b.point(i), {g.data() + r * d, d}, b.seed(i));
  }
  if (t == s.nan_round) {
    for (const int i : s.nan_rows) g[static_cast<std::size_t>(i) * d] = kNaNf;
  }
}

// ---- comparisons --------------------------------------------------------------------------

::testing::AssertionResult SameGram(const HistoryGram& a, const HistoryGram& b) {
  if (a.size() != b.size() || a.next_slot() != b.next_slot() || a.version() != b.version()) {
    return ::testing::AssertionFailure()
           << "history statistics: size " << a.size() << " vs " << b.size() << ", next slot "
           << a.next_slot() << " vs " << b.next_slot() << ", version " << a.version() << " vs "
           << b.version();
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!SameBits(a.squared_norm(i), b.squared_norm(i))) {
      return ::testing::AssertionFailure() << "history statistics: squared norm " << i;
    }
    for (std::size_t j = 0; j < a.size(); ++j) {
      if (!SameBits(a.squared_distance(i, j), b.squared_distance(i, j)) ||
          !SameBits(a.gradient_inner(i, j), b.gradient_inner(i, j))) {
        return ::testing::AssertionFailure() << "history statistics: entry " << i << ", " << j;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

template <class T>
bool SameValues(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

::testing::AssertionResult SameInfo(const IterationInfo& a, const IterationInfo& b) {
  if (a.iteration != b.iteration || a.evaluations != b.evaluations ||
      a.committed_point != b.committed_point || a.dropped != b.dropped) {
    return ::testing::AssertionFailure() << "info: counters or committed point";
  }
  if (!SameBits(a.loss, b.loss) || !SameBits(a.best_loss, b.best_loss) ||
      !SameBits(a.grad_norm, b.grad_norm) || !SameBits(a.cosine, b.cosine) ||
      !SameBits(a.lengthscale, b.lengthscale) || !SameBits(a.gradient_noise, b.gradient_noise)) {
    return ::testing::AssertionFailure()
           << "info: loss " << a.loss << " vs " << b.loss << ", grad_norm " << a.grad_norm << " vs "
           << b.grad_norm << ", cosine " << a.cosine << " vs " << b.cosine << ", gradient noise "
           << a.gradient_noise << " vs " << b.gradient_noise;
  }
  if (std::strcmp(a.chain_stop, b.chain_stop) != 0 || a.point_evaluations != b.point_evaluations ||
      !SameValues(a.posterior_variance, b.posterior_variance) ||
      !SameValues(a.prediction_error, b.prediction_error)) {
    return ::testing::AssertionFailure()
           << "info: chain stop (" << a.chain_stop << " vs " << b.chain_stop
           << "), evaluations, variances or prediction errors";
  }
  auto r = BitEqual(a.iterate, b.iterate);
  if (!r) return r << " (info iterate)";
  return ::testing::AssertionSuccess();
}

// Everything a caller can see of two engines, bit for bit.
::testing::AssertionResult SameState(const Engine& a, const Engine& b) {
  auto r = SameEngine(a, b);
  if (!r) return r;
  r = SameGram(a.history_statistics(), b.history_statistics());
  if (!r) return r;
  if (a.optimizer_step() != b.optimizer_step()) {
    return ::testing::AssertionFailure() << "optimizer_step";
  }
  if (a.iteration() > 0) {
    r = SameInfo(a.last_info(), b.last_info());
    if (!r) return r << " (last_info)";
  }
  return ::testing::AssertionSuccess();
}

// The rows of two batches: points, seeds and, with `values`, gradients and losses.
::testing::AssertionResult SameBatch(const Batch& a, const Batch& b, bool values) {
  if (a.size() != b.size() || a.iteration() != b.iteration()) {
    return ::testing::AssertionFailure() << "batch: size or iteration";
  }
  for (int i = 0; i < a.size(); ++i) {
    auto r = BitEqual(a.point(i), b.point(i));
    if (!r) return r << " (batch point " << i << ")";
    if (a.seed(i) != b.seed(i)) return ::testing::AssertionFailure() << "batch seed " << i;
    if (!values) continue;
    r = BitEqual(a.grad(i), b.grad(i));
    if (!r) return r << " (batch gradient " << i << ")";
    if (!SameBits(a.loss(i), b.loss(i))) {
      return ::testing::AssertionFailure() << "batch loss " << i;
    }
  }
  return ::testing::AssertionSuccess();
}

// Where a run stands, for messages: the fault and the calls before it.
std::string Where(const FaultControl& control, std::int64_t k) {
  std::ostringstream out;
  out << "k = " << k << " (" << control.last_fault() << "); calls up to it:";
  const std::vector<const char*>& names = control.names();
  const std::int64_t last = std::min<std::int64_t>(k, static_cast<std::int64_t>(names.size()));
  for (std::int64_t i = std::max<std::int64_t>(0, last - 12); i < last; ++i) {
    out << ' ' << i + 1 << ':' << names[static_cast<std::size_t>(i)];
  }
  return out.str();
}

// ---- one run ------------------------------------------------------------------------------

struct RunRecord {
  std::int64_t calls = 0;             // counted primitive calls of the rounds
  std::int64_t faults = 0;            // faults thrown
  std::set<std::string> primitives;   // the primitives the rounds called
  std::set<std::string> chain_stops;  // the safeguards that cut a chain
  DeferredStats deferred;             // the deferred primitives' counters
};

// Drives a twin on the plain CPU primitives and an engine on faulty ones
// (armed at its k-th call, unless k is 0) through the scenario in lockstep.
// Every ask() and tell() of the test engine that throws the injected fault
// must leave it as the twin is before the same call; the call is then
// repeated. Fatal failures end the run.
void Drive(const Scenario& s, bool deferred, bool asynchronous, std::int64_t k, RunRecord& run) {
  FaultControl control;
  control.deferred = deferred;
  control.asynchronous = asynchronous;
  control.deferred_stats = &run.deferred;
  control.log = true;
  const std::vector<float> x0 = UniformStart(s.d, 17, -0.5, 1.5);
  Engine twin(x0, s.optimizer, s.options);
  std::optional<Engine> engine;
  {
    const ScopedPrimitives scope(&FaultyPrimitives::factory, &control);
    engine.emplace(x0, s.optimizer, s.options);
  }
  Engine& test = *engine;
  int round = 0;
  if (s.oracle) {
    const auto oracle = [&s, &round](std::span<const float> x, std::span<float> g) {
      if (s.huge_rounds > 0) {
        std::fill(g.begin(), g.end(), round < s.huge_rounds ? 1e9f : 1e-6f);
        return 0.0;
      }
      return kObjective.EvaluateWithGradient(x, g, 0);
    };
    twin.set_gradient_oracle(oracle);
    test.set_gradient_oracle(oracle);
  }
  control.reset();
  control.arm(k);

  std::vector<float> g;
  std::vector<double> losses;
  for (int t = 0; t < s.rounds; ++t, ++round) {
    SCOPED_TRACE("round " + std::to_string(t));
    // ask(): once more after a fault.
    Batch* batch = nullptr;
    for (int attempt = 0; batch == nullptr; ++attempt) {
      try {
        batch = &test.ask();
      } catch (const InjectedFault& e) {
        const FaultControl::Pause pause(control);
        ASSERT_EQ(attempt, 0) << "a second fault: " << e.what();
        ASSERT_TRUE(SameState(test, twin))
            << "ask() threw and changed the engine; " << Where(control, k);
        ASSERT_FALSE(test.pending());
      }
    }
    Batch& twin_batch = twin.ask();
    {
      const FaultControl::Pause pause(control);
      ASSERT_TRUE(test.pending());
      ASSERT_TRUE(SameBatch(*batch, twin_batch, false))
          << "ask() gave other points than the twin's" << (k > 0 ? "; " + Where(control, k) : "");
    }

    if (s.huge_rounds > 0) {  // the scenario holds what it is for: held batches, then moving ones
      ASSERT_EQ(SameBits(twin_batch.point(1), twin_batch.point(0)), t < s.huge_rounds);
    }
    Evaluate(s, t, twin_batch, g, losses);
    const bool keep = std::find(s.unchanged_rounds.begin(), s.unchanged_rounds.end(), t) !=
                      s.unchanged_rounds.end();
    const std::span<const CoordinateRange> unchanged =
        keep ? std::span<const CoordinateRange>(s.unchanged) : std::span<const CoordinateRange>();
    if (!s.flat) {
      for (Batch* b : {batch, &twin_batch}) {
        for (int i = 0; i < b->size(); ++i) {
          b->set_gradient(i, {g.data() + static_cast<std::size_t>(i) * s.d, s.d});
          b->loss(i) = losses[static_cast<std::size_t>(i)];
        }
      }
    }
    // tell(): once more after a fault.
    const IterationInfo* info = nullptr;
    for (int attempt = 0; info == nullptr; ++attempt) {
      try {
        info = s.flat ? &test.tell(g, losses, unchanged) : &test.tell(*batch, unchanged);
      } catch (const InjectedFault& e) {
        const FaultControl::Pause pause(control);
        ASSERT_EQ(attempt, 0) << "a second fault: " << e.what();
        ASSERT_TRUE(test.pending())
            << "tell() threw and left no pending batch; " << Where(control, k);
        ASSERT_TRUE(SameState(test, twin))
            << "tell() threw and changed the engine; " << Where(control, k);
        ASSERT_TRUE(SameBatch(*batch, twin_batch, true))
            << "tell() threw and changed the batch; " << Where(control, k);
      }
    }
    const IterationInfo& twin_info =
        s.flat ? twin.tell(g, losses, unchanged) : twin.tell(twin_batch, unchanged);
    {
      const FaultControl::Pause pause(control);
      ASSERT_TRUE(SameInfo(*info, twin_info))
          << "tell() told another story than the twin's" << (k > 0 ? "; " + Where(control, k) : "");
    }
    if (*twin_info.chain_stop != '\0') run.chain_stops.insert(twin_info.chain_stop);
  }
  run.calls = control.calls();
  run.faults = control.faults();
  for (const char* name : control.names()) run.primitives.insert(name);
  const FaultControl::Pause pause(control);
  ASSERT_TRUE(SameState(test, twin))
      << "the run ended elsewhere than the twin's" << (k > 0 ? "; " + Where(control, k) : "");
}

// ---- the suite ------------------------------------------------------------------------------

struct FaultParam {
  std::string scenario;
  bool deferred;
  // The armed call loses its work and the fault surfaces at the next wait,
  // as a device's asynchronous error does (deferred primitives only).
  bool asynchronous = false;
};

void PrintTo(const FaultParam& p, std::ostream* os) {
  *os << p.scenario
      << (p.asynchronous ? " with asynchronous faults"
          : p.deferred   ? " on deferred primitives"
                         : " on the CPU's");
}

class EngineFaults : public ::testing::TestWithParam<FaultParam> {};

std::vector<FaultParam> FaultParams() {
  std::vector<FaultParam> params;
  for (const Scenario& s : Scenarios()) {
    params.push_back({s.name, false});
    params.push_back({s.name, true});
    params.push_back({s.name, true, true});
  }
  return params;
}

std::string FaultName(const ::testing::TestParamInfo<FaultParam>& info) {
  return info.param.scenario + (info.param.asynchronous ? "_async"
                                : info.param.deferred   ? "_deferred"
                                                        : "_cpu");
}

// The run without a fault takes every path the scenario is for and ends as
// the twin's; then every one of its K primitive calls fails once, in its own run.
TEST_P(EngineFaults, EveryPrimitiveCallMayFailAndTheCallCanBeRepeated) {
  Scenario scenario;
  for (const Scenario& s : Scenarios()) {
    if (s.name == GetParam().scenario) scenario = s;
  }
  const bool deferred = GetParam().deferred;
  const bool asynchronous = GetParam().asynchronous;

  RunRecord clean;
  ASSERT_NO_FATAL_FAILURE(Drive(scenario, deferred, asynchronous, 0, clean));
  ASSERT_EQ(clean.faults, 0);
  const std::int64_t calls = clean.calls;
  ASSERT_GT(calls, 0);
  for (const std::string& p : scenario.primitives) {
    EXPECT_TRUE(clean.primitives.count(p)) << "the run never called " << p;
  }
  for (const std::string& stop : scenario.chain_stops) {
    EXPECT_TRUE(clean.chain_stops.count(stop)) << "no chain was cut by " << stop;
  }
  if (deferred) {
    EXPECT_GT(clean.deferred.queued, 0);
    EXPECT_GT(clean.deferred.poisoned, 0);
  }
  std::printf("[ %s ] %lld primitive calls", FaultName({GetParam(), 0}).c_str(),
              static_cast<long long>(calls));
  if (deferred) {
    std::printf(", %lld queued, %lld fetches, %lld outputs poisoned, %lld left unpoisoned",
                static_cast<long long>(clean.deferred.queued),
                static_cast<long long>(clean.deferred.fetches),
                static_cast<long long>(clean.deferred.poisoned),
                static_cast<long long>(clean.deferred.poison_skipped));
  }
  std::printf("\n");

  for (std::int64_t k = 1; k <= calls; ++k) {
    SCOPED_TRACE("fault at call " + std::to_string(k) + " of " + std::to_string(calls));
    RunRecord run;
    Drive(scenario, deferred, asynchronous, k, run);
    if (HasFailure()) break;  // the first k that fails says it all
    ASSERT_EQ(run.faults, 1) << "call " << k << " never came";
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, EngineFaults, ::testing::ValuesIn(FaultParams()), FaultName);

// ---- the helpers themselves -----------------------------------------------------------------

// A queued result is poison until the fetch that brings it; then it is the
// CPU's, as is everything queued before.
TEST(DeferredPrimitives, ResultsArePoisonUntilTheFetch) {
  DeferredStats stats;
  DeferredPrimitives p(optex::detail::make_cpu_primitives(1), &stats);
  float* a = p.floats(3);
  float* b = p.floats(3);
  double* out = p.doubles(2);
  int* flags = p.ints(1);
  const std::vector<float> host = {1.0f, 2.0f, 3.0f};
  p.put(host.data(), a, 3 * sizeof(float));
  p.copy(a, b, 3);
  p.dot(a, b, 3, out);
  p.within_bound(a, 1, 3, 2.5f, flags);
  EXPECT_TRUE(std::isnan(out[0])) << "read before the fetch";
  EXPECT_EQ(flags[0], optex::test::kPoisonInt);
  EXPECT_EQ(b[0], 0.0f) << "the copy ran before the fetch";
  EXPECT_EQ(p.pending(), 4u);
  double result = 0.0;
  int flag = -1;
  const optex::detail::Fetch values[] = {optex::detail::fetch_of<double>(out, &result, 1),
                                         optex::detail::fetch_of<int>(flags, &flag, 1)};
  p.fetch(values);
  EXPECT_EQ(result, 14.0);
  EXPECT_EQ(flag, 0) << "3 is above the bound";
  EXPECT_EQ(p.pending(), 0u);
  EXPECT_EQ(stats.fetches, 1);
  EXPECT_EQ(stats.calls, 9);
  EXPECT_TRUE(p.host_memory());
  EXPECT_FALSE(p.copies_cannot_fail());
}

// Host memory handed to put() is read when the queue runs; a synchronous view
// runs the queue first.
TEST(DeferredPrimitives, PutReadsTheHostAtTheWaitAndViewsWait) {
  DeferredPrimitives p(optex::detail::make_cpu_primitives(1));
  float* a = p.floats(2);
  std::vector<float> host = {1.0f, 2.0f};
  p.put(host.data(), a, 2 * sizeof(float));
  host[1] = 5.0f;  // the contract forbids it: the copy sees the change
  std::vector<float> scratch;
  const float* seen = p.view(a, 2, scratch);
  EXPECT_EQ(seen[0], 1.0f);
  EXPECT_EQ(seen[1], 5.0f);
  EXPECT_EQ(p.pending(), 0u);
}

// An fp64 output that queued work still reads is not poisoned.
TEST(DeferredPrimitives, AnOutputQueuedWorkStillReadsIsNotPoisoned) {
  DeferredStats stats;
  DeferredPrimitives p(optex::detail::make_cpu_primitives(1), &stats);
  double* distances = p.doubles(1);
  double* weights = p.doubles(1);
  double* variance = p.doubles(1);
  int* info = p.ints(1);
  const std::vector<double> k = {1.0};
  p.factor(k.data(), 1, info);
  p.gp_weights(distances, 1, optex::Covariance::matern52, 1.0, weights, variance, info);
  const float* x = p.floats(1);
  const optex::detail::StoredRows rows = optex::detail::fp32_rows(x);
  p.squared_distances(rows, 1, 1, {&rows, 1}, distances, nullptr);  // gp_weights still reads it
  EXPECT_EQ(stats.poison_skipped, 1);
  EXPECT_EQ(distances[0], 0.0);
  p.fetch({});
  EXPECT_EQ(stats.drains, 1);
}

// The armed call throws before it forwards, once; counting pauses on request.
TEST(FaultyPrimitives, TheArmedCallThrowsOnceBeforeItForwards) {
  FaultControl control;
  auto p = FaultyPrimitives::factory(1, &control);
  float* a = p->floats(2);
  EXPECT_EQ(control.calls(), 1);
  control.arm(2);
  p->zero(a, 2);  // call 1 of the armed count
  const std::vector<float> host = {1.0f, 2.0f};
  EXPECT_THROW(p->put(host.data(), a, 2 * sizeof(float)), InjectedFault);
  EXPECT_EQ(a[0], 0.0f) << "the faulty call forwarded";
  EXPECT_FALSE(control.armed());
  EXPECT_EQ(control.faults(), 1);
  EXPECT_EQ(control.last_fault(), "put");
  p->put(host.data(), a, 2 * sizeof(float));
  p->fetch({});
  EXPECT_EQ(a[1], 2.0f);
  EXPECT_EQ(control.calls(), 5);
  {
    const FaultControl::Pause pause(control);
    control.arm(1);
    p->fetch({});  // not counted, not faulted
  }
  EXPECT_EQ(control.calls(), 5);
  EXPECT_THROW(p->fetch({}), InjectedFault) << "a fetch may be the faulty call";
  EXPECT_FALSE(p->copies_cannot_fail());
}

// Asynchronously, the armed call that enqueues returns and loses its work;
// the fault surfaces at the next wait, once.
TEST(FaultyPrimitives, AnAsynchronousFaultLosesTheWorkAndSurfacesAtTheNextWait) {
  FaultControl control;
  control.asynchronous = true;
  control.deferred = true;
  auto p = FaultyPrimitives::factory(1, &control);
  float* a = p->floats(2);
  const std::vector<float> host = {1.0f, 2.0f};
  control.arm(2);
  p->put(host.data(), a, 2 * sizeof(float));
  p->zero(a, 2);  // armed: lost
  EXPECT_EQ(control.faults(), 1);
  EXPECT_THROW(p->fetch({}), InjectedFault);
  p->fetch({});  // once
  EXPECT_EQ(a[1], 2.0f) << "the lost zero() ran";
  control.arm(1);
  EXPECT_THROW(p->fetch({}), InjectedFault) << "an armed wait throws at once";
}

}  // namespace
