// The engine's invariants (DESIGN.md sections 2 and 6) on every device: one
// suite, instantiated for Device::cpu(), for the CPU on deferred primitives
// (cpu_deferred: tests/support/deferred_primitives.hpp, a device's late results on the
// CPU) and for Device::cuda(0), so that every backend is held to the same
// assertions, all of them bit for bit:
//
//   - N = 1 is the base optimizer, for every optimizer kind and variant, with
//     per-range hyperparameters, and under a schedule of set_optimizer calls;
//   - Proxy::target gives N * T plain sequential steps;
//   - the same seed and inputs give the same trajectory;
//   - a checkpoint restores a run that continues bit for bit;
//   - a non-finite gradient or loss never enters the history, and the commit
//     steps from the last finite point; values above the magnitude bound and
//     steps that leave it are treated alike, and never stop the engine;
//   - a refused call leaves the engine exactly as it was.
//
// The CUDA instances (names ending in /cuda0, ctest label gpu) skip without a
// CUDA device, or fail when the environment sets OPTEX_REQUIRE_GPU=1. The
// objective is evaluated on the host from the batch's host views unless a test
// says otherwise; the host references are optex::apply_step.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/backend/device_primitives.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/deferred_primitives.hpp"
#include "support/device_fixture.hpp"
#include "support/engine_equality.hpp"
#include "support/gpu_test_support.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

#if OPTEX_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace optex {
// Devices in gtest's messages by name, not as bytes.
inline void PrintTo(const Device& device, std::ostream* os) { *os << device.name(); }
}  // namespace optex

namespace {

namespace fs = std::filesystem;
using optex::Adam;
using optex::Batch;
using optex::Device;
using optex::Engine;
using optex::GradientHistory;
using optex::IterationInfo;
using optex::Lion;
using optex::Optimizer;
using optex::OptimizerRange;
using optex::OptimizerRanges;
using optex::OptimizerState;
using optex::Options;
using optex::Precision;
using optex::RmsProp;
using optex::Sgd;
using optex::detail::ScopedPrimitives;
using optex::test::BitEqual;
using optex::test::DeferredPrimitives;
using optex::test::DeferredStats;
using optex::test::DeviceName;
using optex::test::DeviceParam;
using optex::test::EveryConfig;
using optex::test::kDevices;
using optex::test::OnDevice;
using optex::test::OptimizerConfig;
using optex::test::Quartic;
using optex::test::SameBits;
using optex::test::SameEngine;
using optex::test::StateBitEqual;
using optex::test::UniformStart;
using optex::test::WithN;

// Small enough for a fast suite; kWideDim spans more than one 256-thread block
// of the CUDA kernels, and its ranges start and end inside blocks.
constexpr std::size_t kDim = 40;
constexpr std::size_t kWideDim = 300;
// Over several blocks of the CUDA reductions (reduction_blocks(5000) = 3).
constexpr std::size_t kReductionDim = 5000;

// ---- the fixtures: one instance per device ------------------------------------------

class EngineInvariant : public OnDevice {};
class EngineCheckpoint : public OnDevice {};
class EngineNonFinite : public OnDevice {};
class EngineBadInput : public OnDevice {};

// tests/CMakeLists.txt runs the instances whose name ends in /cuda* with the
// ctest label gpu and the others (cpu, cpu_deferred) without it.
INSTANTIATE_TEST_SUITE_P(Devices, EngineInvariant, ::testing::ValuesIn(kDevices), DeviceName);
INSTANTIATE_TEST_SUITE_P(Devices, EngineCheckpoint, ::testing::ValuesIn(kDevices), DeviceName);
INSTANTIATE_TEST_SUITE_P(Devices, EngineNonFinite, ::testing::ValuesIn(kDevices), DeviceName);
INSTANTIATE_TEST_SUITE_P(Devices, EngineBadInput, ::testing::ValuesIn(kDevices), DeviceName);

// ---- optimizers ---------------------------------------------------------------------

// One of each kind with state worth checking, and two ranges cases.
std::vector<OptimizerConfig> SomeConfigs(std::size_t d) {
  std::vector<OptimizerConfig> some;
  for (OptimizerConfig& c : EveryConfig(d)) {
    if (c.name == "sgd_nesterov" || c.name == "adam" || c.name == "rmsprop_centered_momentum" ||
        c.name == "lion" || c.name == "sgd_ranges_with_and_without_momentum" ||
        c.name == "adamw_ranges") {
      some.push_back(std::move(c));
    }
  }
  return some;
}

// The values of iteration t of a schedule: every third iteration the learning
// rate halves, the weight decay grows, and momentum and betas move a little. At
// iterations 0 and 7 the learning rate is 0, where warmups start and cosine
// schedules end (the state advances, the iterate stays).
Optimizer Scheduled(Optimizer opt, int t) {
  const double k = static_cast<double>(t / 3);
  std::visit(
      [k, t](auto& o) {
        using O = std::decay_t<decltype(o)>;
        o.lr = t == 0 || t == 7 ? 0.0 : o.lr / std::pow(2.0, k);
        o.weight_decay *= 1.0 + 0.25 * k;
        if constexpr (std::is_same_v<O, Sgd> || std::is_same_v<O, RmsProp>) {
          if (o.momentum != 0.0) o.momentum -= 0.05 * k;
        }
        if constexpr (std::is_same_v<O, Adam> || std::is_same_v<O, Lion>) o.beta1 -= 0.01 * k;
        if constexpr (std::is_same_v<O, RmsProp>) o.alpha -= 0.01 * k;
      },
      opt);
  return opt;
}

OptimizerRanges Scheduled(const OptimizerRanges& ranges, int t) {
  if (ranges.covers_any_dimension()) return OptimizerRanges(Scheduled(ranges.front(), t));
  std::vector<OptimizerRange> out;
  for (const OptimizerRange& r : ranges.ranges())
    out.push_back({r.size, Scheduled(r.optimizer, t)});
  return OptimizerRanges(out);
}

// ---- helpers --------------------------------------------------------------------------

bool AllFinite(std::span<const float> a) {
  return std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); });
}

