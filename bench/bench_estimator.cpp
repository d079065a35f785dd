// CPU cost of the engine's GP passes against a STREAM-like triad.
//
// DESIGN.md section 4: a proxy step and a Gram update are memory-bound passes
// over the history, so the figure of merit is bytes moved per second, compared
// with the triad measured in the same process at the same d and on the same
// threads. Every benchmark takes a thread count (the last argument): 1 and
// every core of the machine; the triad runs on a BlockPool of that many
// threads, the engine's passes on its CPU primitives' own pool of as many.
//
// The GP benchmarks drive what Engine runs: its device backend on the CPU's
// primitives (optex::detail::make_cpu_backend), with Adam and a history of
// T0 pairs, N = 4.
//
//   BM_Triad      a[i] = b[i] + s * c[i] over float arrays of d.
//   BM_ProxyStep  one GP proxy step of the backend (ProxySource::gp, as
//                 Engine::ask() takes it): the distance pass from the point
//                 to the T0 history points, the weights (gp_weights), then
//                 the GP mean, the copy of the point and the Adam update in
//                 one pass.
//   BM_Fit        N = 4 pairs into the full history with the backend's
//                 observe() (the pushes of a commit: one pass over the points
//                 and one over the gradients for all of them), then the
//                 backend's fit().
//   BM_FitOnePairAtATime
//                 the same with N successive observe() calls of one pair: the
//                 unfused passes a commit's pushes replace, side by side.
//   BM_OptimizerStep/<name>
//                 one plain optex::apply_step of every base optimizer (by its
//                 optimizer_from_name name, with its defaults): the
//                 elementwise pass that ends every proxy step and the commit.
//
// Byte counts (4-byte floats; every array counted once per pass that must touch
// it; writes counted once, no write-allocate traffic, as STREAM does):
//   triad  3 d                      read b, c; write a
//   proxy  (2 T0 + 8) d             the distance pass: read X (T0 d) and the point
//                                   x (d); the fused pass: read G (T0 d), write mu
//                                   (d), read x and write the next point (2 d),
//                                   read and write m and v (4 d)
//   step   (3 + 2 k) d              read x and g, write x; read and write the
//                                   optimizer's k state slots
//   fit    (2 T0 + 6 N) d           observe: read the N new points and gradients
//                                   and write them into their slots (4 N d), read
//                                   X (T0 d) and the N queries (N d, their norms in
//                                   the same pass), read G (T0 d) and the N
//                                   queries (N d); fit itself is T0 x T0 and
//                                   counted as 0 bytes
//   fit, one pair at a time
//          N (2 T0 + 5) d           per observe: 4 d of copies, X (T0 d) and the
//                                   query (d), its norm (d), G (T0 d).
//
// Counters: bytes_per_second (SetBytesProcessed, over the benchmark's real
// time); triad_ratio = step bandwidth / BM_Triad's bandwidth at the same d and
// threads (BM_Triad runs first; at d <= 1e6 its 3 d floats fit in the 32 MiB
// L3, the history does not); paired_triad_ratio = step bandwidth / bandwidth of
// one untimed triad pass over d floats on the same threads, run before every
// measured step, each from its fastest iteration in wall time, so on a shared
// machine both see the same load and the triad's arrays have been evicted by
// the step, as the step's have. Reported times are wall-clock (UseRealTime).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "optex/backend/block_pool.hpp"
#include "optex/backend/device.hpp"
#include "optex/backend/engine_backend.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/adam.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/optimizers/optimizer_state.hpp"
#include "optex/planning/round_cost.hpp"
#include "optex/sharded/coordinate_shard.hpp"
#include "optex/util/random.hpp"

