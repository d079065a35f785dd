// A round's overhead on this machine: measure_round_cost, measure_plain_step,
// triad_bandwidth and the byte model round_bytes (round_cost.hpp).
#include "optex/planning/round_cost.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/adam.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_state.hpp"
#include "optex/util/random.hpp"

namespace optex {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kPointSeed = 0x5eed0001;
constexpr std::uint64_t kGradientSeed = 0x5eed0002;
constexpr double kFloatBytes = 4.0;
constexpr double kAdamSlots = 2.0;  // k: Adam's two moments
constexpr double kLearningRate = 1e-3;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void fill_uniform(std::span<float> v, std::uint64_t seed) {
  SplitMix64 rng(seed);
  for (float& e : v) e = static_cast<float>(rng.uniform(-1.0, 1.0));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void require_count(const char* name, long long value, long long lowest) {
  if (value < lowest) {
    throw std::invalid_argument(std::string(name) + ": must be >= " + std::to_string(lowest) +
                                ", got " + std::to_string(value));
  }
}

// The options a shape stands for; throws naming the field, allocating nothing.
Options shape_options(const RoundShape& shape) {
  if (shape.dim == 0) throw std::invalid_argument("dim: must be >= 1, got 0");
  Options o;
  o.parallelism = shape.parallelism;
  o.history = shape.history;
  o.device = shape.device;
  o.threads = shape.threads;
  o.validate();
  // Floats held at once: the history, the batch's points, gradients and
  // predictions, the precomputed gradients, x and the state, with room to spare.
  const std::size_t rows = 2 * static_cast<std::size_t>(shape.history) +
                           4 * static_cast<std::size_t>(shape.parallelism) + 16;
  if (shape.dim > std::numeric_limits<std::size_t>::max() / sizeof(float) / rows) {
    throw std::invalid_argument("dim: " + std::to_string(shape.dim) +
                                " is too large for any memory (" + std::to_string(rows) +
                                " rows of d floats)");
  }
  return o;
}

}  // namespace

RoundRig::RoundRig(const RoundShape& shape, const Options& base)
    : RoundRig(shape, base, Adam{.lr = kLearningRate}) {}

RoundRig::RoundRig(const RoundShape& shape, const Options& base, const OptimizerRanges& optimizer) {
  Options options = base;
  const Options checked = shape_options(shape);
  options.parallelism = checked.parallelism;
  options.history = checked.history;
  options.device = checked.device;
  options.threads = checked.threads;
  options.validate();
  const std::size_t d = shape.dim;
  const int n = shape.parallelism;
  std::vector<float> x0(d);
  fill_uniform(x0, kPointSeed);
  engine_ = std::make_unique<Engine>(x0, optimizer, options);
  x0 = {};
  gradients_.resize(static_cast<std::size_t>(n) * d);
  fill_uniform(gradients_, kGradientSeed);
  // Falling losses: the commit steps from the last point (ContinueFrom::best_loss).
  losses_.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) losses_[static_cast<std::size_t>(i)] = 1.0 - 0.01 * i;
  const int fill = (shape.history + n - 1) / n + 1;
  for (int r = 0; r < fill; ++r) (void)round();
}

RoundRig::~RoundRig() = default;

RoundTimes RoundRig::round() {
  // device_iterate() drains a device engine's stream, so its work is inside
  // the time; on the CPU it returns at once.
  const std::size_t d = engine_->dim();
  RoundTimes t;
  auto start = Clock::now();
  Batch& batch = engine_->ask();
  (void)engine_->device_iterate();
  t.ask_seconds = seconds_since(start);
  for (int i = 0; i < batch.size(); ++i) {
    batch.set_gradient(
        i, std::span<const float>(gradients_).subspan(static_cast<std::size_t>(i) * d, d));
    batch.loss(i) = losses_[static_cast<std::size_t>(i)];
  }
  batch.upload_staged_gradients();
  start = Clock::now();
  engine_->tell(batch);
  (void)engine_->device_iterate();
  t.tell_seconds = seconds_since(start);
  return t;
}

RoundCost measure_round_cost(const RoundShape& shape, int rounds) {
  (void)shape_options(shape);
  require_count("rounds", rounds, 1);
  RoundRig rig(shape);
  std::vector<double> asks, tells, totals;
  for (int r = 0; r < rounds; ++r) {
    const RoundTimes t = rig.round();
    asks.push_back(t.ask_seconds);
    tells.push_back(t.tell_seconds);
    totals.push_back(t.ask_seconds + t.tell_seconds);
  }
  return {.seconds = median(totals),
          .ask_seconds = median(asks),
          .tell_seconds = median(tells),
          .rounds = rounds};
}

double measure_plain_step(std::size_t dim, int repeats) {
  if (dim == 0) throw std::invalid_argument("dim: must be >= 1, got 0");
  require_count("repeats", repeats, 1);
  const Adam adam{.lr = kLearningRate};
  std::vector<float> x(dim), g(dim);
  fill_uniform(x, kPointSeed);
  fill_uniform(g, kGradientSeed);
  OptimizerState state = init_state(adam, dim);
  apply_step(adam, x, state, g);  // untimed: first touch of the state
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    apply_step(adam, x, state, g);
    times.push_back(seconds_since(start));
  }
  return median(times);
}

Triad::Triad(std::size_t n) {
  if (n == 0) throw std::invalid_argument("n: must be >= 1, got 0");
  a_.assign(n, 0.0f);
  b_.resize(n);
  c_.resize(n);
  fill_uniform(b_, kPointSeed);
  fill_uniform(c_, kGradientSeed);
  volatile float scale = 0.5f;  // opaque: no constant folding
  s_ = scale;
}

void Triad::run(const BlockPool& pool) {
  const std::size_t n = a_.size();
  float* __restrict out = a_.data();
  const float* __restrict in_b = b_.data();
  const float* __restrict in_c = c_.data();
  const float s = s_;
  pool.for_blocks(block_count(n), 3 * sizeof(float) * kCoordinateBlock,
                  [&](std::size_t first, std::size_t last) {
                    const std::size_t end = std::min(n, last * kCoordinateBlock);
                    for (std::size_t i = first * kCoordinateBlock; i < end; ++i)
                      out[i] = in_b[i] + s * in_c[i];
                  });
}

double triad_bandwidth(std::size_t n, int threads, int repeats) {
  require_count("repeats", repeats, 1);
  const BlockPool pool(threads);  // checks threads
  Triad triad(n);
  triad.run(pool);  // untimed: first touch, and the pool's threads start
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    triad.run(pool);
    best = std::min(best, seconds_since(start));
  }
  return triad.bytes() / std::max(best, 1e-12);
}

double round_bytes(const RoundShape& shape) {
  (void)shape_options(shape);
  const double d = static_cast<double>(shape.dim);
  const double n = shape.parallelism;
  const double t0 = shape.history;
  const double k = kAdamSlots;
  // N = 1 makes no proxy step: ask() checks nothing, the staged step measures
  // its length, and the history's statistics wait for their first reader.
  const double predicts = n > 1 ? 1.0 : 0.0;
  const double ask = 2 * d + (n - 1) * (2 * t0 + 4 + 2 * k) * d + predicts * (n + k) * d;
  const double tell = n * d + (3 + 2 * k) * d + 2 * (n - 1) * d + predicts * 2 * d + 4 * n * d +
                      predicts * 2 * (t0 + n) * d;
  return (ask + tell) * kFloatBytes;
}

}  // namespace optex