double Norm(std::span<const float> a) {
  double s = 0.0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

// Every point of b evaluated with f through the host views, in index order,
// except point `skip`.
template <class F>
void Evaluate(const F& f, Batch& b, int skip = -1) {
  for (int i = 0; i < b.size(); ++i) {
    if (i != skip) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  }
}

template <class F>
const IterationInfo& Iterate(Engine& e, const F& f) {
  Batch& b = e.ask();
  Evaluate(f, b);
  return e.tell(b);
}

// Writes g into gradient row i where the engine reads it: the device row of a
// device engine (as the caller's own kernels would), the host row of a CPU engine.
void WriteDeviceRow(Batch& b, int i, std::span<const float> g) {
  if (b.device().is_cuda()) {
#if OPTEX_HAVE_CUDA
    ASSERT_EQ(cudaMemcpy(b.device_grad(i), g.data(), g.size_bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    // The batch does not expose the engine's stream: make the copy visible to it.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#else
    FAIL() << "a build without CUDA has no device batch";
#endif
    return;
  }
  std::copy(g.begin(), g.end(), b.device_grad(i));
}

// The iterate where the engine keeps it, copied to the host.
std::vector<float> DeviceIterate(const Engine& e) {
  const float* p = e.device_iterate();
  std::vector<float> out(e.dim());
  if (!e.device().is_cuda()) {
    std::copy(p, p + e.dim(), out.begin());
    return out;
  }
#if OPTEX_HAVE_CUDA
  EXPECT_EQ(cudaMemcpy(out.data(), p, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
#else
  ADD_FAILURE() << "a build without CUDA has no device engine";
#endif
  return out;
}

// Every stored history value is finite.
::testing::AssertionResult HistoryIsFinite(const GradientHistory& h) {
  for (std::size_t j = 0; j < h.size(); ++j) {
    if (!AllFinite(h.point(j))) return ::testing::AssertionFailure() << "point in slot " << j;
    if (!AllFinite(h.gradient(j))) return ::testing::AssertionFailure() << "gradient in slot " << j;
  }
  return ::testing::AssertionSuccess();
}

// The pairs pushed last hold the batch's points `kept` (in increasing order)
// with their gradients, the newest in the newest slot.
::testing::AssertionResult HistoryEndsWith(const GradientHistory& h, const Batch& b,
                                           const std::vector<int>& kept) {
  const std::size_t cap = h.capacity();
  std::size_t slot = h.newest_slot();
  for (std::size_t k = kept.size(); k-- > 0;) {
    const int i = kept[k];
    auto r = BitEqual(h.point(slot), b.point(i));
    if (!r) return r << " (point " << i << " in slot " << slot << ")";
    r = BitEqual(h.gradient(slot), b.grad(i));
    if (!r) return r << " (gradient " << i << " in slot " << slot << ")";
    slot = (slot + cap - 1) % cap;
  }
  return ::testing::AssertionSuccess();
}

// Every field of two IterationInfos, bit for bit (the iterate by content).
::testing::AssertionResult SameInfo(const IterationInfo& a, const IterationInfo& b) {
  if (a.iteration != b.iteration || a.evaluations != b.evaluations ||
      a.committed_point != b.committed_point || a.dropped != b.dropped) {
    return ::testing::AssertionFailure() << "counters or committed point";
  }
  if (!SameBits(a.loss, b.loss) || !SameBits(a.best_loss, b.best_loss)) {
    return ::testing::AssertionFailure() << "loss " << a.loss << " vs " << b.loss << ", best "
                                         << a.best_loss << " vs " << b.best_loss;
  }
  if (!SameBits(a.grad_norm, b.grad_norm)) {
    return ::testing::AssertionFailure() << "grad_norm " << a.grad_norm << " vs " << b.grad_norm;
  }
  if (!SameBits(a.cosine, b.cosine)) {
    return ::testing::AssertionFailure() << "cosine " << a.cosine << " vs " << b.cosine;
  }
  if (!SameBits(a.lengthscale, b.lengthscale)) {
    return ::testing::AssertionFailure() << "lengthscale";
  }
  return BitEqual(a.iterate, b.iterate);
}

// Two engines with the same options and gradients, one evaluated in reverse
// order, agree bit for bit after every iteration: every point, seed,
// prediction, IterationInfo field, and the whole engine.
void ExpectSameTrajectories(const std::vector<float>& x0, const OptimizerRanges& optimizer,
                            const Options& o, int iterations) {
  const Quartic f;
  Engine a(x0, optimizer, o);
  Engine b(x0, optimizer, o);
  for (int t = 0; t < iterations; ++t) {
    SCOPED_TRACE("iteration " + std::to_string(t));
    Batch& ba = a.ask();
    Batch& bb = b.ask();
    for (int i = 0; i < ba.size(); ++i) {
      ASSERT_TRUE(BitEqual(ba.point(i), bb.point(i))) << "point " << i;
      ASSERT_EQ(ba.seed(i), bb.seed(i));
    }
    for (int i = 0; i + 1 < ba.size(); ++i) {
      ASSERT_TRUE(BitEqual(ba.predicted_gradient(i), bb.predicted_gradient(i)))
          << "prediction " << i;
    }
    Evaluate(f, ba);
    for (int i = bb.size() - 1; i >= 0; --i) {
      bb.loss(i) = f.EvaluateWithGradient(bb.point(i), bb.grad(i));
    }
    const IterationInfo ia = a.tell(ba);
    const IterationInfo& ib = b.tell(bb);
    ASSERT_TRUE(SameInfo(ia, ib));
    ASSERT_TRUE(SameEngine(a, b));
  }
  EXPECT_TRUE(AllFinite(a.iterate()));
}

std::vector<char> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- 1. N = 1 is the base optimizer, bit for bit ---------------------------------------

// With N = 1 there are no proxy steps and no fit: each iteration is one step of
// the base optimizer from the gradient at the iterate. On a GPU the step is the
// device's kernel, compiled without contraction and with IEEE division and
// square root, so every bit must still be optex::apply_step's.
TEST_P(EngineInvariant, ParallelismOneIsTheBaseOptimizerBitForBit) {
  const Quartic f;
  const std::size_t d = kWideDim;
  const std::vector<float> x0 = UniformStart(d, 7);
  constexpr int kIterations = 30;
  for (const OptimizerConfig& config : EveryConfig(d)) {
    for (const bool reference : {false, true}) {
      SCOPED_TRACE(config.name + (reference ? " reference" : " default"));
      const Options o = On(reference ? Options::reference(1) : WithN(1));
      Engine engine(x0, config.optimizer, o);
      ASSERT_EQ(engine.device(), device());
      const OptimizerRanges ranges = config.optimizer.for_dimension(d);
      EXPECT_TRUE(engine.optimizer_ranges() == ranges);
      std::vector<float> x = x0;
      OptimizerState s = optex::init_state(ranges, d);
      std::vector<float> g(d);
      std::vector<float> last_point;
      for (int t = 0; t < kIterations; ++t) {
        Batch& b = engine.ask();
        ASSERT_EQ(b.size(), 1);
        ASSERT_TRUE(BitEqual(b.point(0), x)) << "iteration " << t;
        b.loss(0) = f.EvaluateWithGradient(b.point(0), b.grad(0));
        const IterationInfo& info = engine.tell(b);
        last_point = x;
        const double loss = f.EvaluateWithGradient(x, g);
        optex::apply_step(ranges, x, s, g);
        ASSERT_TRUE(BitEqual(engine.iterate(), x)) << "iteration " << t;
        ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), s)) << "iteration " << t;
        EXPECT_EQ(info.committed_point, 0);
        EXPECT_EQ(info.dropped, 0);
        EXPECT_TRUE(SameBits(info.loss, loss));
        EXPECT_TRUE(std::isnan(info.cosine)) << "nothing was predicted";
        EXPECT_NEAR(info.grad_norm, Norm(g), 1e-5 * Norm(g));
        // On a device the view copies the iterate on first use; it reads the same bits.
        EXPECT_EQ(info.iterate.size(), d);
        EXPECT_TRUE(BitEqual(info.iterate, x));
      }
      EXPECT_TRUE(AllFinite(x)) << "a learning rate is too large for this test";
      EXPECT_EQ(engine.optimizer_state().step, kIterations);
      EXPECT_EQ(engine.iteration(), kIterations);
      EXPECT_EQ(engine.evaluations(), kIterations);
      // Every pair entered the history; the newest is the last point's.
      const GradientHistory& h = engine.history();
      EXPECT_EQ(h.size(), std::min<std::size_t>(kIterations, h.capacity()));
      EXPECT_TRUE(BitEqual(h.point(h.newest_slot()), last_point));
      EXPECT_TRUE(BitEqual(h.gradient(h.newest_slot()), g));
    }
  }
}

// A schedule (set_optimizer before every iteration, new values every third):
// with N = 1 still the base optimizer under the same schedule, bit for bit, per
// range too; and device_iterate() is the iterate where the engine keeps it.
TEST_P(EngineInvariant, ScheduledHyperparametersAreTheScheduledBaseOptimizerBitForBit) {
  const Quartic f;
  const std::size_t d = kWideDim;
  const std::vector<float> x0 = UniformStart(d, 9);
  for (const OptimizerConfig& config : EveryConfig(d)) {
    SCOPED_TRACE(config.name);
    Engine engine(x0, config.optimizer, On(WithN(1)));
    std::vector<float> x = x0;
    OptimizerState s = optex::init_state(config.optimizer.for_dimension(d), d);
    std::vector<float> g(d);
    for (int t = 0; t < 12; ++t) {
      const OptimizerRanges scheduled = Scheduled(config.optimizer, t).for_dimension(d);
      engine.set_optimizer(Scheduled(config.optimizer, t));
      ASSERT_TRUE(engine.optimizer_ranges() == scheduled) << "iteration " << t;
      Iterate(engine, f);
      f.EvaluateWithGradient(x, g);
      optex::apply_step(scheduled, x, s, g);
      ASSERT_TRUE(BitEqual(engine.iterate(), x)) << "iteration " << t;
      ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), s)) << "iteration " << t;
    }
    EXPECT_TRUE(AllFinite(x));
    EXPECT_TRUE(BitEqual(DeviceIterate(engine), x));
  }
}