namespace {

constexpr std::int64_t kDims[] = {10'000, 100'000, 1'000'000, 10'000'000};
constexpr std::int64_t kHistories[] = {8, 32, 64};
constexpr std::size_t kNewPairs = 4;  // N of BM_Fit
constexpr double kFloat = sizeof(float);

// Triad bandwidth in bytes per second of the last (final) run at each (d, threads).
std::map<std::pair<std::int64_t, int>, double>& triad_bandwidth() {
  static std::map<std::pair<std::int64_t, int>, double> bw;
  return bw;
}

// One pool per thread count, kept for the whole run (its workers start once).
const optex::BlockPool& pool(int threads) {
  static std::map<int, std::unique_ptr<optex::BlockPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<optex::BlockPool>(threads);
  return *p;
}

void fill_uniform(std::span<float> v, optex::SplitMix64& rng) {
  for (float& e : v) e = static_cast<float>(rng.uniform(-1.0, 1.0));
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The engine's backend on the CPU's primitives with a full history, and
// everything a proxy step and a fit need. Only one exists at a time: at
// d = 1e7, T0 = 64 the history alone is 5.1 GB.
struct Setup {
  std::size_t d;
  std::size_t t0;
  double lengthscale;
  std::vector<float> new_points;     // kNewPairs x d
  std::vector<float> new_gradients;  // kNewPairs x d
  std::unique_ptr<optex::detail::EngineBackend> backend;
  optex::Batch batch;   // N rows: the proxy step writes point 1 from point 0
  optex::Triad paired;  // triad passes interleaved with the measured steps
  std::uint64_t pushes = 0;

  Setup(std::size_t dim, std::size_t capacity)
      : d(dim),
        t0(capacity),
        // Independent uniform points in [-1, 1]^d lie about sqrt(2 d / 3) apart:
        // with lengthscale sqrt(d) the kernel values sit near 0.5, far from
        // underflow, and the Gram matrix is well conditioned.
        lengthscale(std::sqrt(static_cast<double>(dim))),
        new_points(kNewPairs * dim),
        new_gradients(kNewPairs * dim),
        paired(dim) {
    optex::SplitMix64 rng(0x5eed'0000 + dim * 131 + capacity);
    std::vector<float> x0(dim);
    fill_uniform(x0, rng);
    optex::Options options;
    options.parallelism = static_cast<int>(kNewPairs);
    options.history = static_cast<int>(capacity);
    options.kernel = optex::Covariance::matern52;
    options.noise = 1e-3;
    options.input_scaling = optex::InputScaling::none;
    const optex::OptimizerRanges adam =
        optex::OptimizerRanges(optex::Adam{.lr = 1e-3}).for_dimension(dim);
    backend =
        optex::detail::make_cpu_backend(x0, adam, options, optex::CoordinateShard::whole(dim));
    optex::detail::BatchAccess::allocate(batch, options.parallelism, dim, optex::Device::cpu());
    // In chunks of up to kNewPairs pairs, each chunk in one pass.
    for (std::size_t j = 0; j < capacity; j += kNewPairs) {
      const std::size_t count = std::min(kNewPairs, capacity - j);
      fill_uniform({new_points.data(), count * dim}, rng);
      fill_uniform({new_gradients.data(), count * dim}, rng);
      backend->observe({new_points.data(), count * dim}, {new_gradients.data(), count * dim});
    }
    fill_uniform(new_points, rng);
    fill_uniform(new_gradients, rng);
    backend->fit(lengthscale);
    backend->begin_batch(batch);  // point 0 := the iterate
  }
};

Setup& setup(std::size_t d, std::size_t t0) {
  static std::unique_ptr<Setup> current;
  if (!current || current->d != d || current->t0 != t0) {
    current.reset();  // free the old history before allocating the new one
    current = std::make_unique<Setup>(d, t0);
  }
  return *current;
}

// Runs `step` once per benchmark iteration, each preceded by one untimed
// (PauseTiming) triad pass over d floats, then sets the counters:
//   triad_ratio         step bandwidth / BM_Triad's bandwidth at the same d, both
//                       in mean wall time (needs BM_Triad at that d earlier in
//                       this process)
//   paired_triad_ratio  step bandwidth / triad bandwidth, each from its fastest
//                       iteration in wall time: the triad passes run between
//                       the steps, on the same threads, under the same load and
//                       from the same cache state (the step has evicted the
//                       triad's arrays)
// Step bandwidth for bytes_per_second and triad_ratio = bytes_per_iteration *
// iterations / (sum of the step wall times).
template <class Step>
void run_paired(benchmark::State& state, std::size_t d, int threads, optex::Triad& paired,
                double bytes_per_iteration, Step step) {
  double step_wall = 0.0;
  double step_min = std::numeric_limits<double>::infinity();
  double triad_min = std::numeric_limits<double>::infinity();
  for (auto _ : state) {
    state.PauseTiming();
    const auto w0 = Clock::now();
    paired.run(pool(threads));
    triad_min = std::min(triad_min, seconds_since(w0));
    state.ResumeTiming();
    const auto w1 = Clock::now();
    step();
    const double took = seconds_since(w1);
    step_min = std::min(step_min, took);
    step_wall += took;
  }
  const double moved = bytes_per_iteration * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(moved));
  if (const auto it = triad_bandwidth().find({static_cast<std::int64_t>(d), threads});
      it != triad_bandwidth().end()) {
    state.counters["triad_ratio"] = moved / step_wall / it->second;
  }
  const double triad_bytes = 3.0 * kFloat * static_cast<double>(d);
  state.counters["paired_triad_ratio"] =
      (bytes_per_iteration / step_min) / (triad_bytes / triad_min);
  state.counters["threads"] = threads;
}

void BM_Triad(benchmark::State& state) {
  const std::int64_t d = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  optex::Triad t(static_cast<std::size_t>(d));
  const double bytes = 3.0 * kFloat * static_cast<double>(d);
  const auto start = Clock::now();
  for (auto _ : state) t.run(pool(threads));
  const double moved = bytes * static_cast<double>(state.iterations());
  triad_bandwidth()[{d, threads}] = moved / seconds_since(start);  // the final run's figure is kept
  state.SetBytesProcessed(static_cast<std::int64_t>(moved));
}

void BM_ProxyStep(benchmark::State& state) {
  Setup& s =
      setup(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  const int threads = static_cast<int>(state.range(2));
  s.backend->set_threads(threads);
  s.backend->fit(s.lengthscale);  // BM_Fit may have pushed since
  // Every iteration steps from point 0 with the work state the last one left.
  const double bytes = (2.0 * static_cast<double>(s.t0) + 8.0) * kFloat * static_cast<double>(s.d);
  run_paired(state, s.d, threads, s.paired, bytes, [&s] {
    s.backend->proxy_step(s.batch, 1, optex::detail::ProxySource::gp, {});
    benchmark::ClobberMemory();
  });
}

// Distinct points every push (O(1)), so no two history points coincide.
float* fresh_point(Setup& s, std::size_t i) {
  float* p = s.new_points.data() + i * s.d;
  p[0] = static_cast<float>(static_cast<double>(++s.pushes) * 1e-3);
  return p;
}

void BM_Fit(benchmark::State& state) {
  Setup& s =
      setup(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  const int threads = static_cast<int>(state.range(2));
  s.backend->set_threads(threads);
  const double bytes = (2.0 * static_cast<double>(s.t0) + 6.0 * static_cast<double>(kNewPairs)) *
                       kFloat * static_cast<double>(s.d);
  run_paired(state, s.d, threads, s.paired, bytes, [&s] {
    for (std::size_t i = 0; i < kNewPairs; ++i) (void)fresh_point(s, i);
    s.backend->observe(s.new_points, s.new_gradients);
    double jitter = s.backend->fit(s.lengthscale);
    benchmark::DoNotOptimize(jitter);
    benchmark::ClobberMemory();
  });
}

void BM_FitOnePairAtATime(benchmark::State& state) {
  Setup& s =
      setup(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  const int threads = static_cast<int>(state.range(2));
  s.backend->set_threads(threads);
  const std::size_t n = s.d;
  const double bytes = static_cast<double>(kNewPairs) * (2.0 * static_cast<double>(s.t0) + 5.0) *
                       kFloat * static_cast<double>(n);
  run_paired(state, s.d, threads, s.paired, bytes, [&s, n] {
    for (std::size_t i = 0; i < kNewPairs; ++i) {
      s.backend->observe({fresh_point(s, i), n}, {s.new_gradients.data() + i * n, n});
    }
    double jitter = s.backend->fit(s.lengthscale);
    benchmark::DoNotOptimize(jitter);
    benchmark::ClobberMemory();
  });
}

// One plain step of `optimizer` over d coordinates, paired with a triad pass like the
// others (its own arrays: the Setup's history is not needed).
void BM_OptimizerStep(benchmark::State& state, const optex::Optimizer& optimizer) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const optex::OptimizerRanges ranges = optex::OptimizerRanges(optimizer).for_dimension(d);
  optex::SplitMix64 rng(0x57e9 + d);
  std::vector<float> x(d);
  std::vector<float> g(d);
  fill_uniform(x, rng);
  fill_uniform(g, rng);
  optex::OptimizerState s = optex::init_state(ranges, d);
  optex::Triad paired(d);
  const double bytes = (3.0 + 2.0 * static_cast<double>(ranges.state_slots().count())) * kFloat *
                       static_cast<double>(d);
  run_paired(state, d, threads, paired, bytes, [&] {
    optex::apply_step(ranges, x, s, g, pool(threads));
    float* xp = x.data();  // an lvalue: the non-const DoNotOptimize overload
    benchmark::DoNotOptimize(xp);
    benchmark::ClobberMemory();
  });
}

// Big cases get a fixed iteration count (>= 5, about 8 GB moved) instead of
// MinTime: one d = 1e7, T0 = 64 fit moves about 21 GB.
void configure(benchmark::internal::Benchmark* b, double bytes_per_iteration) {
  b->Unit(benchmark::kMillisecond)->UseRealTime();
  if (bytes_per_iteration >= 2e8) {
    b->Iterations(std::max<benchmark::IterationCount>(
        5, static_cast<benchmark::IterationCount>(std::ceil(8e9 / bytes_per_iteration))));
  } else {
    b->MinTime(0.5);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // 1 thread and every core (once when the machine has one).
  std::vector<std::int64_t> thread_counts = {1};
  if (optex::available_cores() > 1) thread_counts.push_back(optex::available_cores());
  // Registration order is run order: every triad first (the ratios need it),
  // then for each (d, T0) the proxy step and the fits, which share one history.
  for (const std::int64_t d : kDims) {
    for (const std::int64_t t : thread_counts) {
      auto* b = benchmark::RegisterBenchmark("BM_Triad", BM_Triad)
                    ->Args({d, t})
                    ->ArgNames({"d", "threads"});
      configure(b, 3.0 * kFloat * static_cast<double>(d));
    }
  }
  std::string names = optex::optimizer_names();
  for (std::size_t begin = 0; begin < names.size();) {
    const std::size_t end = std::min(names.find(", ", begin), names.size());
    const std::string name = names.substr(begin, end - begin);
    begin = end + 2;
    for (const std::int64_t d : {std::int64_t{100'000}, std::int64_t{1'000'000}}) {
      for (const std::int64_t t : thread_counts) {
        auto* b = benchmark::RegisterBenchmark(("BM_OptimizerStep/" + name).c_str(),
                                               BM_OptimizerStep, optex::optimizer_from_name(name))
                      ->Args({d, t})
                      ->ArgNames({"d", "threads"});
        configure(b, 7.0 * kFloat * static_cast<double>(d));
      }
    }
  }
  for (const std::int64_t d : kDims) {
    for (const std::int64_t t0 : kHistories) {
      const double dd = static_cast<double>(d);
      const double tt = static_cast<double>(t0);
      const double n = static_cast<double>(kNewPairs);
      for (const std::int64_t t : thread_counts) {
        auto* p = benchmark::RegisterBenchmark("BM_ProxyStep", BM_ProxyStep)
                      ->Args({d, t0, t})
                      ->ArgNames({"d", "T0", "threads"});
        configure(p, (2.0 * tt + 9.0) * kFloat * dd);
        auto* f = benchmark::RegisterBenchmark("BM_Fit", BM_Fit)
                      ->Args({d, t0, t})
                      ->ArgNames({"d", "T0", "threads"});
        configure(f, (2.0 * tt + 6.0 * n) * kFloat * dd);
        auto* u = benchmark::RegisterBenchmark("BM_FitOnePairAtATime", BM_FitOnePairAtATime)
                      ->Args({d, t0, t})
                      ->ArgNames({"d", "T0", "threads"});
        configure(u, n * (2.0 * tt + 5.0) * kFloat * dd);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
