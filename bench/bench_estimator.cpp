// CPU cost of the GP gradient estimator against a STREAM-like triad.
//
// DESIGN.md section 4: a proxy step and a Gram update are memory-bound passes
// over the history, so the figure of merit is bytes moved per second, compared
// with the triad measured in the same process at the same d.
//
//   BM_Triad      a[i] = b[i] + s * c[i] over float arrays of d.
//   BM_ProxyStep  GpGradientEstimator::predict on a full history of T0 pairs,
//                 then one optex::Adam step with the predicted gradient (what
//                 Engine::ask() does per proxy step, minus its row copy).
//   BM_Fit        N = 4 GradientHistory::push into a full history (incremental
//                 Gram update), then GpGradientEstimator::fit.
//   BM_OptimizerStep/<name>
//                 one plain optex::apply_step of every base optimizer (by its
//                 optimizer_from_name name, with its defaults): the
//                 elementwise pass that ends every proxy step and the commit.
//
// Byte counts (4-byte floats; every array counted once per pass that must touch
// it; writes counted once, no write-allocate traffic, as STREAM does):
//   triad  3 d                      read b, c; write a
//   proxy  (2 T0 + 9) d             predict: read X (T0 d) and G (T0 d), read the
//                                   query x (d), write mu (d); Adam: read x, m, v,
//                                   mu and write x, m, v (7 d)
//   step   (3 + 2 k) d              read x and g, write x; read and write the
//                                   optimizer's k state slots
//   fit    N (2 T0 + 5) d           per push: read the new point and gradient and
//                                   write them into the slot (4 d), read X (T0 d,
//                                   the new row is one of the rows) for the
//                                   distances, read the new row for ||x||^2 (d),
//                                   read G (T0 d) for the inner products; fit
//                                   itself is T0 x T0 and counted as 0 bytes.
//
// Counters: bytes_per_second (SetBytesProcessed, over the benchmark's real
// time); triad_ratio = step bandwidth / BM_Triad's bandwidth at the same d
// (BM_Triad runs first; at d <= 1e6 its 3 d floats fit in the 32 MiB L3, the
// history does not); paired_triad_ratio = step bandwidth / bandwidth of one
// untimed triad pass over d floats run before every measured step, each from
// its fastest iteration in thread CPU time, so on a shared machine both see the
// same load, time slices lost to other processes drop out, and the triad's
// arrays have been evicted by the step, as the step's have. Reported times are
// wall-clock (UseRealTime).
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

#include "optex/adam.hpp"
#include "optex/covariance.hpp"
#include "optex/gp_estimator.hpp"
#include "optex/gradient_history.hpp"
#include "optex/optimizer.hpp"
#include "optex/optimizer_ranges.hpp"
#include "optex/optimizer_state.hpp"
#include "optex/options.hpp"
#include "optex/random.hpp"

namespace {

constexpr std::int64_t kDims[] = {10'000, 100'000, 1'000'000, 10'000'000};
constexpr std::int64_t kHistories[] = {8, 32, 64};
constexpr std::size_t kNewPairs = 4;  // N of BM_Fit
constexpr double kFloat = sizeof(float);

// Triad bandwidth in bytes per second of the last (final) run at each d.
std::map<std::int64_t, double>& triad_bandwidth() {
  static std::map<std::int64_t, double> bw;
  return bw;
}

void fill_uniform(std::span<float> v, optex::SplitMix64& rng) {
  for (float& e : v) e = static_cast<float>(rng.uniform(-1.0, 1.0));
}

// The triad kernel, shared by BM_Triad and the paired passes. The stores must
// happen every call: the caller escapes `a` and clobbers memory afterwards.
void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
           std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
  benchmark::DoNotOptimize(a);
  benchmark::ClobberMemory();
}

struct TriadArrays {
  std::vector<float> a, b, c;
  float s = 0.5f;
  explicit TriadArrays(std::size_t n) : a(n, 0.0f), b(n), c(n) {
    optex::SplitMix64 rng(0x7a1ad + n);
    fill_uniform(b, rng);
    fill_uniform(c, rng);
    benchmark::DoNotOptimize(s);  // the scalar is opaque: no constant folding
  }
  void run() { triad(a.data(), b.data(), c.data(), s, a.size()); }
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One full history and everything a proxy step and a fit need. Only one exists
// at a time: at d = 1e7, T0 = 64 the history alone is 5.1 GB.
struct Setup {
  std::size_t d;
  std::size_t t0;
  optex::GradientHistory history;
  optex::GpGradientEstimator estimator;
  double lengthscale;
  optex::Adam adam{.lr = 1e-3};
  optex::OptimizerState state;
  std::vector<float> x;
  std::vector<float> mu;
  std::vector<float> new_points;     // kNewPairs x d
  std::vector<float> new_gradients;  // kNewPairs x d
  TriadArrays paired;                // triad passes interleaved with the measured steps
  std::uint64_t pushes = 0;