// ---- 2. Proxy::target is N * T plain sequential steps, bit for bit --------------------

TEST_P(EngineInvariant, TargetProxyIsNTimesTSequentialStepsBitForBit) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 11);
  constexpr int kT = 8;
  for (const OptimizerConfig& config : SomeConfigs(kDim)) {
    for (const int n : {2, 4}) {
      SCOPED_TRACE(config.name + " N = " + std::to_string(n));
      Options o = On(WithN(n));
      o.proxy = optex::Proxy::target;
      Engine engine(x0, config.optimizer, o);
      int oracle_calls = 0;
      engine.set_gradient_oracle([&](std::span<const float> x, std::span<float> g) {
        ++oracle_calls;
        return f.EvaluateWithGradient(x, g);
      });
      // The plain sequential trajectory x_0 .. x_{N*T} and its states.
      const OptimizerRanges ranges = config.optimizer.for_dimension(kDim);
      std::vector<std::vector<float>> xs{x0};
      std::vector<OptimizerState> ss{optex::init_state(ranges, kDim)};
      std::vector<float> g(kDim);
      for (int k = 0; k < n * kT; ++k) {
        std::vector<float> x = xs.back();
        OptimizerState s = ss.back();
        f.EvaluateWithGradient(x, g);
        optex::apply_step(ranges, x, s, g);
        xs.push_back(x);
        ss.push_back(s);
      }
      for (int t = 0; t < kT; ++t) {
        Batch& b = engine.ask();
        for (int i = 0; i < n; ++i) {
          ASSERT_TRUE(BitEqual(b.point(i), xs[static_cast<std::size_t>(n * t + i)]))
              << "iteration " << t << " point " << i;
        }
        Evaluate(f, b);
        // The oracle's gradients were the predictions: each is the true gradient.
        for (int i = 0; i + 1 < n; ++i) {
          ASSERT_TRUE(BitEqual(b.predicted_gradient(i), b.grad(i)))
              << "iteration " << t << " row " << i;
        }
        const IterationInfo& info = engine.tell(b);
        const auto next = static_cast<std::size_t>(n * (t + 1));
        ASSERT_TRUE(BitEqual(engine.iterate(), xs[next])) << "iteration " << t;
        ASSERT_TRUE(StateBitEqual(engine.optimizer_state(), ss[next])) << "iteration " << t;
        // True gradients as predictions: the cosine is 1 up to rounding.
        EXPECT_NEAR(info.cosine, 1.0, 1e-9);
      }
      EXPECT_EQ(oracle_calls, (n - 1) * kT);
      // The oracle's sequential calls count as evaluations.
      EXPECT_EQ(engine.evaluations(), static_cast<std::int64_t>((2 * n - 1) * kT));
      EXPECT_EQ(engine.optimizer_state().step, n * kT);
    }
  }
}

// ---- 3. same seed, same inputs, same bits ----------------------------------------------

