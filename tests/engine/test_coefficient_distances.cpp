// Options::proxy_distances = ProxyDistances::coefficients (DESIGN.md section
// 7, "Proxy steps in coefficient space"): for SGD the engine follows the
// direct path's trajectory to fp32 rounding; everywhere the coefficients do
// not apply (Adam, RMSprop, Lion, several optimizer ranges) it is the direct
// path bit for bit; on every device, the deferred primitives included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "support/device_fixture.hpp"
#include "support/engine_equality.hpp"
#include "support/optimizer_configs.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Batch;
using optex::Engine;
using optex::OptimizerRanges;
using optex::Options;
using optex::ProxyDistances;
using optex::test::BitEqual;
using optex::test::OptimizerConfig;
using optex::test::Quartic;
using optex::test::StateBitEqual;
using optex::test::UniformStart;

class CoefficientDistances : public optex::test::OnDevice {};
INSTANTIATE_TEST_SUITE_P(Devices, CoefficientDistances, ::testing::ValuesIn(optex::test::kDevices),
                         optex::test::DeviceName);

constexpr std::size_t kDim = 48;

Engine RunRounds(const OptimizerRanges& optimizer, Options options, int rounds) {
  const Quartic f;
  Engine engine(UniformStart(kDim, 3), optimizer, options);
  for (int r = 0; r < rounds; ++r) {
    Batch& b = engine.ask();
    for (int i = 0; i < b.size(); ++i) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
    engine.tell(b);
  }
  return engine;
}

double LargestDifference(std::span<const float> a, std::span<const float> b) {
  double largest = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    largest = std::max(largest, std::fabs(static_cast<double>(a[k]) - b[k]));
  }
  return largest;
}

Options Shape(Options o, int n, int history) {
  o.parallelism = n;
  o.history = history;
  o.threads = 1;
  return o;
}

// SGD in every configuration, N = 2, 4, 8 over T0 = 1, 3, 8: the coefficient
// path's iterate stays within fp32 rounding of the direct path's (the GP
// weights differ by the rounding of the distances; the steps are the same
// fp32 recurrence), and it is not the direct path in disguise: some run
// differs in its bits.
TEST_P(CoefficientDistances, SgdFollowsTheDirectPathToFp32Rounding) {
  int differing = 0;
  for (const OptimizerConfig& config : optex::test::EveryKind()) {
    if (config.name.rfind("sgd", 0) != 0) continue;
    for (const int n : {2, 4, 8}) {
      for (const int history : {1, 3, 8}) {
        SCOPED_TRACE(config.name + ", N " + std::to_string(n) + ", T0 " + std::to_string(history));
        Options o = On(Shape(Options{}, n, history));
        const Engine direct = RunRounds(config.optimizer, o, 10);
        o.proxy_distances = ProxyDistances::coefficients;
        const Engine coefficients = RunRounds(config.optimizer, o, 10);
        double scale = 1.0;
        for (const float v : direct.iterate()) scale = std::max(scale, std::fabs(double(v)));
        EXPECT_LE(LargestDifference(coefficients.iterate(), direct.iterate()), 1e-4 * scale);
        EXPECT_EQ(coefficients.optimizer_state().step, direct.optimizer_state().step);
        if (!BitEqual(coefficients.iterate(), direct.iterate())) ++differing;
      }
    }
  }
  EXPECT_GT(differing, 0) << "every run matched the direct path bit for bit: the coefficient "
                             "path never ran";
}

// Where the coefficients do not apply, the option changes nothing.
TEST_P(CoefficientDistances, OtherOptimizersAndSeveralRangesTakeTheDirectPathBitForBit) {
  std::vector<OptimizerConfig> configs;
  for (const OptimizerConfig& c : optex::test::EveryKind()) {
    if (c.name.rfind("sgd", 0) != 0) configs.push_back(c);
  }
  for (const OptimizerConfig& c : optex::test::EveryKindInRanges(kDim)) configs.push_back(c);
  for (const OptimizerConfig& config : configs) {
    SCOPED_TRACE(config.name);
    Options o = On(Shape(Options{}, 4, 3));
    const Engine direct = RunRounds(config.optimizer, o, 6);
    o.proxy_distances = ProxyDistances::coefficients;
    const Engine coefficients = RunRounds(config.optimizer, o, 6);
    EXPECT_TRUE(BitEqual(coefficients.iterate(), direct.iterate()));
    EXPECT_TRUE(StateBitEqual(coefficients.optimizer_state(), direct.optimizer_state()));
  }
}

// The same seed gives the same trajectory, whatever the threads.
TEST_P(CoefficientDistances, TheSameRunOnOneTwoAndThreeThreadsIsTheSameBits) {
  const OptimizerRanges sgd = optex::Sgd{.lr = 1e-2, .momentum = 0.9, .nesterov = true};
  Options o = On(Shape(Options{}, 4, 6));
  o.proxy_distances = ProxyDistances::coefficients;
  const Engine one = RunRounds(sgd, o, 8);
  for (const int threads : {2, 3}) {
    o.threads = threads;
    const Engine other = RunRounds(sgd, o, 8);
    EXPECT_TRUE(BitEqual(other.iterate(), one.iterate())) << threads << " threads";
  }
}

}  // namespace