  Setup(std::size_t dim, std::size_t capacity)
      : d(dim),
        t0(capacity),
        history(capacity, dim),
        estimator(optex::Covariance::matern52, 1e-3, optex::InputScaling::none, capacity),
        // Independent uniform points in [-1, 1]^d lie about sqrt(2 d / 3) apart:
        // with lengthscale sqrt(d) the kernel values sit near 0.5, far from
        // underflow, and the Gram matrix is well conditioned.
        lengthscale(std::sqrt(static_cast<double>(dim))),
        state(optex::init_state(adam, dim)),
        x(dim),
        mu(dim),
        new_points(kNewPairs * dim),
        new_gradients(kNewPairs * dim),
        paired(dim) {
    optex::SplitMix64 rng(0x5eed'0000 + dim * 131 + capacity);
    std::vector<float> p(dim);
    std::vector<float> g(dim);
    for (std::size_t j = 0; j < capacity; ++j) {
      fill_uniform(p, rng);
      fill_uniform(g, rng);
      history.push(p, g);
    }
    fill_uniform(x, rng);
    fill_uniform(new_points, rng);
    fill_uniform(new_gradients, rng);
    estimator.fit(history, lengthscale);
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

// CPU time of this thread: unlike wall time it does not advance while other
// processes hold the core, which on a shared 2-core machine is most of the noise.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Runs `step` once per benchmark iteration, each preceded by one untimed
// (PauseTiming) triad pass over d floats, then sets the counters:
//   triad_ratio         step bandwidth / BM_Triad's bandwidth at the same d, both
//                       in mean wall time (needs BM_Triad at that d earlier in
//                       this process)
//   paired_triad_ratio  step bandwidth / triad bandwidth, each from its fastest
//                       iteration in thread CPU time: the triad passes run
//                       between the steps, under the same load and from the same
//                       cache state (the step has evicted the triad's arrays),
//                       and time slices lost to other processes drop out
// Step bandwidth for bytes_per_second and triad_ratio = bytes_per_iteration *
// iterations / (sum of the step wall times).
template <class Step>
void run_paired(benchmark::State& state, std::size_t d, TriadArrays& paired,
                double bytes_per_iteration, Step step) {
  double step_wall = 0.0;
  double step_cpu_min = std::numeric_limits<double>::infinity();
  double triad_cpu_min = std::numeric_limits<double>::infinity();
  for (auto _ : state) {
    state.PauseTiming();
    const double c0 = thread_seconds();
    paired.run();
    triad_cpu_min = std::min(triad_cpu_min, thread_seconds() - c0);
    state.ResumeTiming();
    const auto w1 = Clock::now();
    const double c1 = thread_seconds();
    step();
    step_cpu_min = std::min(step_cpu_min, thread_seconds() - c1);
    step_wall += seconds_since(w1);
  }
  const double moved = bytes_per_iteration * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(moved));
  if (const auto it = triad_bandwidth().find(static_cast<std::int64_t>(d));
      it != triad_bandwidth().end()) {
    state.counters["triad_ratio"] = moved / step_wall / it->second;
  }
  const double triad_bytes = 3.0 * kFloat * static_cast<double>(d);
  state.counters["paired_triad_ratio"] =
      (bytes_per_iteration / step_cpu_min) / (triad_bytes / triad_cpu_min);
}

void BM_Triad(benchmark::State& state) {
  const std::int64_t d = state.range(0);
  TriadArrays t(static_cast<std::size_t>(d));
  const double bytes = 3.0 * kFloat * static_cast<double>(d);
  const auto start = Clock::now();
  for (auto _ : state) t.run();
  const double moved = bytes * static_cast<double>(state.iterations());
  triad_bandwidth()[d] = moved / seconds_since(start);  // the final run's figure is kept
  state.SetBytesProcessed(static_cast<std::int64_t>(moved));
}

void BM_ProxyStep(benchmark::State& state) {
  Setup& s =
      setup(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  s.estimator.fit(s.history, s.lengthscale);  // BM_Fit may have pushed since
  const double bytes = (2.0 * static_cast<double>(s.t0) + 9.0) * kFloat * static_cast<double>(s.d);
  run_paired(state, s.d, s.paired, bytes, [&s] {
    s.estimator.predict(s.history, s.x, s.mu);
    optex::apply_step(s.adam, s.x, s.state, s.mu);
    float* x = s.x.data();  // an lvalue: the non-const DoNotOptimize overload
    benchmark::DoNotOptimize(x);
    benchmark::ClobberMemory();
  });
}

void BM_Fit(benchmark::State& state) {
  Setup& s =
      setup(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  const std::size_t n = s.d;
  const double bytes = static_cast<double>(kNewPairs) * (2.0 * static_cast<double>(s.t0) + 5.0) *
                       kFloat * static_cast<double>(n);
  run_paired(state, s.d, s.paired, bytes, [&s, n] {
    for (std::size_t i = 0; i < kNewPairs; ++i) {
      float* p = s.new_points.data() + i * n;
      // Distinct points every push (O(1)), so no two history points coincide.
      p[0] = static_cast<float>(static_cast<double>(++s.pushes) * 1e-3);
      s.history.push({p, n}, {s.new_gradients.data() + i * n, n});
    }
    s.estimator.fit(s.history, s.lengthscale);
    double jitter = s.estimator.jitter();
    benchmark::DoNotOptimize(jitter);
    benchmark::ClobberMemory();
  });
}

// One plain step of `optimizer` over d coordinates, paired with a triad pass like the
// others (its own arrays: the Setup's history is not needed).
void BM_OptimizerStep(benchmark::State& state, const optex::Optimizer& optimizer) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const optex::OptimizerRanges ranges = optex::OptimizerRanges(optimizer).for_dimension(d);
  optex::SplitMix64 rng(0x57e9 + d);
  std::vector<float> x(d);
  std::vector<float> g(d);
  fill_uniform(x, rng);
  fill_uniform(g, rng);
  optex::OptimizerState s = optex::init_state(ranges, d);
  TriadArrays paired(d);
  const double bytes = (3.0 + 2.0 * static_cast<double>(ranges.state_slots().count())) * kFloat *
                       static_cast<double>(d);
  run_paired(state, d, paired, bytes, [&] {
    optex::apply_step(ranges, x, s, g);
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
  // Registration order is run order: every triad first (the ratios need it),
  // then for each (d, T0) the proxy step and the fit, which share one history.
  for (const std::int64_t d : kDims) {
    auto* b = benchmark::RegisterBenchmark("BM_Triad", BM_Triad)->Arg(d)->ArgName("d");
    configure(b, 3.0 * kFloat * static_cast<double>(d));
  }
  std::string names = optex::optimizer_names();
  for (std::size_t begin = 0; begin < names.size();) {
    const std::size_t end = std::min(names.find(", ", begin), names.size());
    const std::string name = names.substr(begin, end - begin);
    begin = end + 2;
    for (const std::int64_t d : {std::int64_t{100'000}, std::int64_t{1'000'000}}) {
      auto* b = benchmark::RegisterBenchmark(("BM_OptimizerStep/" + name).c_str(), BM_OptimizerStep,
                                             optex::optimizer_from_name(name))
                    ->Arg(d)
                    ->ArgName("d");
      configure(b, 7.0 * kFloat * static_cast<double>(d));
    }
  }
  for (const std::int64_t d : kDims) {
    for (const std::int64_t t0 : kHistories) {
      const double dd = static_cast<double>(d);
      const double tt = static_cast<double>(t0);
      auto* p = benchmark::RegisterBenchmark("BM_ProxyStep", BM_ProxyStep)
                    ->Args({d, t0})
                    ->ArgNames({"d", "T0"});
      configure(p, (2.0 * tt + 9.0) * kFloat * dd);
      auto* f =
          benchmark::RegisterBenchmark("BM_Fit", BM_Fit)->Args({d, t0})->ArgNames({"d", "T0"});
      configure(f, static_cast<double>(kNewPairs) * (2.0 * tt + 5.0) * kFloat * dd);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