// Two engines with the same options and gradients, one evaluated in reverse
// order: every point, seed, prediction, IterationInfo field and the whole engine
// (iterate, state, lengthscale, random state, counters, history and its Gram
// statistics) agree bit for bit after every iteration; on a GPU for every
// history storage as well (no floating-point atomics in its reductions).
TEST_P(EngineInvariant, SameSeedSameInputsGiveBitIdenticalTrajectories) {
  const std::vector<float> x0 = UniformStart(kDim, 3);
  Options wrapping = WithN(4, 99);
  wrapping.history = 12;  // wraps during the run
  const std::vector<std::pair<std::string, Options>> option_sets = {
      {"default", WithN(4, 99)}, {"reference", Options::reference(4)}, {"history 12", wrapping}};
  for (const OptimizerConfig& config : SomeConfigs(kDim)) {
    for (const auto& [options_name, base] : option_sets) {
      for (const Precision precision : Precisions()) {
        SCOPED_TRACE(config.name + " " + options_name + " " + optex::precision_name(precision));
        Options o = On(base);
        o.history_precision = precision;
        ASSERT_NO_FATAL_FAILURE(ExpectSameTrajectories(x0, config.optimizer, o, 20));
      }
    }
  }
  // Reductions over several blocks on a GPU (reduction_blocks(5000) = 3).
  const std::vector<float> wide = UniformStart(kReductionDim, 4);
  for (const Precision precision : Precisions()) {
    SCOPED_TRACE(std::string("d = 5000, ") + optex::precision_name(precision));
    Options o = On(wrapping);
    o.history_precision = precision;
    ASSERT_NO_FATAL_FAILURE(ExpectSameTrajectories(wide, Adam{.lr = 1e-2}, o, 8));
  }
}

// ---- 4. checkpoints ----------------------------------------------------------------------

// Saved after k iterations and loaded on the same device, a run continues bit
// for bit: SameEngine with the uninterrupted run right after the load and after
// every further iteration. Saving the loaded engine writes the same bytes, and
// the file also loads on the CPU as the same engine (a bf16 history is saved as
// its fp32 values, which are exact).
TEST_P(EngineCheckpoint, ARestoredRunContinuesBitForBit) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 13, -0.5, 1.5);
  for (const OptimizerConfig& config : SomeConfigs(kDim)) {
    for (const Precision precision : Precisions()) {
      for (const int k : {1, 5}) {
        const std::string label =
            config.name + "_" + optex::precision_name(precision) + "_after_" + std::to_string(k);
        SCOPED_TRACE(label);
        Options o = On(WithN(4, 7));
        o.history = 10;  // wrapped after 3 iterations
        o.history_precision = precision;
        Engine original(x0, config.optimizer, o);
        for (int t = 0; t < k; ++t) Iterate(original, f);
        const std::string path = Path(label + ".ckpt");
        original.save(path);

        Engine restored = Engine::load(path);
        EXPECT_EQ(restored.device(), device());
        EXPECT_EQ(restored.options().history_precision, precision);
        ASSERT_TRUE(SameEngine(restored, original));
        const std::string again = Path(label + ".again.ckpt");
        restored.save(again);
        EXPECT_EQ(ReadBytes(again), ReadBytes(path)) << "saving the loaded engine";

        Engine on_cpu = Engine::load(path, Device::cpu());
        EXPECT_EQ(on_cpu.device(), Device::cpu());
        EXPECT_EQ(on_cpu.options().history_precision, Precision::fp32);
        EXPECT_TRUE(SameEngine(on_cpu, original));

        for (int t = 0; t < 5; ++t) {
          SCOPED_TRACE("iteration " + std::to_string(k + t));
          Batch& a = original.ask();
          Batch& b = restored.ask();
          for (int i = 0; i < a.size(); ++i) {
            ASSERT_TRUE(BitEqual(a.point(i), b.point(i))) << "point " << i;
            ASSERT_EQ(a.seed(i), b.seed(i));
          }
          Evaluate(f, a);
          Evaluate(f, b);
          const IterationInfo ia = original.tell(a);
          const IterationInfo& ib = restored.tell(b);
          ASSERT_TRUE(SameInfo(ia, ib));
          ASSERT_TRUE(SameEngine(restored, original));
        }
        const std::string end_a = Path(label + ".end_a.ckpt");
        const std::string end_b = Path(label + ".end_b.ckpt");
        original.save(end_a);
        restored.save(end_b);
        EXPECT_EQ(ReadBytes(end_a), ReadBytes(end_b));
      }
    }
  }
}

// ---- 5. non-finite gradients and losses -----------------------------------------------

struct NonFiniteCase {
  std::string name;
  int bad_point;
  bool infinite_loss;      // else a NaN or infinity in the gradient row
  std::size_t coordinate;  // of the gradient row
  float value;
  bool through_device_row;  // the row written where the engine reads it
};

// A pair with a NaN or infinite gradient or loss, not at the last point, is
// dropped: it never enters the history, the history holds the other pairs in
// order, and the commit is the normal one from point N-1 (the work state of the
// proxy steps): exactly a host replay of the proxy steps with the batch's
// predictions, then the true step, and exactly what a twin that saw no NaN commits.
TEST_P(EngineNonFinite, ADroppedPairNeverEntersTheHistory) {
  const Quartic f;
  const std::size_t d = kDim;
  const std::vector<float> x0 = UniformStart(d, 13);
  constexpr int kN = 4;
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<NonFiniteCase> cases = {
      {"NaN in the gradient of point 1", 1, false, 3, kNaN, false},
      {"inf loss at point 2", 2, true, 0, 0.0f, false},
      {"inf at the last coordinate of point 2", 2, false, d - 1, kInf, false},
      {"-inf at coordinate 0 of point 1, device row", 1, false, 0, -kInf, true},
      {"NaN at the last coordinate of point 2, device row", 2, false, d - 1, kNaN, true},
      {"NaN in the gradient of point 0", 0, false, 5, kNaN, false},
  };
  for (const OptimizerConfig& config : SomeConfigs(d)) {
    for (const NonFiniteCase& c : cases) {
      SCOPED_TRACE(config.name + ": " + c.name);
      const Options o = On(WithN(kN, 5));
      Engine engine(x0, config.optimizer, o);
      Engine twin(x0, config.optimizer, o);
      for (int t = 0; t < 3; ++t) {
        Iterate(engine, f);
        Iterate(twin, f);
      }
      const std::vector<float> x_before(engine.iterate().begin(), engine.iterate().end());
      const OptimizerState s_before = engine.optimizer_state();
      const std::size_t h = engine.history().size();
      Batch& b = engine.ask();
      if (c.through_device_row) {
        Evaluate(f, b, c.bad_point);
        std::vector<float> g(d);
        b.loss(c.bad_point) = f.EvaluateWithGradient(b.point(c.bad_point), g);
        g[c.coordinate] = c.value;
        ASSERT_NO_FATAL_FAILURE(WriteDeviceRow(b, c.bad_point, g));
      } else {
        Evaluate(f, b);
        if (c.infinite_loss) {
          b.loss(c.bad_point) = std::numeric_limits<double>::infinity();
        } else {
          b.grad(c.bad_point)[c.coordinate] = c.value;
        }
      }
      EXPECT_EQ(engine.nonfinite_points(b), std::vector<int>{c.bad_point});
      const IterationInfo& info = engine.tell(b);
      EXPECT_EQ(info.dropped, 1);
      EXPECT_EQ(info.committed_point, kN - 1);
      EXPECT_TRUE(SameBits(info.loss, b.loss(kN - 1)));
      double best = std::numeric_limits<double>::infinity();
      for (int i = 0; i < kN; ++i) {
        if (i != c.bad_point) best = std::min(best, b.loss(i));
      }
      EXPECT_TRUE(SameBits(info.best_loss, best));

      const GradientHistory& history = engine.history();
      EXPECT_EQ(history.size(), std::min<std::size_t>(h + kN - 1, history.capacity()));
      EXPECT_TRUE(HistoryIsFinite(history));
      std::vector<int> kept;
      for (int i = 0; i < kN; ++i) {
        if (i != c.bad_point) kept.push_back(i);
      }
      EXPECT_TRUE(HistoryEndsWith(history, b, kept));

      // By hand: the N-1 proxy steps with the stored predictions, then the true step.
      const OptimizerRanges ranges = config.optimizer.for_dimension(d);
      std::vector<float> x = x_before;
      OptimizerState s = s_before;
      for (int i = 0; i + 1 < kN; ++i) {
        optex::apply_step(ranges, x, s, b.predicted_gradient(i));
        ASSERT_TRUE(BitEqual(x, b.point(i + 1))) << "proxy point " << i + 1;
      }
      optex::apply_step(ranges, x, s, b.grad(kN - 1));
      EXPECT_TRUE(BitEqual(engine.iterate(), x));
      EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));

      // The twin told the same batch without the bad value: the same commit.
      Iterate(twin, f);
      EXPECT_TRUE(BitEqual(engine.iterate(), twin.iterate()));
      EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), twin.optimizer_state()));
      EXPECT_EQ(twin.history().size(), std::min<std::size_t>(h + kN, history.capacity()));

      // And the engine goes on.
      const IterationInfo& next = Iterate(engine, f);
      EXPECT_EQ(next.dropped, 0);
      EXPECT_TRUE(AllFinite(engine.iterate()));
    }
  }
}

// nonfinite_points names exactly the points tell() would drop, and changes nothing.
TEST_P(EngineNonFinite, NonFinitePointsNamesWhatTellWouldDrop) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 14);
  const Options o = On(WithN(4));
  Engine engine(x0, Adam{.lr = 0.02}, o);
  Engine twin(x0, Adam{.lr = 0.02}, o);
  Iterate(engine, f);
  Iterate(twin, f);
  Batch& b = engine.ask();
  Evaluate(f, b);
  EXPECT_TRUE(engine.nonfinite_points(b).empty());
  b.grad(1)[kDim - 1] = std::numeric_limits<float>::infinity();
  b.loss(2) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(engine.nonfinite_points(b), (std::vector<int>{1, 2}));
  EXPECT_TRUE(engine.pending());
  twin.ask();
  EXPECT_TRUE(SameEngine(engine, twin));
  EXPECT_EQ(engine.tell(b).dropped, 2);

  Engine other(x0, Adam{.lr = 0.02}, o);
  EXPECT_THROW(other.nonfinite_points(b), std::invalid_argument);  // another engine's batch
  EXPECT_THROW(engine.nonfinite_points(b), std::runtime_error);    // nothing pending
}

// When the last points are non-finite the commit steps from the last finite
// point c, with the optimizer state replayed up to it: exactly c host steps with
// the batch's predictions, then the true step at x_c.
TEST_P(EngineNonFinite, ANonFiniteLastPointCommitsFromTheLastFiniteOne) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 17);
  constexpr int kN = 5;
  for (const OptimizerConfig& config : SomeConfigs(kDim)) {
    const OptimizerRanges ranges = config.optimizer.for_dimension(kDim);
    for (const int bad_tail : {1, 2, 4}) {  // how many trailing points are non-finite
      for (const bool reference : {false, true}) {
        SCOPED_TRACE(config.name + " bad tail " + std::to_string(bad_tail) +
                     (reference ? " reference" : " default"));
        const Options o = On(reference ? Options::reference(kN) : WithN(kN));
        Engine engine(x0, config.optimizer, o);
        for (int t = 0; t < 3; ++t) Iterate(engine, f);
        const std::vector<float> x_before(engine.iterate().begin(), engine.iterate().end());
        const OptimizerState s_before = engine.optimizer_state();
        const std::size_t h = engine.history().size();
        Batch& b = engine.ask();
        Evaluate(f, b);
        for (int i = kN - bad_tail; i < kN; ++i) {
          if (i % 2 == 0) {
            b.grad(i)[static_cast<std::size_t>(i)] = std::numeric_limits<float>::infinity();
          } else {
            b.loss(i) = std::numeric_limits<double>::quiet_NaN();
          }
        }
        const int c = kN - 1 - bad_tail;
        const IterationInfo& info = engine.tell(b);
        EXPECT_EQ(info.committed_point, c);
        EXPECT_EQ(info.dropped, bad_tail);
        EXPECT_TRUE(SameBits(info.loss, b.loss(c)));
        const GradientHistory& history = engine.history();
        EXPECT_EQ(history.size(), std::min<std::size_t>(h + static_cast<std::size_t>(kN - bad_tail),
                                                        history.capacity()));
        EXPECT_TRUE(HistoryIsFinite(history));
        std::vector<int> kept;
        for (int i = 0; i <= c; ++i) kept.push_back(i);
        EXPECT_TRUE(HistoryEndsWith(history, b, kept));
        // By hand: c proxy steps from the old state, then the true step at x_c.
        std::vector<float> x = x_before;
        OptimizerState s = s_before;
        for (int i = 0; i < c; ++i) optex::apply_step(ranges, x, s, b.predicted_gradient(i));
        ASSERT_TRUE(BitEqual(x, b.point(c)));
        optex::apply_step(ranges, x, s, b.grad(c));
        EXPECT_TRUE(BitEqual(engine.iterate(), x));
        EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));
        EXPECT_EQ(engine.optimizer_state().step, s_before.step + c + 1);
      }
    }
  }
}

// In the default warm-up nothing moved, so a non-finite last point commits one
// plain step from x0 with the initial state.
TEST_P(EngineNonFinite, ANonFiniteLastPointDuringTheDefaultWarmup) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 19);
  constexpr int kN = 4;
  for (const OptimizerConfig& config : SomeConfigs(kDim)) {
    SCOPED_TRACE(config.name);
    const OptimizerRanges ranges = config.optimizer.for_dimension(kDim);
    Engine engine(x0, config.optimizer, On(WithN(kN)));
    Batch& b = engine.ask();
    Evaluate(f, b);
    b.grad(kN - 1)[1] = std::numeric_limits<float>::quiet_NaN();
    const IterationInfo& info = engine.tell(b);
    EXPECT_EQ(info.committed_point, kN - 2);
    EXPECT_EQ(engine.history().size(), static_cast<std::size_t>(kN - 1));
    EXPECT_TRUE(HistoryIsFinite(engine.history()));
    std::vector<float> x = x0;
    OptimizerState s = optex::init_state(ranges, kDim);
    optex::apply_step(ranges, x, s, b.grad(kN - 2));
    EXPECT_TRUE(BitEqual(engine.iterate(), x));
    EXPECT_TRUE(StateBitEqual(engine.optimizer_state(), s));
  }
}

// No finite pair: tell() throws std::runtime_error naming the cause, the engine
// is bit for bit a twin that never saw the batch, and the batch is still
// pending, unchanged; a finite tell then commits what the twin commits.
TEST_P(EngineNonFinite, AllNonFiniteThrowsAndChangesNothing) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 23);
  constexpr int kN = 4;
  for (const OptimizerConfig& config : SomeConfigs(kDim)) {
    for (const bool only_gradients : {true, false}) {
      SCOPED_TRACE(config.name + (only_gradients ? ": every gradient row non-finite"
                                                 : ": gradients and losses non-finite"));
      const Options o = On(WithN(kN));
      Engine engine(x0, config.optimizer, o);
      Engine twin(x0, config.optimizer, o);
      for (int t = 0; t < 2; ++t) {
        Iterate(engine, f);
        Iterate(twin, f);
      }
      Batch& b = engine.ask();
      twin.ask();
      const std::vector<float> points(b.points().begin(), b.points().end());
      std::vector<std::vector<float>> predicted;
      for (int i = 0; i + 1 < kN; ++i) {
        predicted.emplace_back(b.predicted_gradient(i).begin(), b.predicted_gradient(i).end());
      }
      for (int i = 0; i < kN; ++i) {
        b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
        if (i % 2 == 0) {
          b.grad(i)[static_cast<std::size_t>(i)] = std::numeric_limits<float>::infinity();
        } else if (only_gradients) {
          b.grad(i)[kDim - 1] = std::numeric_limits<float>::quiet_NaN();
        } else {
          b.loss(i) = std::numeric_limits<double>::quiet_NaN();
        }
      }
      EXPECT_EQ(engine.nonfinite_points(b), (std::vector<int>{0, 1, 2, 3}));
      try {
        engine.tell(b);
        ADD_FAILURE() << "tell() accepted a batch with no finite pair";
      } catch (const std::runtime_error& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("non-finite"));
      }
      EXPECT_TRUE(engine.pending());
      EXPECT_TRUE(SameEngine(engine, twin));
      // Also through the flat interface.
      const std::vector<float> grads(static_cast<std::size_t>(kN) * kDim,
                                     std::numeric_limits<float>::infinity());
      const std::vector<double> losses(kN, 1.0);
      EXPECT_THROW(engine.tell(grads, losses), std::runtime_error);
      EXPECT_TRUE(SameEngine(engine, twin));
      // The batch is still pending and unchanged.
      Batch& again = engine.ask();
      EXPECT_EQ(&again, &b);
      EXPECT_TRUE(BitEqual(again.points(), points));
      for (int i = 0; i + 1 < kN; ++i) {
        EXPECT_TRUE(BitEqual(again.predicted_gradient(i), predicted[static_cast<std::size_t>(i)]));
      }
      // Finite values then commit what the twin commits.
      Evaluate(f, again);
      const IterationInfo& info = engine.tell(again);
      EXPECT_EQ(info.dropped, 0);
      EXPECT_EQ(info.committed_point, kN - 1);
      Iterate(twin, f);
      EXPECT_TRUE(SameEngine(engine, twin));
      EXPECT_FALSE(engine.pending());
    }
  }
}

// A refused tell(), then the gradients corrected where the engine reads them (the device
// rows, as the caller's kernels would write them): the retry commits those, not the stale
// rows written through host views for the refused call.
TEST_P(EngineNonFinite, ARetryReadsRowsCorrectedOnTheDevice) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 31);
  constexpr int kN = 3;
  const Options o = On(WithN(kN));
  Engine engine(x0, Adam{.lr = 0.05}, o);
  Engine twin(x0, Adam{.lr = 0.05}, o);
  Iterate(engine, f);
  Iterate(twin, f);
  Batch& b = engine.ask();
  for (int i = 0; i < kN; ++i) {
    b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));  // host views: staged
    b.grad(i)[0] = std::numeric_limits<float>::infinity();
  }
  EXPECT_THROW(engine.tell(b), std::runtime_error);
  std::vector<float> g(kDim);
  for (int i = 0; i < kN; ++i) {
    const std::vector<float> point(b.point(i).begin(), b.point(i).end());
    b.loss(i) = f.EvaluateWithGradient(point, g);
    ASSERT_NO_FATAL_FAILURE(WriteDeviceRow(b, i, g));
  }
  const IterationInfo& info = engine.tell(b);
  EXPECT_EQ(info.dropped, 0);
  Iterate(twin, f);
  EXPECT_TRUE(SameEngine(engine, twin));
}

// ---- huge but finite values (DESIGN.md section 6) --------------------------------------

// A gradient entry above the magnitude bound is dropped exactly as a NaN would be, and
// the engine keeps running with finite points (with SGD and lr 1, 3e38 used to overflow
// into the history; with Adam, 2.4e38 used to make ask() hand out NaN points).
TEST_P(EngineNonFinite, AGradientAboveTheBoundIsDroppedLikeANonFiniteOne) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 37);
  constexpr int kN = 3;
  ASSERT_LT(optex::magnitude_bound(kDim), 3e38f);
  for (OptimizerConfig config : SomeConfigs(kDim)) {
    for (const float huge : {3e38f, 2.4e38f, optex::magnitude_bound(kDim) * 1.0001f}) {
      SCOPED_TRACE(config.name + ", gradient entry " + std::to_string(huge));
      Engine engine(x0, config.optimizer, On(WithN(kN)));
      Engine twin(x0, config.optimizer, On(WithN(kN)));
      for (int t = 0; t < 2; ++t) {
        Iterate(engine, f);
        Iterate(twin, f);
      }
      Batch& b = engine.ask();
      Batch& tb = twin.ask();
      Evaluate(f, b);
      Evaluate(f, tb);
      b.grad(1)[3] = huge;
      tb.grad(1)[3] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_EQ(engine.nonfinite_points(b), (std::vector<int>{1}));
      EXPECT_EQ(engine.tell(b).dropped, 1);
      twin.tell(tb);
      EXPECT_TRUE(SameEngine(engine, twin));
      for (int t = 0; t < 4; ++t) {
        Batch& next = engine.ask();
        ASSERT_TRUE(AllFinite(next.points())) << "iteration " << t;
        Evaluate(f, next);
        engine.tell(next);
      }
    }
  }
}

// SGD with lr 1e10: a gradient of 1e9 is within the bound (about 1e18 at d = 40), but
// its step is not. That pair is dropped like a non-finite one; when every pair's step
// leaves the bound, tell() refuses and nothing changes, the batch rows included.
TEST_P(EngineNonFinite, APairWhoseStepLeavesTheBoundIsDropped) {
  const std::vector<float> x0 = UniformStart(kDim, 41);
  constexpr int kN = 3;
  const Options o = On(WithN(kN));
  const Sgd sgd{.lr = 1e10};
  Engine engine(x0, sgd, o);
  Engine twin(x0, sgd, o);
  const std::size_t n = kN;
  std::vector<float> grads(n * kDim, 1e-3f);
  std::vector<float> twin_grads = grads;
  const std::vector<double> losses(n, 1.0);
  std::fill(grads.begin() + 2 * kDim, grads.end(), 1e9f);
  std::fill(twin_grads.begin() + 2 * kDim, twin_grads.end(),
            std::numeric_limits<float>::quiet_NaN());
  engine.ask();
  twin.ask();
  const IterationInfo& info = engine.tell(grads, losses);
  EXPECT_EQ(info.dropped, 1);
  EXPECT_EQ(info.committed_point, 1);
  EXPECT_EQ(twin.tell(twin_grads, losses).committed_point, 1);
  EXPECT_TRUE(SameEngine(engine, twin));
  EXPECT_TRUE(AllFinite(engine.iterate()));

  // Every step leaves the bound: refused, through both interfaces, changing nothing.
  Batch& b = engine.ask();
  twin.ask();
  for (int i = 0; i < kN; ++i) {
    std::fill(b.grad(i).begin(), b.grad(i).end(), 0.5f);
    b.loss(i) = 2.0;
  }
  const std::vector<float> rows_before(b.grads().begin(), b.grads().end());
  const std::vector<float> overflowing(n * kDim, 1e9f);
  try {
    engine.tell(overflowing, losses);
    ADD_FAILURE() << "tell() committed a step that leaves the bound";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("can be committed"));
  }
  EXPECT_TRUE(SameEngine(engine, twin));
  EXPECT_TRUE(BitEqual(b.grads(), rows_before)) << "the refused tell() kept its rows";
  EXPECT_EQ(b.loss(0), 2.0);
  for (int i = 0; i < kN; ++i) std::fill(b.grad(i).begin(), b.grad(i).end(), 1e9f);
  EXPECT_THROW(engine.tell(b), std::runtime_error);
  EXPECT_TRUE(SameEngine(engine, twin));
  // Gradients whose steps fit then commit what the twin commits.
  const std::vector<float> small(n * kDim, 1e-4f);
  engine.tell(small, losses);
  twin.tell(small, losses);
  EXPECT_TRUE(SameEngine(engine, twin));
}

// A proxy step that leaves the bound (here the oracle's true gradient, 1e9, with SGD
// lr 1e10) makes ask() hold every point at the iterate, as in the warm-up, instead of
// handing out points nobody can use or failing for good.
TEST_P(EngineNonFinite, AProxyStepThatLeavesTheBoundHoldsTheBatch) {
  const std::vector<float> x0 = UniformStart(kDim, 43);
  constexpr int kN = 3;
  Options o = On(WithN(kN));
  o.proxy = optex::Proxy::target;
  Engine engine(x0, Sgd{.lr = 1e10}, o);
  float oracle_gradient = 1e9f;
  engine.set_gradient_oracle([&oracle_gradient](std::span<const float>, std::span<float> g) {
    std::fill(g.begin(), g.end(), oracle_gradient);
    return 0.0;
  });
  const std::size_t n = kN;
  const std::vector<float> small(n * kDim, 1e-4f);
  const std::vector<double> losses(n, 1.0);
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE("iteration " + std::to_string(t));
    const std::vector<float> iterate(engine.iterate().begin(), engine.iterate().end());
    Batch& b = engine.ask();
    for (int i = 0; i < kN; ++i) EXPECT_TRUE(BitEqual(b.point(i), iterate)) << "point " << i;
    for (int i = 0; i + 1 < kN; ++i) {
      const auto p = b.predicted_gradient(i);
      EXPECT_TRUE(std::all_of(p.begin(), p.end(), [](float v) { return v == 0.0f; }));
    }
    const IterationInfo& info = engine.tell(small, losses);
    EXPECT_EQ(info.dropped, 0);
    EXPECT_EQ(info.committed_point, kN - 1);
  }
  // An oracle whose steps fit: the proxy steps move the points again.
  oracle_gradient = 1e-6f;
  Batch& b = engine.ask();
  EXPECT_FALSE(BitEqual(b.point(1), b.point(0)));
}

// ---- 6. a refused call changes nothing ---------------------------------------------------

// An engine a few iterations in and its twin, which will never see the bad calls.
struct Twins {
  Engine engine;
  Engine twin;
};

Twins Warmed(const OptimizerRanges& optimizer, const Options& o, int iterations = 3) {
  const Quartic f;
  const std::vector<float> x0 = UniformStart(kDim, 29);
  Twins t{Engine(x0, optimizer, o), Engine(x0, optimizer, o)};
  for (int i = 0; i < iterations; ++i) {
    Iterate(t.engine, f);
    Iterate(t.twin, f);
  }
  return t;
}

// Both still run, in step.
::testing::AssertionResult StillRunTogether(Twins& t) {
  const Quartic f;
  for (int i = 0; i < 2; ++i) {
    Iterate(t.engine, f);
    Iterate(t.twin, f);
    auto r = SameEngine(t.engine, t.twin);
    if (!r) return r << " (after the refusals, iteration " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

TEST_P(EngineBadInput, FlatTellWithWrongSizesChangesNothing) {
  const Quartic f;
  constexpr int kN = 3;
  Twins t = Warmed(Adam{.lr = 0.02}, On(WithN(kN)));
  Batch& b = t.engine.ask();
  Batch& tb = t.twin.ask();
  Evaluate(f, b);
  Evaluate(f, tb);
  const std::size_t n = kN;
  const std::vector<float> grads(b.grads().begin(), b.grads().end());
  const std::vector<double> losses(b.losses().begin(), b.losses().end());
  const std::vector<float> short_grads(n * kDim - 1, 1.0f);
  const std::vector<float> long_grads(n * kDim + 1, 1.0f);
  const std::vector<double> short_losses(n - 1, 1.0);
  const std::vector<double> long_losses(n + 1, 1.0);
  EXPECT_THROW(t.engine.tell(short_grads, losses), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_THROW(t.engine.tell(long_grads, losses), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_THROW(t.engine.tell(grads, short_losses), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_THROW(t.engine.tell(grads, long_losses), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_THROW(t.engine.tell(std::span<const float>(), std::span<const double>()),
               std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  // The rows the caller wrote are intact: the right sizes commit as the twin does.
  t.engine.tell(grads, losses);
  t.twin.tell(tb);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_TRUE(StillRunTogether(t));
}

TEST_P(EngineBadInput, ABatchOfAnotherEngineOrIterationChangesNothing) {
  const Quartic f;
  constexpr int kN = 3;
  const Options o = On(WithN(kN));
  Twins t = Warmed(Adam{.lr = 0.02}, o);
  Twins other = Warmed(Adam{.lr = 0.02}, o);
  // A copy of this engine's batch from an earlier iteration.
  Batch& earlier = t.engine.ask();
  const Batch stale = earlier;
  Evaluate(f, earlier);
  t.engine.tell(earlier);
  Iterate(t.twin, f);

  Batch& b = t.engine.ask();
  t.twin.ask();
  Batch& foreign = other.engine.ask();
  Evaluate(f, foreign);
  EXPECT_THROW(t.engine.tell(foreign), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_THROW(t.engine.nonfinite_points(foreign), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  Batch stale_copy = stale;
  EXPECT_THROW(t.engine.tell(stale_copy), std::invalid_argument);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  // Other protocol misuse while a batch is pending: save and set_optimizer.
  EXPECT_THROW(t.engine.save(Path("pending.ckpt")), std::runtime_error);
  EXPECT_FALSE(fs::exists(Path("pending.ckpt")));
  EXPECT_THROW(t.engine.set_optimizer(Adam{.lr = 0.01}), std::runtime_error);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  // The other engine's batch was not consumed either.
  EXPECT_TRUE(other.engine.pending());
  EXPECT_EQ(&t.engine.ask(), &b);
  Evaluate(f, b);
  t.engine.tell(b);
  Batch& tb = t.twin.ask();
  Evaluate(f, tb);
  t.twin.tell(tb);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_TRUE(StillRunTogether(t));
}

TEST_P(EngineBadInput, TellWithoutAskChangesNothing) {
  const Quartic f;
  constexpr int kN = 3;
  Twins t = Warmed(Sgd{.lr = 0.01, .momentum = 0.9}, On(WithN(kN)));
  // Told already: the batch object is the engine's own, but nothing is pending.
  Batch& b = t.engine.ask();
  Evaluate(f, b);
  t.engine.tell(b);
  Iterate(t.twin, f);
  EXPECT_THROW(t.engine.tell(b), std::runtime_error);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  const std::vector<float> grads(static_cast<std::size_t>(kN) * kDim, 1.0f);
  const std::vector<double> losses(kN, 1.0);
  EXPECT_THROW(t.engine.tell(grads, losses), std::runtime_error);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_THROW(t.engine.nonfinite_points(b), std::runtime_error);
  EXPECT_TRUE(SameEngine(t.engine, t.twin));
  EXPECT_TRUE(StillRunTogether(t));
}

// set_optimizer refuses another kind, a change of the state layout or the
// algorithm, ranges that do not match the engine's, and bad values, with
// std::invalid_argument; the engine keeps its optimizer, state and everything else.
TEST_P(EngineBadInput, RefusedSetOptimizerChangesNothing) {
  constexpr std::size_t a = kDim / 3;
  constexpr std::size_t b = kDim / 2;
  constexpr std::size_t c = kDim - a - b;
  static_assert(a != b);
  const Sgd r0{.lr = 1e-2};
  const Sgd r1{.lr = 5e-3, .momentum = 0.9, .nesterov = true};
  const Sgd r2{.lr = 2e-2, .momentum = 0.5, .weight_decay = 0.1};
  struct Refusal {
    std::string name;
    OptimizerRanges optimizer;
  };
  struct Case {
    std::string name;
    OptimizerRanges optimizer;
    std::vector<Refusal> refused;
  };
  const std::vector<Case> cases = {
      {"sgd ranges",
       OptimizerRanges{{a, r0}, {b, r1}, {c, r2}},
       {
           {"another kind", OptimizerRanges{{a, Adam{}}, {b, Adam{}}, {c, Adam{}}}},
           {"another kind, one optimizer", Adam{}},
           {"momentum where there was none",
            OptimizerRanges{{a, Sgd{.lr = 1e-2, .momentum = 0.9}}, {b, r1}, {c, r2}}},
           {"no momentum where there was some",
            OptimizerRanges{{a, r0}, {b, Sgd{.lr = 5e-3}}, {c, r2}}},
           {"the sizes in another order", OptimizerRanges{{b, r0}, {a, r1}, {c, r2}}},
           {"sizes that do not add up", OptimizerRanges{{a, r0}, {b, r1}, {c + 1, r2}}},
           {"fewer ranges", OptimizerRanges{{a + b, r1}, {c, r2}}},
           {"one optimizer for every coordinate", r1},
           {"a bad learning rate", OptimizerRanges{{a, r0}, {b, Sgd{.lr = -1.0}}, {c, r2}}},
       }},
      {"adam",
       Adam{.lr = 1e-2},
       {
           {"another kind", Sgd{}},
           {"AdamW for Adam", optex::adamw(1e-2, 0.1)},
           {"two ranges", OptimizerRanges{{kDim - 1, Adam{}}, {1, Adam{}}}},
           {"a NaN learning rate", Adam{.lr = std::numeric_limits<double>::quiet_NaN()}},
           {"beta1 = 1", Adam{.beta1 = 1.0}},
       }},
      {"rmsprop centered with momentum",
       RmsProp{.lr = 1e-3, .momentum = 0.9, .centered = true},
       {
           {"not centered", RmsProp{.lr = 1e-3, .momentum = 0.9}},
           {"no momentum", RmsProp{.lr = 1e-3, .centered = true}},
           {"another kind", Lion{}},
       }},
      {"lion",
       Lion{.lr = 1e-3, .weight_decay = 0.1},
       {
           {"a negative lr", Lion{.lr = -1e-3, .weight_decay = 0.1}},
           {"another kind", RmsProp{}},
       }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Twins t = Warmed(k.optimizer, On(WithN(3)));
    for (const Refusal& r : k.refused) {
      SCOPED_TRACE(r.name);
      EXPECT_THROW(t.engine.set_optimizer(r.optimizer), std::invalid_argument);
      EXPECT_TRUE(SameEngine(t.engine, t.twin));
    }
    EXPECT_TRUE(StillRunTogether(t));
  }
}

}  // namespace
